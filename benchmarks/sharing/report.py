"""The report of ``shared.py``: one row per scenario (figure, measured, target, met?)."""

from __future__ import annotations

import json
from typing import Any

from sharing.bench import RSS_LIMIT_MIB
from sharing.flood import BUSY_AT_ONCE_S


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _fairness_row(r: dict[str, Any]) -> tuple[str, str, str]:
    backlog = r["client_a_queued_sentences_at_each"]
    return (
        "another client's 32 sentences while one client has 1,000 x 100 queued",
        f"median {r['loaded_median_s']:.3f} s, max {r['loaded_max_s']:.3f} s over 5 "
        f"(idle {r['idle_median_s']:.3f} s; mini-job median {r['one_job_median_s']:.3f} s, "
        f"slowest {r['one_job_max_s']:.3f} s; A's backlog {backlog[0]:,} to {backlog[-1]:,} sentences)",
        f"<= 3 x idle + one mini-job = {r['target_s']:.3f} s ({r['target_with_max_job_s']:.3f} s with the slowest)",
    )


def _unread_row(r: dict[str, Any]) -> tuple[str, str, str]:
    return (
        "RSS growth: client that never reads its 1,000 x 100-sentence replies",
        f"peak +{r['peak_growth_mib']:.1f} MiB, end +{r['end_growth_mib']:.1f} MiB "
        f"(over the baseline of {r['baseline_mib']:.0f} MiB after the same load read by its client, which grew "
        f"{r['control_growth_mib']:+.0f} MiB from the start; {r['requests_served']} served in {r['serve_s']:.0f} s)",
        f"< {RSS_LIMIT_MIB:.0f} MiB",
    )


def _bigframe_row(r: dict[str, Any]) -> tuple[str, str, str]:
    return (
        "RSS growth: one 400 MB frame",
        f"peak +{r['peak_growth_mib']:.1f} MiB; served after: {_yes(r['served_after'])} ({r['latency_after_s']:.3f} s)",
        f"< {RSS_LIMIT_MIB:.0f} MiB, server serves after",
    )


def _flood_row(r: dict[str, Any]) -> tuple[str, str, str]:
    return (
        "flood beyond the queue bound (8 clients x 40 x 1,000)",
        f"{r['busy_errors']} of {r['flood_requests']} refused `busy`, {r['flood_answered']} answered; "
        f"send to `busy` reply median {r['send_to_busy_median_s'] * 1000:.0f} ms, max "
        f"{r['send_to_busy_max_s'] * 1000:.0f} ms; normal client's 32 sentences: {len(r['normal_latency_s'])} "
        f"of 6 answered, median {r['normal_median_s']:.3f} s, max {r['normal_max_s']:.3f} s "
        f"(idle {r['normal_idle_s']:.3f} s), refused `busy` {r['normal_busy_refusals']} times before that; "
        f"`busy_rejections` {r['busy_rejections']}; peak RSS +{r['peak_growth_mib']:.1f} MiB "
        f"({', '.join(f'{k} +{v:.0f}' for k, v in r['growth_by_process_mib'].items())})",
        f"`busy` at once (< {BUSY_AT_ONCE_S * 1000:.0f} ms), others served, RSS growth < {RSS_LIMIT_MIB:.0f} MiB",
    )


def _faults_row(r: dict[str, Any]) -> tuple[str, str, str]:
    k, s, p = r["kill9"], r["sigstop"], r["poison"]
    if "skipped" in p:
        poison = f"poison: {p['skipped']}"
    else:
        poison = (
            f"poison: error kind `{p['error_kind']}` after {p['error_after_s'] or float('nan'):.2f} s, "
            f"concurrent request answered: {_yes(p['normal_answered'])}, {p['worker_restarts']} worker "
            f"restarts, served after: {_yes(p['served_after'])}"
        )
    return (
        "kill -9 a worker; SIGSTOP a worker; an input that crashes the worker",
        f"kill -9: {k['lost']} lost, {k['wrong']} wrong of {k['requests']} (min cosine "
        f"{k['min_cosine']:.6f}), replaced: {_yes(k['replaced'])}; SIGSTOP (heartbeat timeout 3 s): "
        f"{s['lost']} lost, {s['wrong']} wrong, big request answered "
        f"{s['big_answered_after_hit_s'] or float('nan'):.1f} s after the stop, replaced: "
        f"{_yes(s['replaced'])}; {poison}",
        "0 lost or wrong; hung worker replaced; poison request gets an error",
    )


def _malformed_row(r: dict[str, Any]) -> tuple[str, str, str]:
    return (
        f"{r['messages']:,} malformed messages ({len(r['shapes'])} shapes)",
        f"pids unchanged: {_yes(r['pids_unchanged'])}; served after: {_yes(r['served_after'])}; "
        f"{r['rejected']:,} rejected {json.dumps(r['rejections'])}, {r['unanswered']} unanswered; "
        f"{r['ventilator_loop_exceptions']} exceptions in the ventilator loop",
        "0 crashes",
    )


_ROWS = {
    "fairness": _fairness_row,
    "unread": _unread_row,
    "bigframe": _bigframe_row,
    "flood": _flood_row,
    "faults": _faults_row,
    "malformed": _malformed_row,
}


def _rows(results: dict[str, Any]) -> list[tuple[str, ...]]:
    return [(*_ROWS[name](result), _yes(result["met"])) for name, result in results.items() if "error" not in result]


def markdown(report: dict[str, Any]) -> str:
    facts = report["machine"]
    lines = [
        "# bertserve: sharing one server",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {facts['cpu']}, {facts['cores']} cores, flags {' '.join(facts['cpu_flags']) or 'none'}; "
        f"Python {facts['python']}, TensorFlow {facts['tensorflow']}, "
        f"load average {facts['load_before']} before, {facts['load_after']} after. Servers: "
        f"`{' '.join(report['server_flags'])}`, model `{report['model_dir']}`. Total {report['seconds']:.0f} s.",
        "",
        "| figure | measured | target | met? |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {' | '.join(row)} |" for row in _rows(report["results"])]
    errors = {name: r["error"] for name, r in report["results"].items() if "error" in r}
    if errors:
        lines += ["", "Scenarios that failed to run:", ""] + [f"- {name}: {error}" for name, error in errors.items()]
    lines += [
        "",
        "Stops (SIGTERM to exit): " + ", ".join(f"{s['scenario']} {s['seconds']:.1f} s" for s in report["stops"]),
    ]
    bad = [s for s in report["stops"] if s["problems"]]
    if bad:
        lines += [f"- {s['scenario']}: {'; '.join(s['problems'])}" for s in bad]
    return "\n".join(lines) + "\n"
