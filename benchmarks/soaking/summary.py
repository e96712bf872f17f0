"""What ``soak.py`` makes of its records: outcomes, latencies, bulk over unloaded, busy
refusals, throughput, expiries against the server's count, memory, the targets, and the
markdown."""

from __future__ import annotations

from typing import Any

import numpy as np
from lib.report import describe_cpu
from lib.rss import RssSampler
from lib.stats import percentile_ms

from soaking.clients import OUTCOMES, Record

# the targets: small p99, bulk p99 over its unloaded time, a busy refusal's p99
SMALL_P99_MS = 2000.0
BULK_P99_RATIO = 5.0
BUSY_P99_MS = 1000.0


# ----------------------------------------------------------------------------------------
# the summaries
# ----------------------------------------------------------------------------------------


def _ms(seconds: list[float]) -> dict[str, Any]:
    return {"count": len(seconds), **{f"p{q}": percentile_ms(seconds, q, 1) for q in (50, 99)}} | {
        "max": percentile_ms(seconds, 100, 1)
    }


def outcomes(records: list[Record], classes: list[str]) -> dict[str, dict[str, int]]:
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


def latencies(records: list[Record], classes: list[str]) -> dict[str, Any]:
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


def bulk(records: list[Record], unloaded: dict[str, float], sizes: tuple[int, ...]) -> dict[str, Any]:
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


def busy(records: list[Record], classes: list[str]) -> dict[str, Any]:
    busy = [r for r in records if r.outcome == "busy"]
    bulk = [r for r in records if r.size_class == "bulk"]
    return {
        "refusal_ms": _ms([r.seconds for r in busy]),
        "by_class": {name: sum(r.size_class == name for r in busy) for name in classes},
        "bulk_refused_fraction": round(sum(r.outcome == "busy" for r in bulk) / len(bulk), 3) if bulk else None,
        "sentences_refused": sum(r.size for r in busy),
    }


def throughput(records: list[Record], load_s: float) -> dict[str, Any]:
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


def expiry(records: list[Record], before: Any, after: Any) -> dict[str, Any]:
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


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
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


def memory(rss: RssSampler, origin: float, warmup_s: float, load_s: float) -> dict[str, Any]:
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
