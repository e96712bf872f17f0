"""Soak test: an open-loop load of mixed request sizes at a multiple of the server's capacity,
for minutes; every reply checked, every refusal and expiry timed.

Starts a real server on free loopback ports (the shared launcher, ``bertserve.server.testing.launcher``) with
``--request-timeout-ms`` set to ``--timeout-ms``, computes the expected vector of every corpus
sentence once with the in-process ``Encoder`` (same model options), then

1. times each bulk size (``BULK_SIZES``) alone on the idle server (median of ``--repeats``),
   and measures the capacity: sentences/s of bulk requests alone for ``--capacity-seconds``;
2. runs ``--clients`` threads for ``--minutes``, each with its own ``AsyncBertClient``,
   sending at Poisson arrivals so that the offered sentences/s are ``--load`` times the
   capacity, each request without waiting for the ones before it. Each client waits
   ``--grace-ms`` beyond the server's deadline, so an expired request is told apart from
   silence. Every reply is checked row by row (the clients: ``_soak_clients.py``); the
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
from _soak_clients import BULK_SIZES, FAILED, OUTCOMES, SIZES, Expected, OpenLoopClient, Plan, Record, RequestLog
from bertserve.client import BertClient, BertClientError
from lib.inputs import DEFAULT_CORPUS, NO_MODEL_HINT, read_corpus, resolve_model_dir
from lib.report import Progress, describe_cpu, environment, write_report
from lib.rss import RssSampler
from lib.servers import RunningServer, ServerStartError, start_server
from lib.stats import percentile_ms

DRAIN_MARGIN_S = 10.0  # beyond a client's wait, before a request still under way counts as lost
START_DELAY_S = 5.0  # for the client threads to connect before the load begins
CAPACITY_REQUEST = 512  # sentences per request of the capacity run, ASYNC_WINDOW of them in flight
SETUP_TIMEOUT_MS = 600_000

# the targets: small p99, bulk p99 over its unloaded time, a busy refusal's p99
SMALL_P99_MS = 2000.0
BULK_P99_RATIO = 5.0
BUSY_P99_MS = 1000.0


# ----------------------------------------------------------------------------------------
# the phases
# ----------------------------------------------------------------------------------------


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
    progress(f"expected vectors of {len(corpus)} sentences from the in-process Encoder ({model_dir})")
    expected = expected_vectors(model_dir, corpus, args)
    plan = Plan(classes, weights, corpus)

    flags = ["--model-dir", str(model_dir), "--max-seq-len", args.max_seq_len, "--dtype", args.dtype]
    flags += ["--num-worker", str(args.num_worker), "--request-timeout-ms", str(int(args.timeout_ms))]
    if args.graph_dir is not None:
        flags += ["--graph-dir", str(args.graph_dir)]
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
        outcomes=_outcomes(records, classes),
        latency_ms=_latencies(records, classes),
        bulk=_bulk(records, report["unloaded"]["median_seconds"], plan.bulk_sizes),
        busy=_busy(records, classes),
        throughput=_throughput(records, load_s),
        expiry=_expiry(records, report.get("status_before"), report["status"]),
        rss=rss_summary(rss, origin, warmup_s, load_s),
        stuck_clients=stuck,
        crashes=crashes,
        environment=environment(),
    )
    report["targets"] = _targets(report)
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
# the summaries
# ----------------------------------------------------------------------------------------


def _ms(seconds: list[float]) -> dict[str, Any]:
    return {"count": len(seconds), **{f"p{q}": percentile_ms(seconds, q, 1) for q in (50, 99)}} | {
        "max": percentile_ms(seconds, 100, 1)
    }


def _outcomes(records: list[Record], classes: list[str]) -> dict[str, dict[str, int]]:
    table = {name: {outcome: 0 for outcome in OUTCOMES} for name in ["total", *classes]}
    for r in records:
        table["total"][r.outcome] += 1
        table[r.size_class][r.outcome] += 1
    for row in table.values():
        row["sent"] = sum(row.values())
    table["other_by_kind"] = dict(
        sorted({kind: sum(r.kind == kind for r in records) for kind in {r.kind for r in records if r.kind}}.items())
    )
    return table


def _latencies(records: list[Record], classes: list[str]) -> dict[str, Any]:
    """Per class, the time to the answer of every admitted request that got one: vectors
    (ok) or an expiry; an expired request counts at the time its expiry came."""
    return (
        {
            name: _ms([r.seconds for r in records if r.size_class == name and r.outcome in ("ok", "expired")])
            for name in classes
        }
        | {
            f"{name}_ok": _ms([r.seconds for r in records if r.size_class == name and r.outcome == "ok"])
            for name in classes
        }
        | {
            f"{name}_{label}": _ms(
                [
                    r.seconds
                    for r in records
                    if r.size_class == name and r.outcome in ("ok", "expired") and r.behind_bulk == behind
                ]
            )
            for name in classes
            for label, behind in (("behind_own_bulk", True), ("not_behind_own_bulk", False))
        }
    )


def _bulk(records: list[Record], unloaded: dict[str, float], sizes: tuple[int, ...]) -> dict[str, Any]:
    """Admitted bulk requests (ok or expired) by size, and their latency over the unloaded time."""
    rows, ratios = {}, []
    for size in sizes:
        mine = [r for r in records if r.size_class == "bulk" and r.size == size]
        admitted = [r.seconds for r in mine if r.outcome in ("ok", "expired")]
        base = unloaded[str(size)]
        ratios += [s / base for s in admitted]
        rows[str(size)] = {
            "sent": len(mine),
            **{o: sum(r.outcome == o for r in mine) for o in ("ok", "busy", "expired")},
            "latency_ms": _ms(admitted),
            "unloaded_ms": round(base * 1000, 1),
            "p99_ratio": round(float(np.percentile(admitted, 99)) / base, 2) if admitted else None,
        }
    all_admitted = [r.seconds for r in records if r.size_class == "bulk" and r.outcome in ("ok", "expired")]
    return {
        "by_size": rows,
        "admitted_latency_ms": _ms(all_admitted),
        "ratio_p50": round(float(np.percentile(ratios, 50)), 2) if ratios else None,
        "ratio_p99": round(float(np.percentile(ratios, 99)), 2) if ratios else None,
        "ratio_max": round(max(ratios), 2) if ratios else None,
    }


def _busy(records: list[Record], classes: list[str]) -> dict[str, Any]:
    busy = [r for r in records if r.outcome == "busy"]
    bulk = [r for r in records if r.size_class == "bulk"]
    return {
        "refusal_ms": _ms([r.seconds for r in busy]),
        "by_class": {name: sum(r.size_class == name for r in busy) for name in classes},
        "bulk_refused_fraction": round(sum(r.outcome == "busy" for r in bulk) / len(bulk), 3) if bulk else None,
        "sentences_refused": sum(r.size for r in busy),
    }


def _throughput(records: list[Record], load_s: float) -> dict[str, Any]:
    """Sentences per second of the load: sent, answered with vectors, refused, expired."""
    per_s = {
        "sent": sum(r.size for r in records),
        "ok": sum(r.size for r in records if r.outcome == "ok"),
        "busy": sum(r.size for r in records if r.outcome == "busy"),
        "expired": sum(r.size for r in records if r.outcome == "expired"),
    }
    return {name: round(sentences / load_s, 1) for name, sentences in per_s.items()}


def _find(data: Any, key: str) -> list[Any]:
    """Every value of ``key`` anywhere in the nested ``data``."""
    if isinstance(data, dict):
        return [v for k, v in data.items() if k == key] + [x for v in data.values() for x in _find(v, key)]
    if isinstance(data, list):
        return [x for v in data for x in _find(v, key)]
    return []


def _counter(status: Any, key: str) -> int | None:
    values = [v for v in _find(status, key) if isinstance(v, (int, float))]
    return int(sum(values)) if values else None


def _expiry(records: list[Record], before: Any, after: Any) -> dict[str, Any]:
    """Expired replies the clients got against what the server counted during the load."""

    def during(key: str) -> int | None:
        end, start = _counter(after, key), _counter(before, key)
        return None if end is None else end - (start or 0)

    return {
        "client_expired_replies": sum(r.outcome == "expired" for r in records),
        "client_timeouts": sum(r.outcome == "timeout" for r in records),
        "client_lost": sum(r.outcome == "lost" for r in records),
        "server_requests_expired": during("requests_expired"),
        "server_expired_sentences_dropped": during("expired_sentences_dropped"),
        "server_skipped_sentences": during("skipped_sentences"),
        "server_busy_rejections": during("busy_rejections"),
        "expiry_reply_ms": _ms([r.seconds for r in records if r.outcome == "expired"]),
    }


def _targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    total, expiry = report["outcomes"]["total"], report["expiry"]
    small_p99 = report["latency_ms"].get("small", {}).get("p99")
    ratio = report["bulk"]["ratio_p99"]
    admitted = report["bulk"]["admitted_latency_ms"]["count"]
    bulk_expired = sum(row["expired"] for row in report["bulk"]["by_size"].values())
    busy = report["busy"]["refusal_ms"]
    bad = total["lost"] + total["crossed"] + total["wrong"]
    silent = expiry["client_timeouts"] + expiry["client_lost"] + report["unrecorded"]
    matched = expiry["server_requests_expired"] == expiry["client_expired_replies"]

    def line(target: str, measured: str, passed: bool | None) -> dict[str, Any]:
        return {"target": target, "measured": measured, "passed": passed}

    def known(value: Any) -> bool:
        return value is not None and value == value  # not None, not NaN

    return [
        line(
            "0 lost, crossed or wrong",
            f"lost {total['lost']}, crossed {total['crossed']}, wrong {total['wrong']}",
            bad == 0,
        ),
        line(
            f"small p99 <= {SMALL_P99_MS / 1000:g} s (ok and expired)",
            f"{small_p99} ms",
            small_p99 <= SMALL_P99_MS if known(small_p99) else None,
        ),
        line(
            f"admitted bulk p99 <= {BULK_P99_RATIO:g}x its unloaded time",
            f"{ratio}x (p99 of latency / unloaded; {bulk_expired} of {admitted} admitted expired, "
            "counted at their expiry)",
            ratio <= BULK_P99_RATIO if known(ratio) else None,
        ),
        line(
            f"the excess refused busy at once (p99 <= {BUSY_P99_MS / 1000:g} s)",
            f"{busy['count']} refusals, p50 {busy['p50']} ms, p99 {busy['p99']} ms",
            busy["p99"] <= BUSY_P99_MS if busy["count"] else None,
        ),
        line(
            "every expired request answered as expired, none unanswered",
            f"{expiry['client_expired_replies']} expired replies "
            f"(server counted {expiry['server_requests_expired']}), "
            f"{expiry['client_timeouts']} client timeouts, {expiry['client_lost']} lost",
            silent == 0 and matched,
        ),
    ]


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


# ----------------------------------------------------------------------------------------
# the markdown
# ----------------------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    classes = list(report["mix"])
    mix = ",".join(f"{name}={weight:g}" for name, weight in report["mix"].items())
    cap, unloaded, load = report["capacity"], report["unloaded"]["median_seconds"], report.get("load_average")
    lines = [
        f"## bertserve soak: {report['clients']} clients, {report['minutes']:g} min open loop at "
        f"{report['load']:g}x capacity ({report['seconds']:.0f} s with the drain), mix {mix}",
        "",
        f"Machine: {describe_cpu(report['environment'])}; the server and the soak's clients share it "
        "(and other work running on it at the time).",
        "",
        f"Capacity: **{cap['sentences_per_second']} sentences/s** (bulk requests of {cap['request_size']} alone, "
        f"{cap['sentences']} sentences in {cap['seconds']} s). Offered: {report['load']:g}x = "
        f"{report['offered_sentences_per_second']} sentences/s, {report['offered_requests_per_second']} requests/s "
        f"(mean {report['mean_request_sentences']} sentences) at Poisson arrivals over the clients. Deadline "
        f"{report['timeout_ms'] / 1000:g} s (`--request-timeout-ms`); clients wait {report['grace_ms'] / 1000:g} s "
        f"longer, so an expiry is told apart from silence. Sends behind schedule: p99 "
        f"{report['send_lag_ms']['p99']} ms, max {report['send_lag_ms']['max']} ms."
        + (
            f" Load average (1 min) of the machine at the start {load['start'][0]:.2f}, when the load began "
            f"{load['load_start'][0]:.2f}, at the end {load['end'][0]:.2f}."
            if load
            else ""
        ),
        "",
        "| unloaded, median of "
        + str(report["unloaded"]["repeats"])
        + " | "
        + " | ".join(f"{size}" for size in unloaded)
        + " sentences |",
        "| --- |" + " ---: |" * len(unloaded),
        "| ms | " + " | ".join(f"{s * 1000:.0f}" for s in unloaded.values()) + " |",
        "",
        "| outcome | total | " + " | ".join(classes) + " |",
        "| --- | ---: |" + " ---: |" * len(classes),
    ]
    outcomes = report["outcomes"]
    for row in ("sent", *OUTCOMES):
        lines.append(f"| {row} | " + " | ".join(str(outcomes[c][row]) for c in ["total", *classes]) + " |")
    if outcomes["other_by_kind"]:
        lines += ["", f"other outcomes by kind: {outcomes['other_by_kind']}"]
    lines += ["", "| latency ms (ok and expired) | count | p50 | p99 | max |", "| --- | ---: | ---: | ---: | ---: |"]
    for name in classes:
        for key, label in (
            (name, name),
            (f"{name}_ok", f"{name}, ok only"),
            (f"{name}_not_behind_own_bulk", f"{name}, sent while its client had no bulk request under way"),
            (f"{name}_behind_own_bulk", f"{name}, sent while its client had a bulk request under way"),
        ):
            row = report["latency_ms"][key]
            lines.append(f"| {label} | {row['count']} | {row['p50']} | {row['p99']} | {row['max']} |")
    bulk = report["bulk"]
    lines += [
        "",
        "| bulk size | sent | ok | busy | expired | p50 ms | p99 ms | unloaded ms | p99 / unloaded |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size, row in bulk["by_size"].items():
        latency = row["latency_ms"]
        lines.append(
            f"| {size} | {row['sent']} | {row['ok']} | {row['busy']} | {row['expired']} | {latency['p50']} "
            f"| {latency['p99']} | {row['unloaded_ms']} | {row['p99_ratio']} |"
        )
    busy, expiry, through = report["busy"], report["expiry"], report["throughput"]
    lines += [
        f"| all admitted | | | | | {bulk['admitted_latency_ms']['p50']} | {bulk['admitted_latency_ms']['p99']} | "
        f"| {bulk['ratio_p99']} (p99 of each request's ratio; p50 {bulk['ratio_p50']}, max {bulk['ratio_max']}) |",
        "",
        f"Busy refusals: {busy['refusal_ms']['count']} ({busy['by_class']}), {busy['bulk_refused_fraction']} of "
        f"bulk requests; time to the refusal p50 {busy['refusal_ms']['p50']} ms, p99 {busy['refusal_ms']['p99']} ms, "
        f"max {busy['refusal_ms']['max']} ms. Sentences/s during the load: sent {through['sent']}, answered "
        f"{through['ok']}, refused {through['busy']}, expired {through['expired']}.",
        "",
        f"Expiry: clients got {expiry['client_expired_replies']} expired replies (p50 "
        f"{expiry['expiry_reply_ms']['p50']} ms, max {expiry['expiry_reply_ms']['max']} ms after the send); the "
        f"server counted {expiry['server_requests_expired']} requests expired, "
        f"{expiry['server_expired_sentences_dropped']} queued sentences dropped, {expiry['server_skipped_sentences']} "
        f"skipped by workers, {expiry['server_busy_rejections']} busy refusals. Client timeouts (silence): "
        f"{expiry['client_timeouts']}; lost: {expiry['client_lost']}.",
    ]
    rss = report["rss"]
    lines += [
        "",
        f"| server RSS MiB | start (after {rss.get('warmup_seconds')} s) | peak | end | growth % | MiB/min |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| {len(rss['samples'])} samples | {rss.get('start_mib')} | {rss.get('peak_mib')} | {rss.get('end_mib')} "
        f"| {rss.get('growth_percent')} | {rss.get('slope_mib_per_minute')} |",
        "",
        "| target | measured | |",
        "| --- | --- | --- |",
    ]
    for target in report["targets"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[target["passed"]]
        lines.append(f"| {target['target']} | {target['measured']} | {verdict} |")
    if report["connect_errors"]:
        lines += ["", f"connection attempts that failed (retried): {report['connect_errors']}"]
    if report.get("notes"):
        lines += ["", "Notes:", "", *(f"- {note}" for note in report["notes"])]
    verdict = "PASS" if report["passed"] else "FAIL: " + "; ".join(report["failures"])
    return "\n".join([*lines, "", f"**{verdict}** (nothing lost, crossed, wrong or unanswered)", ""])


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
    write_report(report, markdown(report), args.json, args.markdown)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
