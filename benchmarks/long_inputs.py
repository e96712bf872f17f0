"""Long inputs: how close truncation and chunking come to the whole text, and what chunking costs.

Inputs of 300 to 2,000 all-MiniLM-L6-v2 tokens are made by joining corpus sentences. Each is
encoded in process by the ``Encoder`` three ways: truncated to ``max_seq_len`` (128 and 256),
chunked in windows of that many tokens (``long_inputs="chunk"``, with and without overlap),
and, where it fits (up to 510 tokens), whole at ``max_seq_len`` 512, the reference. The
report gives the median cosine of each way to the reference per length, and the sentences/s
of truncating and of chunking the same inputs. These figures inform; there is no target.

    python benchmarks/long_inputs.py --json benchmarks/report/long_inputs.json \
        --markdown benchmarks/report/long_inputs.md
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import numpy as np
from lib.inputs import model_dir_or_exit, model_parser, read_corpus
from lib.report import environment, tagged_log, write_report
from lib.stats import cosine_rows

LENGTHS = (300, 400, 480, 1000, 2000)
FULL = 512


log = tagged_log("long")


def make_inputs(corpus: list[str], counter: Any, target: int, count: int, seed: int) -> list[str]:
    """``count`` texts of ``target`` tokens or a few more, joined from random corpus sentences."""
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(count):
        parts: list[str] = []
        while not parts or int(counter([" ".join(parts)])[0]) < target:
            parts.append(corpus[int(rng.integers(len(corpus)))])
        texts.append(" ".join(parts))
    return texts


def rate(encode: Any, texts: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        encode(texts)
        times.append(time.perf_counter() - began)
    return len(texts) / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    parser.add_argument("--per-length", type=int, default=16, help="inputs of each length")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each way")
    args = parser.parse_args(argv)
    model_dir = model_dir_or_exit(parser, args.model_dir)
    from bertserve.server.model.encoder import Encoder

    corpus = read_corpus(args.corpus)
    full = Encoder(model_dir, max_seq_len=FULL)
    ways = {
        f"{how} {size}{' overlap ' + str(stride) if stride else ''}": (
            Encoder(model_dir, max_seq_len=size, chunk_stride=stride),
            how,
        )
        for size in (128, 256)
        for how, stride in (("truncate", 0), ("chunk", 0), ("chunk", size // 4))
        if how == "chunk" or stride == 0
    }
    whole_counter = full._tokenizer  # count_tokens(chunk=True): every token, in windows of 512
    rows: list[dict[str, Any]] = []
    for length in LENGTHS:
        texts = make_inputs(
            corpus, lambda t: whole_counter.count_tokens(t, chunk=True), length, args.per_length, seed=length
        )
        tokens = whole_counter.count_tokens(texts, chunk=True)
        fits = tokens <= FULL  # the reference needs the whole text in one window
        reference = full.encode([t for t, ok in zip(texts, fits, strict=True) if ok]) if fits.any() else None
        row: dict[str, Any] = {"tokens": length, "median_tokens": int(np.median(tokens)), "reference": int(fits.sum())}
        for name, (encoder, how) in ways.items():
            vectors = encoder.encode(texts, long_inputs=how)
            if reference is not None:
                row[f"cosine {name}"] = round(float(np.median(cosine_rows(vectors[fits], reference))), 4)
            row[f"rate {name}"] = round(
                rate(lambda t, e=encoder, h=how: e.encode(t, long_inputs=h), texts, args.repeats), 1
            )
        log(f"{length} tokens: {row}")
        rows.append(row)
    names = list(ways)
    report = {"environment": environment(), "per_length": args.per_length, "ways": names, "rows": rows}
    write_report(report, markdown(report), args.json, args.markdown)
    return 0


def markdown(report: dict[str, Any]) -> str:
    names = report["ways"]
    lines = [
        "# Long inputs: truncation and chunking against the whole text (all-MiniLM-L6-v2, CPU)",
        "",
        f"{report['per_length']} inputs per length; the reference is the whole text at max_seq_len {FULL}, "
        "for the inputs that fit in it. Median cosine to the reference:",
        "",
        "| tokens | " + " | ".join(names) + " |",
        "| ---: |" + " ---: |" * len(names),
    ]
    for row in report["rows"]:
        if row["reference"]:
            lines.append(f"| {row['median_tokens']} | " + " | ".join(f"{row['cosine ' + n]:.4f}" for n in names) + " |")
    lines += [
        "",
        "Inputs/s (median of the timed runs):",
        "",
        "| tokens | " + " | ".join(names) + " |",
        "| ---: |" + " ---: |" * len(names),
    ]
    for row in report["rows"]:
        lines.append(f"| {row['median_tokens']} | " + " | ".join(f"{row['rate ' + n]:.1f}" for n in names) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
