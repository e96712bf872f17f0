"""How far one head goes: what one ventilator and sink can route, with workers that cost nothing.

A head (``bertserve start --num-worker 0 --worker-port P``) and one ``bertserve worker`` host
serve ``lib.instant_model:InstantModel`` (the typed fake model; it returns 384-wide zero vectors
at once, so the bytes are all-MiniLM-L6-v2's and the compute is none). Client processes send
requests back to back, for ``--seconds`` a step, their number doubling until sentences/s stops
growing. Two shapes: bulk (requests of 1,000 sentences, cut into mini-jobs of 256) and small
(one sentence a request, 32 in flight per client, merged into mini-jobs by the ventilator).

For each step: requests/s, sentences/s and mini-jobs/s the head routed (mini-jobs from its
workers' counts), and the CPU (in cores) of the head's ventilator process, of its sink, of
the worker host with its workers, and of the clients. Every process shares this machine's
cores, so the figures are a floor for a head on a machine of its own; the ventilator's
CPU says how near its one thread is to the limit.

    python benchmarks/routing.py --json benchmarks/report/routing.json --markdown benchmarks/report/routing.md
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer, free_port, start_server, start_worker_host
from lib.inputs import BENCHMARKS_DIR, DEFAULT_CORPUS, read_corpus
from lib.report import environment, tagged_log, write_report

MODEL = "lib.instant_model:InstantModel"
WINDOW = 32  # one-sentence requests a client has in flight


log = tagged_log("routing")


def _client(port: int, texts: list[str], size: int, until: float, counts: Any, index: int) -> None:
    """One client process: requests of ``size`` sentences back to back until ``until``; one-
    sentence requests go ``WINDOW`` at a time (non-blocking, then fetched), so the client's
    round trips do not hide what the head can route."""
    sent = done = 0
    window = WINDOW if size == 1 else 1
    with BertClient(port=port, port_out=port + 1, timeout=60_000) as client:
        while time.time() < until:
            for _ in range(window):
                client.encode([texts[(sent + i) % len(texts)] for i in range(size)], blocking=False)
                sent += size
                done += 1
            client.fetch_all()
    counts[index] = (done, sent)


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def step(
    head: RunningServer, host: RunningServer, texts: list[str], size: int, clients: int, seconds: float
) -> dict[str, Any]:
    """``clients`` processes for ``seconds``: what the head routed and what it cost."""
    spawn = multiprocessing.get_context("spawn")
    counts = spawn.Manager().dict()
    ventilator = [psutil.Process(head.process.pid)]
    sink = head.family()[1:]
    hosts = host.family()
    start_at = time.time() + 3.0  # the clients start their clocks together, once imported
    procs = [
        spawn.Process(target=_client, args=(head.port, texts, size, start_at + seconds, counts, i))
        for i in range(clients)
    ]
    for proc in procs:
        proc.start()
    time.sleep(max(0.0, start_at - time.time()))
    with BertClient(port=head.port, port_out=head.port_out, timeout=10_000) as probe:
        jobs_before = sum(w["jobs_done"] for w in probe.server_status["workers"])
    before = (cpu_seconds(ventilator), cpu_seconds(sink), cpu_seconds(hosts))
    began = time.perf_counter()
    for proc in procs:
        proc.join(seconds + 120)
    wall = time.perf_counter() - began
    after = (cpu_seconds(ventilator), cpu_seconds(sink), cpu_seconds(hosts))
    with BertClient(port=head.port, port_out=head.port_out, timeout=10_000) as probe:
        jobs = sum(w["jobs_done"] for w in probe.server_status["workers"]) - jobs_before
    requests = sum(count[0] for count in counts.values())
    sentences = sum(count[1] for count in counts.values())
    return {
        "clients": clients,
        "request_size": size,
        "seconds": round(wall, 2),
        "requests_per_s": round(requests / wall, 1),
        "sentences_per_s": round(sentences / wall, 1),
        "mini_jobs_per_s": round(jobs / wall, 1),
        "cpu_cores": {
            "ventilator": round((after[0] - before[0]) / wall, 2),
            "sink": round((after[1] - before[1]) / wall, 2),
            "worker_host": round((after[2] - before[2]) / wall, 2),
        },
    }


def sweep(head: RunningServer, host: RunningServer, texts: list[str], size: int, args: argparse.Namespace) -> list:
    steps: list[dict[str, Any]] = []
    clients = 1
    while clients <= args.max_clients:
        result = step(head, host, texts, size, clients, args.seconds)
        rates = f"{result['sentences_per_s']:.0f} sentences/s, {result['mini_jobs_per_s']:.0f} mini-jobs/s"
        log(f"{size}-sentence requests, {clients} client(s): {rates}, ventilator {result['cpu_cores']['ventilator']}")
        steps.append(result)
        if len(steps) >= 2 and result["sentences_per_s"] < 1.05 * steps[-2]["sentences_per_s"]:
            break  # saturated: twice the clients, under 5% more
        clients *= 2
    return steps


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# One head's routing ceiling",
        "",
        f"Head: ventilator and sink (`--num-worker 0 --worker-port`); one worker host with {report['workers']} "
        f"workers of `{MODEL}` (no compute, 384-wide float32 vectors); all on one {os.cpu_count()}-core machine.",
        "",
        "| requests | clients | requests/s | sentences/s | mini-jobs/s | ventilator CPU | sink CPU | worker host CPU |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for shape, steps in report["shapes"].items():
        for s in steps:
            cpu = s["cpu_cores"]
            rates = f"{s['requests_per_s']:,.0f} | {s['sentences_per_s']:,.0f} | {s['mini_jobs_per_s']:,.0f}"
            cores = f"{cpu['ventilator']:.2f} | {cpu['sink']:.2f} | {cpu['worker_host']:.2f}"
            lines.append(f"| {shape} | {s['clients']} | {rates} | {cores} |")
    best = report["ceiling"]
    cpu = best["bulk_cpu_cores_at_ceiling"]
    lines += [
        "",
        f"Ceiling: {best['bulk_sentences_per_s']:,.0f} sentences/s in bulk requests "
        f"({best['bulk_mini_jobs_per_s']:,.0f} mini-jobs/s; ventilator {cpu['ventilator']:.2f} cores, "
        f"sink {cpu['sink']:.2f}), "
        f"{best['small_requests_per_s']:,.0f} one-sentence requests/s "
        f"({best['small_mini_jobs_per_s']:,.0f} mini-jobs/s).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each step")
    parser.add_argument("--max-clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="worker processes on the host")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    texts = read_corpus(args.corpus)
    env = {"PYTHONPATH": os.pathsep.join([str(BENCHMARKS_DIR), os.environ.get("PYTHONPATH", "")])}
    worker_port = free_port()
    head = start_server(
        "--num-worker",
        "0",
        "--worker-port",
        str(worker_port),
        "--model-class",
        MODEL,
        "--max-batch-size",
        "256",
        env=env,
        echo=False,
        pass_port_out=False,
    )
    try:
        host = start_worker_host(
            worker_port, "--num-worker", str(args.workers), "--model-class", MODEL, env=env, echo=False
        )
        try:
            with BertClient(port=head.port, port_out=head.port_out, timeout=30_000) as probe:
                deadline = time.monotonic() + 60
                while len(probe.server_status["workers"]) < args.workers and time.monotonic() < deadline:
                    time.sleep(0.2)
            shapes = {"bulk (1,000)": sweep(head, host, texts, 1000, args)}
            shapes["small (1)"] = sweep(head, host, texts, 1, args)
        finally:
            host.stop()
    finally:
        head.stop()
    bulk, small = shapes["bulk (1,000)"], shapes["small (1)"]
    at_ceiling = max(bulk, key=lambda s: s["sentences_per_s"])
    report = {
        "environment": environment(),
        "workers": args.workers,
        "shapes": shapes,
        "ceiling": {
            "bulk_sentences_per_s": max(s["sentences_per_s"] for s in bulk),
            "small_requests_per_s": max(s["requests_per_s"] for s in small),
            "small_mini_jobs_per_s": max(s["mini_jobs_per_s"] for s in small),
            "bulk_mini_jobs_per_s": at_ceiling["mini_jobs_per_s"],
            "bulk_cpu_cores_at_ceiling": at_ceiling["cpu_cores"],
        },
    }
    write_report(report, markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
