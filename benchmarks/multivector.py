"""BGE-M3's three outputs (dense, sparse, multi-vector) against its dense output alone, in bulk.

One model run of BGE-M3 answers all three; the heads that make the sparse weights and the
multi-vectors are small products on its last layer. This measures what they add, on the same
inputs, the two sides taking turns in each round so that the machine's noise falls on both
alike, for each ``--dtypes`` (``auto``, the server's default, and ``fp32``):

- *in process*: ``LateModel.run_tasks(batch, {"embed": rows})`` against
  ``run_tasks(batch, {"embed": rows, "sparse": rows, "multivector": rows})`` on one tokenized
  batch of every input (the heads added to the same run);
- *through the server* (``bertserve start --model-dir DIR --num-worker 1 --dtype D``): an
  ``AsyncBertClient``'s ``encode`` of the inputs alone, against ``encode_outputs`` of the same
  inputs (one request for the three outputs).

``--rounds`` (5) rounds of each; the median seconds of each side and the ratio all three /
dense alone. The inputs: ``--sentences`` (128) corpus sentences of 18 to 28 tokens and
``--passages`` (16) passages of consecutive corpus sentences of 100 tokens or more, as the
model's tokenizer counts them.

The model, unless ``--model-dir`` names one: random weights of BGE-M3's exact shape
(``lib.bge_m3_shape``; made once with PyTorch and transformers into a cache folder). ``--quick``
(the smoke test's): the tiny BGE-M3 of tests/data/multivector/bge_m3 (no PyTorch needed),
fp32, a few inputs, 2 rounds.

The target: all three outputs / dense alone <= 1.15, in process and through the server.

    python benchmarks/multivector.py --json benchmarks/report/multivector.json \
        --markdown benchmarks/report/multivector.md
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from bertserve.client import AsyncBertClient
from bertserve.server.testing.launcher import start_server
from lib.bge_m3_shape import bge_m3_shaped, cache_dir, describe
from lib.inputs import model_parser, read_corpus
from lib.report import describe_cpu, environment, format_load, tagged_log, write_report
from lib.stats import median, ratio

log = tagged_log("multivector")
ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "multivector" / "bge_m3"
TARGET = 1.15
DENSE, ALL = "dense alone", "all three"
SENTENCE_TOKENS, PASSAGE_TOKENS = (18, 28), 100


def pick_inputs(corpus: Sequence[str], count_tokens: Callable[[list[str]], list[int]], args: Any) -> list[str]:
    """``args.sentences`` corpus sentences of 18 to 28 tokens, then ``args.passages`` passages:
    consecutive corpus sentences joined until they hold 100 tokens or more."""
    counts = count_tokens(list(corpus))
    low, high = SENTENCE_TOKENS
    sentences = [text for text, n in zip(corpus, counts, strict=True) if low <= n <= high][: args.sentences]
    passages: list[str] = []
    words: list[str] = []
    tokens = 0
    for text, n in zip(corpus[::-1], counts[::-1], strict=True):  # from the end: not the sentences' texts
        if len(passages) == args.passages:
            break
        words.append(text)
        tokens += n
        if tokens >= PASSAGE_TOKENS:
            passages.append(" ".join(words))
            words, tokens = [], 0
    return sentences + passages


def in_process(model_dir: Path, dtype: str, graph_dir: Path | None, texts: list[str], rounds: int) -> dict[str, Any]:
    """``run_tasks`` of dense alone and of all three outputs, in turns, on one batch of ``texts``."""
    from bertserve.server.config.model import ModelConfig
    from bertserve.server.model.late import LateModel

    began = time.perf_counter()
    where = {"graph_dir": str(graph_dir)} if graph_dir else {}
    model = LateModel(ModelConfig.of(model_dir=str(model_dir), dtype=dtype, **where))
    opened = time.perf_counter() - began
    batch = model.tokenize(texts)
    rows = np.arange(len(texts))
    tasks = {DENSE: {"embed": rows}, ALL: {"embed": rows, "sparse": rows, "multivector": rows}}
    model.run_tasks(batch, tasks[ALL])  # the first run's set-up, on neither side's clock
    seconds: dict[str, list[float]] = {DENSE: [], ALL: []}
    for r in range(rounds):
        for name in (DENSE, ALL) if r % 2 == 0 else (ALL, DENSE):
            started = time.perf_counter()
            answers = model.run_tasks(batch, tasks[name])
            seconds[name].append(time.perf_counter() - started)
            assert len(answers["embed"]) == len(texts)
        log(f"{dtype} in process, round {r + 1}: " + ", ".join(f"{n} {s[-1]:.2f} s" for n, s in seconds.items()))
    info = {"dtype": model.config.dtype, "opened_s": opened, "tokens": int(batch.lengths.sum())}
    del model
    gc.collect()
    return info | summary(seconds, len(texts))


def served(model_dir: Path, dtype: str, graph_dir: Path | None, texts: list[str], rounds: int) -> dict[str, Any]:
    """An ``AsyncBertClient``'s dense ``encode`` alone, and ``encode_outputs`` of all three, in turns."""
    flags = ("--num-worker", "1", "--dtype", dtype, "--max-reply-bytes", str(2**31))
    flags += ("--graph-dir", str(graph_dir)) if graph_dir else ()
    server = start_server("--model-dir", str(model_dir), *flags, echo=False, timeout=1800)
    try:
        return asyncio.run(_served_rounds(server.client_kwargs, dtype, texts, rounds))
    finally:
        server.stop()


