"""Soak test: an open-loop load of mixed request sizes at a multiple of the server's capacity,
for minutes; every reply checked, every refusal and expiry timed.

Starts a real server on free loopback ports (the shared launcher, ``bertserve.server.testing.launcher``) with
``--request-timeout-ms`` set to ``--timeout-ms``, computes the expected vector of every corpus
sentence once with the in-process ``Encoder`` (same model options; or, with
``--model-class``, with that class in process, served by the server too), then

1. times each bulk size (``BULK_SIZES``) alone on the idle server (median of ``--repeats``),
   and measures the capacity: sentences/s of bulk requests alone for ``--capacity-seconds``;
2. runs ``--clients`` threads for ``--minutes``, each with its own ``AsyncBertClient``,
   sending at Poisson arrivals so that the offered sentences/s are ``--load`` times the
   capacity, each request without waiting for the ones before it. Each client waits
   ``--grace-ms`` beyond the server's deadline, so an expired request is told apart from
   silence. Every reply is checked row by row (the clients: ``soaking/clients.py``); the
   server's memory (RSS of the server and its children) is sampled throughout;
3. reports the outcomes by size class, latencies, bulk latency over its unloaded time, the
   time a ``busy`` refusal takes, expiries against the server's own count, and each target.

    python benchmarks/soak.py --clients 64 --minutes 30 --load 1.5 --mix small,medium,bulk \\
        --json benchmarks/report/soak.json --markdown benchmarks/report/soak.md
    python benchmarks/soak.py --clients 4 --minutes 0.5 -- --max-batch-size 64   # flags after -- go to the server

Exits 1 if any request was lost, crossed, wrong or unanswered (or the server did not stop
cleanly), 2 if it could not run. The latency targets are reported, not part of the exit
status. Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import random
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bertserve.client import BertClient, BertClientError
from bertserve.server.testing.launcher import RunningServer, ServerStartError, start_server
from lib.inputs import DEFAULT_CORPUS, NO_MODEL_HINT, read_corpus, resolve_model_dir
from lib.report import Progress, environment, write_report
from lib.rss import RssSampler
from lib.stats import percentile_ms
from soaking import summary
from soaking.clients import BULK_SIZES, FAILED, OUTCOMES, SIZES, Expected, OpenLoopClient, Plan, RequestLog

DRAIN_MARGIN_S = 10.0  # beyond a client's wait, before a request still under way counts as lost
START_DELAY_S = 5.0  # for the client threads to connect before the load begins
CAPACITY_REQUEST = 512  # sentences per request of the capacity run, ASYNC_WINDOW of them in flight
SETUP_TIMEOUT_MS = 600_000


# ----------------------------------------------------------------------------------------
# the phases
# ----------------------------------------------------------------------------------------


def expected_vectors(model_dir: Path, corpus: list[str], args: argparse.Namespace) -> Expected:
    max_seq_len = None if args.max_seq_len.upper() == "NONE" else int(args.max_seq_len)
    if args.model_class is not None:  # a model the server imports by name, as its workers build it
        from bertserve.server.config.model import ModelConfig
        from bertserve.server.model.interface import load_model_class

        model = load_model_class(args.model_class)(ModelConfig.of(model_dir=str(model_dir), max_seq_len=max_seq_len))
        return Expected(np.asarray(model.run(model.tokenize(corpus))))
    from bertserve.server import Encoder

    options: dict[str, Any] = {"max_seq_len": max_seq_len}
    options["dtype"] = args.dtype
    if args.graph_dir is not None:
        options["graph_dir"] = str(args.graph_dir)
    encoder = Encoder(model_dir, **options)
    expected = Expected(np.asarray(encoder.encode(corpus)))
    del encoder
    gc.collect()
    return expected


def unloaded_times(
    server: RunningServer, plan: Plan, expected: Expected, repeats: int, progress: Progress
) -> dict[str, Any]:
    """The median seconds of each bulk size (and of 8 sentences) sent alone to the idle server,
    after one warm-up request each; every reply checked."""
    rng = random.Random(7)
    sizes = [8, *plan.bulk_sizes]
    times: dict[int, list[float]] = {size: [] for size in sizes}
    bad = 0
    with BertClient("127.0.0.1", **server.client_kwargs, timeout=SETUP_TIMEOUT_MS, check_length=False) as client:
        for size in sizes:
            for run in range(repeats + 1):
                indices = plan.indices(rng, size)
                started = time.perf_counter()
                got = client.encode(plan.texts(indices))
                seconds = time.perf_counter() - started
                bad += expected.check(indices, got) != "ok"
                if run:  # the first is the warm-up
                    times[size].append(seconds)
            progress(f"unloaded {size} sentences: median {statistics.median(times[size]) * 1000:.0f} ms")
    return {
        "repeats": repeats,
        "wrong_replies": bad,
        "median_seconds": {str(size): round(statistics.median(t), 4) for size, t in times.items()},
        "seconds": {str(size): [round(s, 4) for s in t] for size, t in times.items()},
    }


def capacity(server: RunningServer, plan: Plan, seconds: float) -> dict[str, Any]:
    """Sentences/s of bulk requests alone: one client keeps a few requests of
    ``CAPACITY_REQUEST`` sentences in flight for ``seconds``, then collects the last ones."""
    rng = random.Random(11)
    with BertClient("127.0.0.1", **server.client_kwargs, timeout=SETUP_TIMEOUT_MS, check_length=False) as client:
        started = time.perf_counter()
        batches = (
            plan.texts(plan.indices(rng, CAPACITY_REQUEST))
            for _ in itertools.takewhile(lambda _: time.perf_counter() - started < seconds, itertools.count())
        )
        sentences = sum(len(vectors) for vectors in client.encode_async(batches))
        elapsed = time.perf_counter() - started
    return {
        "seconds": round(elapsed, 2),
        "sentences": sentences,
        "request_size": CAPACITY_REQUEST,
        "sentences_per_second": round(sentences / elapsed, 1),
    }


def run(args: argparse.Namespace, server_flags: list[str]) -> dict[str, Any]:
    progress = Progress()
    model_dir = resolve_model_dir(args.model_dir)
    if model_dir is None:
        raise SystemExit(NO_MODEL_HINT)
    classes, weights = args.mix
    corpus = read_corpus(args.corpus)
    model = args.model_class or "Encoder"
    progress(f"expected vectors of {len(corpus)} sentences from the in-process {model} ({model_dir})")
    expected = expected_vectors(model_dir, corpus, args)
    plan = Plan(classes, weights, corpus)

    flags = ["--model-dir", str(model_dir), "--max-seq-len", args.max_seq_len, "--dtype", args.dtype]
    flags += ["--num-worker", str(args.num_worker), "--request-timeout-ms", str(int(args.timeout_ms))]
    if args.graph_dir is not None:
        flags += ["--graph-dir", str(args.graph_dir)]
    if args.model_class is not None:
        flags += ["--model-class", args.model_class]
    server = start_server(*flags, *server_flags, expect_ready=False, echo=args.server_output)
    report: dict[str, Any] = {"kind": "soak", "server_flags": [*flags, *server_flags]}
    load_start = os.getloadavg()
    try:
        report["server_ready_seconds"] = round(server.wait_ready(args.start_timeout), 2)
        progress(f"server ready on port {server.port} ({server.port_out})")
        report["unloaded"] = unloaded_times(server, plan, expected, args.repeats, progress)
        report["capacity"] = capacity(server, plan, args.capacity_seconds)
        cap = report["capacity"]["sentences_per_second"]
        offered = args.load * cap
        rate = offered / plan.mean_size()
        progress(f"capacity {cap} sentences/s; offering {offered:.0f} sentences/s, {rate:.2f} requests/s")
        report["status_before"] = _status(server)

        load_s = args.minutes * 60
        wait_ms = args.timeout_ms + args.grace_ms
        drain_s = wait_ms / 1000 + DRAIN_MARGIN_S
        warmup_s = min(60.0, 0.2 * load_s) if args.warmup is None else args.warmup
        interval = min(args.rss_interval, max(0.5, load_s / 30))
        origin = time.monotonic() + START_DELAY_S
        log = RequestLog(origin)
        clients = [
            OpenLoopClient(
                n,
                server,
                plan,
                expected,
                log,
                rate=rate / args.clients,
                wait_ms=wait_ms,
                start_at=origin,
                stop_at=origin + load_s,
                drain_s=drain_s,
                seed=args.seed,
            )
            for n in range(1, args.clients + 1)
        ]
        for client in clients:
            client.start()
        time.sleep(max(0.0, origin - time.monotonic()))
        rss = RssSampler(server, interval).start()
        progress(f"{args.clients} clients sending for {load_s:.0f} s")
        load_begun = os.getloadavg()
        report_every = min(60.0, max(5.0, load_s / 10))
        while (left := load_s - (time.monotonic() - origin)) > 0:
            time.sleep(min(left, report_every))
            sent, records = log.snapshot()
            counts = {name: sum(r.outcome == name for r in records) for name in OUTCOMES}
            shown = ", ".join(f"{name} {count}" for name, count in counts.items() if count)
            progress(f"sent {sent}: {shown}; server RSS {rss.latest_mib():.0f} MiB")
        progress(f"load over; draining (at most {drain_s:.0f} s)")
        for client in clients:
            client.join(max(0.0, origin + load_s + drain_s + 5.0 - time.monotonic()))
        seconds = time.monotonic() - origin
        rss.stop(timeout=None)
        stuck = [c.name for c in clients if c.is_alive()]
        crashes = [f"{c.name}: {c.crash!r}" for c in clients if c.crash is not None]
        report["status"] = _status(server)
    finally:
        server.terminate()
        report["stop_problems"] = server.wait_stopped()

    sent, records = log.snapshot()
    report.update(
        clients=args.clients,
        minutes=args.minutes,
        seconds=round(seconds, 1),
        load=args.load,
        timeout_ms=args.timeout_ms,
        grace_ms=args.grace_ms,
        mix=dict(zip(classes, weights, strict=True)),
        bulk_sizes=list(plan.bulk_sizes),
        mean_request_sentences=round(plan.mean_size(), 1),
        offered_sentences_per_second=round(offered, 1),
        offered_requests_per_second=round(rate, 3),
        sent=sent,
        unrecorded=sent - len(records),
        connect_errors=dict(log.connect_errors),
        send_lag_ms={name: percentile_ms(log.send_lag, q, 1) for name, q in (("p50", 50), ("p99", 99), ("max", 100))},
        load_average={"start": load_start, "load_start": load_begun, "end": os.getloadavg()},
        notes=args.note,
        outcomes=summary.outcomes(records, classes),
        latency_ms=summary.latencies(records, classes),
        bulk=summary.bulk(records, report["unloaded"]["median_seconds"], plan.bulk_sizes),
        busy=summary.busy(records, classes),
        throughput=summary.throughput(records, load_s),
        expiry=summary.expiry(records, report.get("status_before"), report["status"]),
        rss=summary.memory(rss, origin, warmup_s, load_s),
        stuck_clients=stuck,
        crashes=crashes,
        environment=environment(),
    )
    report["targets"] = summary.targets(report)
    total = report["outcomes"]["total"]
    failures = [f"{name} {total[name]}" for name in FAILED if total[name]]
    failures += [f"{report['unrecorded']} requests never ended"] * bool(report["unrecorded"])
    failures += [f"stuck clients {stuck}"] * bool(stuck) + [f"crashes {crashes}"] * bool(crashes)
    failures += [f"stop: {problem}" for problem in report["stop_problems"]]
    failures += [f"{report['unloaded']['wrong_replies']} wrong unloaded replies"] * bool(
        report["unloaded"]["wrong_replies"]
    )
    if sent == 0:
        failures.append("nothing was sent")
    growth = report["rss"].get("growth_percent")
    if args.max_rss_growth is not None and growth is not None and growth > args.max_rss_growth:
        failures.append(f"server RSS grew {growth}% (> {args.max_rss_growth}%)")
    report["passed"], report["failures"] = not failures, failures
    return report


def _status(server: RunningServer) -> dict[str, Any] | None:
    try:
        with BertClient("127.0.0.1", **server.client_kwargs, timeout=10_000, check_length=False) as client:
            return client.server_status
    except BertClientError as exc:
        return {"error": repr(exc)}


# ----------------------------------------------------------------------------------------
# the command line
# ----------------------------------------------------------------------------------------


def parse_mix(text: str) -> tuple[list[str], list[float]]:
    """``small,medium,bulk`` (default weights) or ``small=90,bulk=10``."""
    classes, weights = [], []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, weight = part.partition("=")
        if name not in SIZES:
            raise argparse.ArgumentTypeError(f"unknown size {name!r}; choose from {', '.join(SIZES)}")
        classes.append(name)
        weights.append(float(weight) if weight else SIZES[name][2])
    if not classes or min(weights) <= 0:
        raise argparse.ArgumentTypeError(f"--mix needs sizes with positive weights, not {text!r}")
    return classes, weights


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ours, server_flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Flags after -- are passed to `bertserve start` as they are."
    )
    parser.add_argument("--clients", type=int, default=64, help="client threads (default 64)")
    parser.add_argument("--minutes", type=float, default=30.0, help="minutes of load (default 30)")
    parser.add_argument("--load", type=float, default=1.5, help="offered sentences/s over capacity (default 1.5)")
    parser.add_argument(
        "--mix",
        type=parse_mix,
        default="small,medium,bulk",
        help="request sizes: small (1-8), medium (9-100), bulk ("
        + ", ".join(map(str, BULK_SIZES))
        + "), as name or name=weight; default weights small 85, medium 12, bulk 3",
    )
    parser.add_argument("--capacity-seconds", type=float, default=25.0, help="capacity run (default 25)")
    parser.add_argument("--repeats", type=int, default=3, help="unloaded timings of each bulk size (default 3)")
    parser.add_argument("--model-dir", type=Path, help="default: all-MiniLM-L6-v2")
    parser.add_argument("--graph-dir", type=Path, help="graph cache shared by the Encoder and the server")
    parser.add_argument(
        "--model-class",
        metavar="MODULE:NAME",
        help="serve this model class (the server's --model-class) and check replies against it in process, "
        "not the Encoder: the plumbing without the model's cost",
    )
    parser.add_argument("--num-worker", type=int, default=2)
    parser.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (server and Encoder)")
    parser.add_argument("--max-seq-len", default="128", help="server and Encoder (default 128)")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument(
        "--timeout-ms",
        type=float,
        default=60_000,
        help="each request's deadline, the server's --request-timeout-ms (default 60000)",
    )
    parser.add_argument(
        "--grace-ms", type=float, default=15_000, help="how much longer a client waits for the answer (default 15000)"
    )
    parser.add_argument("--warmup", type=float, help="seconds before the RSS baseline (default 60, or 1/5 of the run)")
    parser.add_argument("--rss-interval", type=float, default=5.0, help="seconds between RSS samples (default 5)")
    parser.add_argument("--max-rss-growth", type=float, help="fail if RSS grows more than this %% after warm-up")
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds for the server to be ready")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-output", action="store_true", help="echo the server's output to stderr")
    parser.add_argument("--note", action="append", default=[], help="a note for the report (repeatable)")
    parser.add_argument("--json", type=Path, help="write the report as JSON")
    parser.add_argument("--markdown", type=Path, help="write the report as markdown")
    args = parser.parse_args(ours)
    if min(args.clients, args.minutes, args.timeout_ms, args.load, args.capacity_seconds, args.repeats) <= 0:
        parser.error("--clients, --minutes, --timeout-ms, --load, --capacity-seconds and --repeats must be positive")
    if args.grace_ms < 0:
        parser.error("--grace-ms must be 0 or more")
    return args, server_flags


def main(argv: list[str] | None = None) -> int:
    args, server_flags = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop like Ctrl-C: the server is stopped too
    try:
        report = run(args, server_flags)
    except ServerStartError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    write_report(report, summary.markdown(report), args.json, args.markdown)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
