"""Soak test: many clients, mixed request sizes, for minutes; every reply checked.

Starts a real server on free loopback ports (the shared launcher, ``tests/serving.py``),
computes the expected vector of every corpus sentence once with the in-process ``Encoder``
(same model options), then runs ``--clients`` threads, each with its own ``BertClient``, for
``--minutes``. Each thread sends requests of mixed sizes drawn from the corpus, mostly
blocking ``encode``, sometimes a few ``blocking=False`` requests then ``fetch``, and checks
every reply row by row against the expected vectors (the clients: ``_soak_clients.py``). The
server's memory (RSS of the server and all its children) is sampled throughout.

    python benchmarks/soak.py --clients 64 --minutes 30 --mix small,medium,bulk \\
        --json benchmarks/results/soak.json --markdown benchmarks/results/soak.md
    python benchmarks/soak.py --clients 4 --minutes 0.5 -- --max-batch-size 64   # flags after -- go to the server

Exits 1 if any request was lost, crossed or wrong (or the server did not stop cleanly),
2 if it could not run. Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _soak_clients import SIZES, Counters, Expected, Plan, SoakClient
from bertserve.client import BertClient, BertClientError
from lib.inputs import DEFAULT_CORPUS, NO_MODEL_HINT, read_corpus, resolve_model_dir
from lib.report import Progress, environment, write_report
from lib.rss import RssSampler
from lib.servers import RunningServer, ServerStartError, start_server

DRAIN_MARGIN_S = 30.0  # beyond the client timeout, before a thread counts as stuck


def rss_summary(rss: RssSampler, origin: float, warmup_s: float, load_s: float) -> dict[str, Any]:
    """The RSS samples of the load (seconds since ``origin``, MiB), their start after the
    warm-up, peak, end, growth and least-squares slope."""
    samples = [(round(s.at - origin, 2), round(s.total_mib, 1)) for s in rss.samples]
    during = [(t, mib) for t, mib in samples if t <= load_s + rss.interval / 2 and mib > 0]
    after = [(t, mib) for t, mib in during if t >= warmup_s] or during[-1:]
    if not after:
        return {"samples": samples}
    start, end = after[0][1], after[-1][1]
    slope = None
    if len(after) >= 3:
        times, mibs = np.array(after).T
        slope = round(float(np.polyfit(times / 60, mibs, 1)[0]), 2)
    return {
        "warmup_seconds": round(warmup_s, 1),
        "start_mib": start,
        "peak_mib": max(mib for _, mib in during),
        "end_mib": end,
        "growth_percent": round(100 * (end - start) / start, 2) if start > 0 else None,
        "slope_mib_per_minute": slope,
        "interval_seconds": rss.interval,
        "samples": samples,
    }


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


def expected_vectors(model_dir: Path, corpus: list[str], args: argparse.Namespace) -> Expected:
    from bertserve.server import Encoder

    options: dict[str, Any] = {"max_seq_len": None if args.max_seq_len.upper() == "NONE" else int(args.max_seq_len)}
    options["dtype"] = args.dtype
    if args.graph_dir is not None:
        options["graph_dir"] = str(args.graph_dir)
    encoder = Encoder(model_dir, **options)
    expected = Expected(np.asarray(encoder.encode(corpus)))
    del encoder
    gc.collect()
    return expected


def run(args: argparse.Namespace, server_flags: list[str]) -> dict[str, Any]:
    progress = Progress()
    model_dir = resolve_model_dir(args.model_dir)
    if model_dir is None:
        raise SystemExit(NO_MODEL_HINT)
    classes, weights = args.mix
    corpus = read_corpus(args.corpus)
    progress(f"expected vectors of {len(corpus)} sentences from the in-process Encoder ({model_dir})")
    expected = expected_vectors(model_dir, corpus, args)

    flags = ["--model-dir", str(model_dir), "--max-seq-len", args.max_seq_len, "--dtype", args.dtype]
    flags += ["--num-worker", str(args.num_worker)]
    if args.graph_dir is not None:
        flags += ["--graph-dir", str(args.graph_dir)]
    server = start_server(*flags, *server_flags, expect_ready=False, echo=args.server_output)
    report: dict[str, Any] = {"kind": "soak", "server_flags": [*flags, *server_flags]}
    try:
        report["server_ready_seconds"] = round(server.wait_ready(args.start_timeout), 2)
        progress(f"server ready on port {server.port} ({server.port_out}); {args.clients} clients")
        load_s = args.minutes * 60
        warmup_s = min(60.0, 0.2 * load_s) if args.warmup is None else args.warmup
        interval = min(args.rss_interval, max(0.5, load_s / 30))
        plan = Plan(classes, weights, corpus, args.timeout_ms)
        counters = Counters(classes)
        clients = [SoakClient(n, server, plan, expected, counters, args.seed) for n in range(1, args.clients + 1)]
        load_origin = time.monotonic()
        rss = RssSampler(server, interval).start()
        for client in clients:
            client.start()
        report_every = min(60.0, max(5.0, load_s / 10))
        while (left := load_s - (time.monotonic() - load_origin)) > 0:
            time.sleep(min(left, report_every))
            t = counters.total()
            progress(
                f"sent {t.sent}, answered {t.answered}, wrong {t.outcomes['wrong']}, crossed "
                f"{t.outcomes['crossed']}, lost {t.outcomes['lost']}, busy {t.outcomes['busy']}, "
                f"errors {t.outcomes['error']}; server RSS {rss.latest_mib():.0f} MiB",
            )
        for client in clients:
            client.stop.set()
        drain_deadline = time.monotonic() + args.timeout_ms / 1000 + DRAIN_MARGIN_S
        progress(f"load over; draining (at most {drain_deadline - time.monotonic():.0f} s)")
        for client in clients:
            client.join(max(0.0, drain_deadline - time.monotonic()))
        seconds = time.monotonic() - load_origin
        rss.stop(timeout=None)
        stuck = [c.name for c in clients if c.is_alive()]
        crashes = [f"{c.name}: {c.crash!r}" for c in clients if c.crash is not None]
        report["status"] = _status(server)
    finally:
        server.terminate()
        report["stop_problems"] = server.wait_stopped()

    total = counters.total().summary(seconds)
    report.update(
        clients=args.clients, minutes=args.minutes, seconds=round(seconds, 1), timeout_ms=args.timeout_ms,
        mix=dict(zip(classes, weights, strict=True)), total=total, connect_errors=dict(counters.connect_errors),
        by_size={name: tally.summary(seconds) for name, tally in counters.by_class.items()},
        rss=rss_summary(rss, load_origin, warmup_s, load_s), stuck_clients=stuck, crashes=crashes,
        environment=environment(),
    )  # fmt: skip
    failures = [f"{name} {total[name]}" for name in ("lost", "crossed", "wrong") if total[name]]
    failures += [f"stuck clients {stuck}"] * bool(stuck) + [f"crashes {crashes}"] * bool(crashes)
    failures += [f"stop: {problem}" for problem in report["stop_problems"]]
    if total["sent"] == 0:
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


def markdown(report: dict[str, Any]) -> str:
    sizes = list(report["by_size"])
    columns = [report["total"], *(report["by_size"][name] for name in sizes)]
    mix = ",".join(f"{name}={weight:g}" for name, weight in report["mix"].items())
    lines = [
        f"## bertserve soak: {report['clients']} clients, {report['minutes']:g} min of load "
        f"({report['seconds']:.0f} s with the drain), mix {mix}",
        "",
        "| counter | total | " + " | ".join(sizes) + " |",
        "| --- | ---: |" + " ---: |" * len(sizes),
    ]
    rows = ["sent", "answered", "ok", "wrong", "crossed", "lost", "busy", "other_errors", "sentences_per_second"]
    for row in rows:
        lines.append(f"| {row.replace('_', ' ')} | " + " | ".join(str(c[row]) for c in columns) + " |")
    for q in ("p50", "p99", "max"):
        lines.append(f"| latency {q} ms | " + " | ".join(str(c["latency_ms"][q]) for c in columns) + " |")
    rss = report["rss"]
    lines += [
        "",
        f"| server RSS MiB | start (after {rss.get('warmup_seconds')} s) | peak | end | growth % | MiB/min |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| {len(rss['samples'])} samples | {rss.get('start_mib')} | {rss.get('peak_mib')} | {rss.get('end_mib')} "
        f"| {rss.get('growth_percent')} | {rss.get('slope_mib_per_minute')} |",
        "",
    ]
    if report["total"]["errors_by_kind"]:
        lines += [f"other errors: {report['total']['errors_by_kind']}", ""]
    if report["connect_errors"]:
        lines += [f"clients that could not connect (retried): {report['connect_errors']}", ""]
    verdict = "PASS" if report["passed"] else "FAIL: " + "; ".join(report["failures"])
    return "\n".join([*lines, f"**{verdict}**", ""])


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ours, server_flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Flags after -- are passed to `bertserve start` as they are."
    )
    parser.add_argument("--clients", type=int, default=64, help="client threads (default 64)")
    parser.add_argument("--minutes", type=float, default=30.0, help="minutes of load (default 30)")
    parser.add_argument(
        "--mix", type=parse_mix, default="small,medium,bulk",
        help="request sizes: small (1-8), medium (9-100), bulk (200-2000), as name or name=weight; "
        "default weights small 85, medium 12, bulk 3",
    )  # fmt: skip
    parser.add_argument("--model-dir", type=Path, help="default: all-MiniLM-L6-v2")
    parser.add_argument("--graph-dir", type=Path, help="graph cache shared by the Encoder and the server")
    parser.add_argument("--num-worker", type=int, default=2)
    parser.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (server and Encoder)")
    parser.add_argument("--max-seq-len", default="128", help="server and Encoder (default 128)")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument(
        "--timeout-ms", type=float, default=600_000, help="client timeout; no reply by then is lost (default 600000)"
    )
    parser.add_argument("--warmup", type=float, help="seconds before the RSS baseline (default 60, or 1/5 of the run)")
    parser.add_argument("--rss-interval", type=float, default=5.0, help="seconds between RSS samples (default 5)")
    parser.add_argument("--max-rss-growth", type=float, help="fail if RSS grows more than this %% after warm-up")
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds for the server to be ready")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-output", action="store_true", help="echo the server's output to stderr")
    parser.add_argument("--json", type=Path, help="write the report as JSON")
    parser.add_argument("--markdown", type=Path, help="write the report as markdown")
    args = parser.parse_args(ours)
    if args.clients < 1 or args.minutes <= 0 or args.timeout_ms <= 0:
        parser.error("--clients, --minutes and --timeout-ms must be positive")
    return args, server_flags


def main(argv: list[str] | None = None) -> int:
    args, server_flags = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop like Ctrl-C: the server is stopped too
    try:
        report = run(args, server_flags)
    except ServerStartError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    write_report(report, markdown(report), args.json, args.markdown)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