async def _served_rounds(ports: dict[str, int], dtype: str, texts: list[str], rounds: int) -> dict[str, Any]:
    async with AsyncBertClient(**ports, timeout=3_600_000) as client:

        async def dense() -> None:
            assert len(await client.encode(texts)) == len(texts)

        async def three() -> None:  # one request for the three outputs: one model run of each input
            assert len(await client.encode_outputs(texts)) == len(texts)

        await three()  # the first requests' set-up, on neither side's clock
        calls = {DENSE: dense, ALL: three}
        seconds: dict[str, list[float]] = {DENSE: [], ALL: []}
        for r in range(rounds):
            for name in (DENSE, ALL) if r % 2 == 0 else (ALL, DENSE):
                started = time.perf_counter()
                await calls[name]()
                seconds[name].append(time.perf_counter() - started)
            log(f"{dtype} served, round {r + 1}: " + ", ".join(f"{n} {s[-1]:.2f} s" for n, s in seconds.items()))
        return summary(seconds, len(texts))


def summary(seconds: dict[str, list[float]], inputs: int) -> dict[str, Any]:
    sides = {name: {"median_s": median(values), "seconds": values} for name, values in seconds.items()}
    for side in sides.values():
        side["inputs_per_s"] = inputs / side["median_s"]
    # the ratio of each round's pair as well: the spread says how far the median ratio can be trusted
    pairs = [a / d for a, d in zip(seconds[ALL], seconds[DENSE], strict=True)]
    return {"sides": sides, "ratio": ratio(sides[ALL]["median_s"], sides[DENSE]["median_s"]), "round_ratios": pairs}


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    parser.add_argument("--sentences", type=int, default=128, help="corpus sentences of 18 to 28 tokens")
    parser.add_argument("--passages", type=int, default=16, help="passages of 100 tokens or more")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtypes", default="auto,fp32", help="comma-separated --dtype values")
    parser.add_argument("--where", default="in-process,server", help="in-process, server, or both")
    parser.add_argument("--graph-dir", type=Path, help="optimized graphs' cache (default: beside the model)")
    parser.add_argument("--quick", action="store_true", help="a smoke test's: the tiny BGE-M3, a few inputs")
    args = parser.parse_args(argv)
    if args.quick:
        args.sentences, args.passages, args.rounds = min(args.sentences, 12), min(args.passages, 2), 2
        args.dtypes, args.model_dir = "fp32", args.model_dir or TINY
    started = time.perf_counter()
    model_dir = args.model_dir or bge_m3_shaped()
    made = describe() if args.model_dir is None else str(model_dir)
    graph_dir = args.graph_dir or (cache_dir().parent / "graphs" if args.model_dir is None else None)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    texts = pick_inputs(read_corpus(args.corpus), lambda t: [len(e.ids) for e in tokenizer.encode_batch(t)], args)
    counts = [len(e.ids) for e in tokenizer.encode_batch(texts)]
    log(f"model: {made}; {len(texts)} inputs, {sum(counts)} tokens")
    where = [w.strip() for w in args.where.split(",") if w.strip()]
    parts = [
        (w, d.strip()) for d in args.dtypes.split(",") if d.strip() for w in ("in-process", "server") if w in where
    ]
    loads: list[float] = [psutil.getloadavg()[0]]
    results: dict[str, dict[str, Any]] = {}
    sentences = counts[: len(texts) - args.passages]
    inputs = (
        f"model {made}; corpus {args.corpus.name}: {len(sentences)} sentences (tokens mean "
        f"{statistics.mean(sentences or [0]):.1f}) and {args.passages} passages (tokens mean "
        f"{statistics.mean(counts[len(sentences) :] or [0]):.1f}), {sum(counts)} tokens, in one batch (in process) or "
        f"one request per output (server: one worker, `--num-worker 1 --dtype D`); {args.rounds} rounds per side, "
        "in turns"
    )
    for done, (part, dtype) in enumerate(parts, 1):
        run = in_process if part == "in-process" else served
        results[f"{part.replace('-', ' ')}, {dtype}"] = run(Path(model_dir), dtype, graph_dir, texts, args.rounds)
        loads.append(psutil.getloadavg()[0])
        report: dict[str, Any] = {
            "command": "python benchmarks/multivector.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "environment": environment(),
            "setup": (
                f"Machine: {psutil.cpu_count()} cores, load average (1 min) {format_load(loads)} at the start and "
                f"after each part; {inputs}. Total {time.perf_counter() - started:.0f} s."
            ),
            "inputs": len(texts),
            "tokens": sum(counts),
            "results": results,
            "target": TARGET,
            "partial": [f"{part}, {dtype}" for part, dtype in parts[done:]],  # parts not run yet
        }
        judged = [row["ratio"] for row in results.values()]  # in process and served: one run of each input
        report["met"] = bool(judged) and all(value <= TARGET for value in judged)
        write_report(report, markdown(report), args.json, args.markdown)  # after each part: a stopped run keeps it
    return 0


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# BGE-M3: three outputs from one run against the dense output alone",
        "",
        report["setup"],
        "",
        f"| where, dtype | {DENSE}: s (median) | {ALL}: s (median) | all three / dense | each round's ratio |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for name, row in report["results"].items():
        sides, rounds = row["sides"], ", ".join(f"{value:.3f}" for value in row["round_ratios"])
        shown = f"{name} (runs {row['dtype']})" if "dtype" in row else name
        lines.append(
            f"| {shown} | {sides[DENSE]['median_s']:.3f} | {sides[ALL]['median_s']:.3f} | "
            f"**{row['ratio']:.3f}** | {rounds} |"
        )
    lines += [
        "",
        f"Target: all three / dense alone <= {report['target']}: {'met' if report['met'] else 'NOT met'}.",
        *([f"Partial: not run yet: {'; '.join(report['partial'])}."] if report["partial"] else []),
        "",
        f"CPU: {describe_cpu(report['environment'])}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
