"""``suite.py compare``, its report: the throughput rows, the targets, the markdown and the plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _compare_latency import LatencyResult
from lib.contenders import ST_NAME
from lib.report import format_load, pyplot
from lib.stats import clean, fmt, median, milliseconds, ratio

SERVER_FP32, SERVER_BF16 = "server fp32", "server bf16"
SERVER_NO_MERGE = "server fp32 no-merge"
CLIENTS_MERGE, CLIENTS_NO_MERGE = "single-sentence clients, merging on", "single-sentence clients, merging off"


@dataclass
class Timed:
    """One contender of the throughput comparison and its per-repeat rates."""

    name: str
    what: str
    rates: list[float] = field(default_factory=list)
    note: str = ""


@dataclass
class ThroughputRow:
    name: str
    what: str
    median_sentences_per_second: float | None
    runs: list[float]
    ratio_to_sentence_transformers: float | None
    note: str


@dataclass
class StartupResult:
    cold_seconds: list[float]
    warm_seconds: list[float]
    median_cold_seconds: float | None
    median_warm_seconds: float | None
    warm_to_cold: float | None


@dataclass
class Target:
    name: str
    measured: float | None
    target: str
    passed: bool | None
    detail: str


@dataclass
class CompareReport:
    kind: str
    model_dir: str
    sentences: int
    repeats: int
    max_seq_len: int
    batch_size: int | None
    bulk_request: int
    clients: int
    duration_s: float
    throughput: list[ThroughputRow]
    latency: LatencyResult
    padding_fraction: dict[str, float | None]
    status_padding_fraction_after_first_bulk: float | None
    peak_rss_mib: dict[str, dict[str, float]]
    startup: StartupResult
    targets: list[Target]
    skipped: str | None
    load_average: dict[str, list[float]]
    elapsed_s: float
    environment: dict[str, Any]


def throughput_rows(timed: Sequence[Timed]) -> list[ThroughputRow]:
    medians = {t.name: median(t.rates) for t in timed}
    reference = medians.get(ST_NAME, math.nan)
    return [
        ThroughputRow(
            name=t.name,
            what=t.what,
            median_sentences_per_second=clean(medians[t.name]),
            runs=[round(r, 1) for r in t.rates],
            ratio_to_sentence_transformers=clean(ratio(medians[t.name], reference)),
            note=t.note,
        )
        for t in timed
    ]


def target(name: str, measured: float, op: str, bound: float, detail: str) -> Target:
    """A target row; ``op`` is ``>=`` or ``<=``; NaN (not measured) is neither PASS nor MISS."""
    if math.isnan(measured):
        return Target(name, None, f"{op} {bound:g}", None, detail)
    passed = measured >= bound if op == ">=" else measured <= bound
    return Target(name, round(measured, 3), f"{op} {bound:g}", passed, detail)


def throughput_target(rows: dict[str, ThroughputRow], name: str, top: str, bottom: str, bound: float) -> Target:
    """``top``/``bottom`` as a ratio of medians; the detail lists the ratio within each repeat."""
    if top not in rows or bottom not in rows:
        return target(name, math.nan, ">=", bound, "not measured")
    a, b = rows[top], rows[bottom]
    median_a = math.nan if a.median_sentences_per_second is None else a.median_sentences_per_second
    median_b = math.nan if b.median_sentences_per_second is None else b.median_sentences_per_second
    paired = ", ".join(f"{x / y:.2f}" for x, y in zip(a.runs, b.runs, strict=False) if y)
    return target(name, ratio(median_a, median_b), ">=", bound, f"ratio of medians; per repeat: {paired}")


def compute_targets(
    rows: Sequence[ThroughputRow],
    latency: LatencyResult,
    padding: float,
    startup: StartupResult,
    st_targets: tuple[float, float],
) -> list[Target]:
    by_name = {r.name: r for r in rows}
    p99, limit = latency.under_load.p99, latency.limit_ms
    warm_cold = math.nan if startup.warm_to_cold is None else startup.warm_to_cold
    return [
        throughput_target(by_name, "server fp32 / sentence-transformers", SERVER_FP32, ST_NAME, st_targets[0]),
        throughput_target(by_name, "server bf16 / sentence-transformers", SERVER_BF16, ST_NAME, st_targets[1]),
        throughput_target(by_name, "server fp32 / Encoder fp32", SERVER_FP32, "Encoder fp32", 0.95),
        throughput_target(by_name, "server bf16 / Encoder bf16", SERVER_BF16, "Encoder bf16", 0.95),
        throughput_target(by_name, "single-sentence clients / one bulk client", CLIENTS_MERGE, SERVER_FP32, 0.6),
        target("p99 under load / (idle p50 + 1.5 x bulk job)", ratio(p99, math.nan if limit is None else limit),
               "<=", 1.0, f"p99 {p99:.0f} ms vs limit {fmt(limit, 0)} ms"),
        target("padding fraction (bulk corpus)", padding, "<=", 0.15, "server fp32, median of repeats"),
        target("warm start / cold start", warm_cold, "<=", 0.5,
               f"medians {fmt(startup.median_warm_seconds)} s vs {fmt(startup.median_cold_seconds)} s"),
    ]  # fmt: skip


def targets_markdown(targets: Sequence[Target]) -> str:
    lines = ["| target | measured | goal | result | detail |", "| --- | ---: | --- | --- | --- |"]
    for t in targets:
        result = "n/a" if t.passed is None else ("PASS" if t.passed else "MISS")
        lines.append(f"| {t.name} | {fmt(t.measured, 3)} | {t.target} | {result} | {t.detail} |")
    return "\n".join(lines)


def throughput_markdown(rows: Sequence[ThroughputRow]) -> list[str]:
    lines = [
        "| contender | what | median sentences/s | ratio to sentence-transformers | runs | note |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        runs = ", ".join(f"{x:.1f}" for x in r.runs)
        ratio_text = "n/a" if r.ratio_to_sentence_transformers is None else f"{r.ratio_to_sentence_transformers:.2f}x"
        lines.append(
            f"| {r.name} | {r.what} | {fmt(r.median_sentences_per_second)} | {ratio_text} | {runs} | {r.note} |"
        )
    return lines


def latency_text(lat: LatencyResult) -> str:
    return (
        f"Latency of one-sentence requests (server fp32, {lat.idle_requests} idle / {lat.load_requests} under "
        f"load): idle p50 {lat.idle.p50:.1f} ms, p99 {lat.idle.p99:.1f} ms; under a bulk load p50 "
        f"{lat.under_load.p50:.1f} ms, p90 {lat.under_load.p90:.1f} ms, p99 {lat.under_load.p99:.1f} ms. "
        f"Bulk mini-job median {fmt(milliseconds(lat.bulk_job_seconds))} ms ({lat.bulk_job_source}); in a "
        f"bulk-only window: median {fmt(milliseconds(lat.window_bulk_job_seconds))} ms, max "
        f"{fmt(milliseconds(lat.bulk_job_max_seconds))} ms. server_status recent_jobs at the end of the load, all "
        f"jobs: median_seconds {fmt(lat.status_median_job_seconds, 4)}, median_sentences "
        f"{fmt(lat.status_median_job_sentences, 0)}."
    )


def resources_text(report: CompareReport) -> list[str]:
    padding = ", ".join(f"{k} {fmt(v, 3)}" for k, v in report.padding_fraction.items())
    memory = ", ".join(
        f"{k} {v['serving']:.0f} serving ({v['startup']:.0f} starting)" for k, v in report.peak_rss_mib.items()
    )
    start = report.startup
    return [
        f"Padding fraction of the bulk corpus: {padding}; server_status padding_fraction after the fp32 "
        f"server's first bulk request: {fmt(report.status_padding_fraction_after_first_bulk, 3)}.",
        "",
        f"Peak RSS of each server's processes, MiB: {memory}.",
        "",
        f"Time to ready: cold (empty graph cache) {start.cold_seconds} s, warm {start.warm_seconds} s.",
    ]


def compare_markdown(report: CompareReport) -> str:
    lines = [
        f"Compare: model {report.model_dir}, {report.sentences} sentences, max_seq_len {report.max_seq_len}, "
        f"median of {report.repeats} repeats (round-robin). Servers: 1 worker; bulk client sends requests of "
        f"{report.bulk_request}; in-process batch size {report.batch_size or 'the Encoder default'}.",
        "",
        *throughput_markdown(report.throughput),
        "",
        latency_text(report.latency),
        "",
        *resources_text(report),
        "",
        "Targets:",
        "",
        targets_markdown(report.targets),
    ]
    if report.skipped:
        lines += ["", f"note: {report.skipped}"]
    before, after = (format_load(report.load_average[k]) for k in ("before", "after"))
    lines += ["", f"load average (1/5/15 min): {before} before, {after} after; {report.elapsed_s:.0f} s in all"]
    return "\n".join(lines)


def plot_compare(report: CompareReport, directory: Path) -> list[Path]:
    """``compare.png``: throughput per contender, single-sentence latency, peak memory."""
    plt = pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    fig, (ax_tp, ax_lat, ax_mem) = plt.subplots(
        1, 3, figsize=(17, 4.8), layout="constrained", gridspec_kw={"width_ratios": [3, 1.4, 1.4]}
    )
    rows = [r for r in report.throughput if r.median_sentences_per_second is not None]
    y = np.arange(len(rows))
    medians = [r.median_sentences_per_second or 0.0 for r in rows]
    spread = np.array(
        [[max(0, m - min(r.runs)), max(0, max(r.runs) - m)] for m, r in zip(medians, rows, strict=True)]
    ).T
    ax_tp.barh(y, medians, xerr=spread, color="#4c84c4", capsize=3)
    for row_y, row_median, row in zip(y, medians, rows, strict=True):
        ax_tp.text(max([row_median, *row.runs]) * 1.02, row_y, f"{row_median:.0f}", va="center", fontsize="small")
    ax_tp.set_yticks(y, [r.name for r in rows])
    ax_tp.invert_yaxis()
    ax_tp.set_xlabel("sentences / s (median, whiskers: min-max of repeats)")
    ax_tp.set_title(f"throughput on {report.sentences} sentences")
    lat = report.latency
    names = ["idle p50", "idle p99", "load p50", "load p99"]
    values = [lat.idle.p50, lat.idle.p99, lat.under_load.p50, lat.under_load.p99]
    ax_lat.bar_label(ax_lat.bar(names, values, color=["#8fb4de", "#1f5fa8", "#f0b27a", "#b22222"]), fmt="%.0f")
    if lat.limit_ms is not None:
        ax_lat.axhline(lat.limit_ms, color="black", linestyle="--", label="target for load p99")
        ax_lat.legend(fontsize="small")
    ax_lat.set_ylabel("ms")
    ax_lat.set_title("one-sentence request latency")
    memory = report.peak_rss_mib
    labels = [name.removeprefix("server ") for name in memory]
    ax_mem.bar_label(ax_mem.bar(labels, [v["serving"] for v in memory.values()], color="#6a9f58"), fmt="%.0f")
    ax_mem.set_ylabel("MiB")
    ax_mem.set_title("peak RSS per server (all processes)")
    path = directory / "compare.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
