"""A head with two remote workers against one local worker, on all-MiniLM-L6-v2.

Two setups run side by side on this machine, measured in turns (so the machine's noise falls
on both alike):

- local: ``bertserve start --num-worker 1`` (one worker, the machine's cores);
- remote: ``bertserve start --num-worker 0 --worker-port P`` and two ``bertserve worker``
  hosts over tcp on loopback, one worker each with half the cores (``--threads-per-worker``).

Both encode the corpus in bulk requests; the report gives sentences/s of each, how the remote
setup spread its mini-jobs over its workers, and how far its vectors are from the local
ones. Then, with four clients encoding continuously through the remote head, one host's
process group is killed (SIGKILL): every request must still come back, equal to the local
vectors. On a 2-core machine the remote setup cannot be faster (its workers share the same
cores); what it shows is that the work is spread and nothing is lost.

    python benchmarks/remote_workers.py --json benchmarks/report/remote.json --markdown benchmarks/report/remote.md
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer, free_port, start_server, start_worker_host
from lib.inputs import model_dir_or_exit, model_parser, read_corpus
from lib.report import environment, tagged_log, write_report
from lib.stats import cosine_rows

log = tagged_log("remote")


def bulk_rate(server: RunningServer, texts: list[str], size: int) -> tuple[float, np.ndarray]:
    with BertClient(**server.client_kwargs, timeout=600_000) as client:
        began = time.perf_counter()
        vectors = np.concatenate([client.encode(texts[i : i + size]) for i in range(0, len(texts), size)])
        return len(texts) / (time.perf_counter() - began), vectors


def kill_under_load(
    head: RunningServer, doomed: RunningServer, texts: list[str], want: np.ndarray, args: argparse.Namespace
) -> dict[str, Any]:
    """Four clients encode ``texts`` in requests of 100 until the end; ``doomed`` is killed
    after ``args.kill_after`` seconds. Every reply is checked against ``want``."""
    outcome = {"requests": 0, "wrong": 0, "failed": 0}
    lock = threading.Lock()
    until = time.monotonic() + args.kill_after + args.after_kill

    def client_loop(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with BertClient(**head.client_kwargs, timeout=120_000) as client:
            while time.monotonic() < until:
                start = int(rng.integers(0, len(texts) - 100))
                problem = None
                try:
                    got = client.encode(texts[start : start + 100])
                    problem = None if np.allclose(got, want[start : start + 100], atol=1e-4) else "wrong"
                except Exception as exc:
                    log(f"a request failed: {exc}")
                    problem = "failed"
                with lock:
                    outcome["requests"] += 1
                    if problem is not None:
                        outcome[problem] += 1

    threads = [threading.Thread(target=client_loop, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(args.kill_after)
    os.killpg(doomed.process.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    log("killed one host's process group")
    for thread in threads:
        thread.join()
    return {**outcome, "seconds_after_kill": round(time.monotonic() - killed_at, 1)}


def markdown(report: dict[str, Any]) -> str:
    rates = report["sentences_per_s"]
    spread = ", ".join(f"{w['jobs_done']} jobs / {w['sentences']} sentences" for w in report["remote_workers"])
    kill = report["kill"]
    return (
        "\n".join(
            [
                "# A head with two remote workers against one local worker (all-MiniLM-L6-v2, CPU)",
                "",
                f"Corpus: {report['sentences']} sentences, bulk requests of {report['request_size']}, "
                f"{report['rounds']} rounds each, in turns.",
                "",
                "| setup | sentences/s (median) |",
                "| --- | ---: |",
                f"| one local worker | {rates['local']:,.0f} |",
                f"| head + two remote workers (tcp) | {rates['remote']:,.0f} |",
                "",
                f"Ratio remote / local: {report['ratio']:.2f}. Work spread over the remote workers: {spread}.",
                f"Vectors: max |difference| {report['max_abs_diff']:.2e}, min cosine {report['min_cosine']:.6f}.",
                "",
                f"One host killed (SIGKILL to its process group) under four clients: {kill['requests']} requests, "
                f"{kill['failed']} failed, {kill['wrong']} wrong.",
            ]
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--request-size", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kill-after", type=float, default=6.0)
    parser.add_argument("--after-kill", type=float, default=15.0)
    args = parser.parse_args(argv)
    model_dir = model_dir_or_exit(parser, args.model_dir)
    texts = read_corpus(args.corpus, args.sentences)
    model = ("--model-dir", str(model_dir), "--cpu", "--max-seq-len", "128")
    worker_port = free_port()
    local = start_server(*model, "--num-worker", "1", echo=False)
    head = start_server(
        *model, "--num-worker", "0", "--worker-port", str(worker_port), "--heartbeat-timeout-ms", "3000", echo=False
    )
    host_flags = ("--model-dir", str(model_dir), "--cpu", "--threads-per-worker", "1")
    hosts = [start_worker_host(worker_port, *host_flags, echo=False) for _ in range(2)]
    try:
        with BertClient(**head.client_kwargs, timeout=30_000) as probe:
            deadline = time.monotonic() + 180
            while len(probe.server_status["workers"]) < 2 and time.monotonic() < deadline:
                time.sleep(0.5)
        bulk_rate(local, texts[:200], 100)  # warm-up
        bulk_rate(head, texts[:200], 100)
        rates: dict[str, list[float]] = {"local": [], "remote": []}
        vectors: dict[str, np.ndarray] = {}
        for round_ in range(args.rounds):
            for name, server in (("local", local), ("remote", head)):
                rate, vectors[name] = bulk_rate(server, texts, args.request_size)
                rates[name].append(rate)
                log(f"round {round_ + 1}: {name} {rate:.0f} sentences/s")
        with BertClient(**head.client_kwargs, timeout=30_000) as probe:
            workers = probe.server_status["workers"]
        kill = kill_under_load(head, hosts[0], texts, vectors["local"], args)
    finally:
        for host in hosts:
            if host.process.poll() is None:
                host.stop()
        head.stop()
        local.stop()
    medians = {name: statistics.median(values) for name, values in rates.items()}
    report = {
        "environment": environment(),
        "sentences": len(texts),
        "request_size": args.request_size,
        "rounds": args.rounds,
        "sentences_per_s": medians,
        "all_rates": rates,
        "ratio": medians["remote"] / medians["local"],
        "remote_workers": [{k: w[k] for k in ("host", "device", "jobs_done", "sentences")} for w in workers],
        "max_abs_diff": float(np.abs(vectors["remote"] - vectors["local"]).max()),
        "min_cosine": float(cosine_rows(vectors["remote"], vectors["local"]).min()),
        "kill": kill,
    }
    write_report(report, markdown(report), args.json, args.markdown)
    return 0 if kill["failed"] == 0 and kill["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
