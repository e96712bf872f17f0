"""``suite.py compare``, its report: the throughput rows, the targets, the markdown and the plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from lib.contenders import ST_NAME
from lib.report import describe_cpu, format_load, pyplot
from lib.stats import clean, fmt, median, milliseconds, ratio

from comparing.latency import LatencyResult
from comparing.roofline import Roofline, fraction, roofline_markdown
from comparing.targets import Target, targets_markdown


@dataclass
class Timed:
    """One contender of the throughput comparison and its per-repeat rates."""

    name: str
    what: str
    rates: list[float] = field(default_factory=list)
    note: str = ""
    dtype: str = "fp32"  # the precision of its matrix products, for the roofline


@dataclass
class ThroughputRow:
    name: str
    what: str
    median_sentences_per_second: float | None
    runs: list[float]
    ratio_to_sentence_transformers: float | None
    note: str
    dtype: str
    of_fp32_ceiling: float | None  # median / the fp32 matmul ceiling in sentences/s
    of_own_ceiling: float | None  # median / its own dtype's ceiling, where measured


@dataclass
class StartupResult:
    cold_seconds: list[float]
    warm_seconds: list[float]
    median_cold_seconds: float | None
    median_warm_seconds: float | None
    warm_to_cold: float | None


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
    single_sentence_p50_ms: dict[str, float | None]  # idle servers taking turns, sentence by sentence
    accuracy: dict[str, dict[str, Any]]  # min and mean cosine to the fp32 reference, per sentence
    roofline: Roofline | None
    targets: list[Target]
    skipped: str | None
    load_average: dict[str, list[float]]
    elapsed_s: float
    environment: dict[str, Any]


def throughput_rows(timed: Sequence[Timed], roof: Roofline | None) -> list[ThroughputRow]:
    medians = {t.name: median(t.rates) for t in timed}
    reference = medians.get(ST_NAME, math.nan)
    ceiling = (lambda dtype: roof.ceiling(dtype)) if roof is not None else (lambda dtype: None)
    return [
        ThroughputRow(
            name=t.name,
            what=t.what,
            median_sentences_per_second=clean(medians[t.name]),
            runs=[round(r, 1) for r in t.rates],
            ratio_to_sentence_transformers=clean(ratio(medians[t.name], reference)),
            note=t.note,
            dtype=t.dtype,
            of_fp32_ceiling=fraction(medians[t.name], ceiling("fp32")),
            of_own_ceiling=fraction(medians[t.name], ceiling(t.dtype)),
        )
        for t in timed
    ]


def throughput_markdown(rows: Sequence[ThroughputRow]) -> list[str]:
    lines = [
        "| contender | what | median sentences/s | ratio to sentence-transformers | of fp32 ceiling "
        "| of own dtype's ceiling | runs | note |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        runs = ", ".join(f"{x:.1f}" for x in r.runs)
        ratio_text = "n/a" if r.ratio_to_sentence_transformers is None else f"{r.ratio_to_sentence_transformers:.2f}x"
        own = "n/a" if r.of_own_ceiling is None else f"{r.of_own_ceiling:.2f} ({r.dtype})"
        lines.append(
            f"| {r.name} | {r.what} | {fmt(r.median_sentences_per_second)} | {ratio_text} "
            f"| {fmt(r.of_fp32_ceiling, 2)} | {own} | {runs} | {r.note} |"
        )
    return lines


def accuracy_text(report: CompareReport) -> list[str]:
    if not report.accuracy:
        return []
    cosines = "; ".join(
        f"{k} to {v['reference']}: min {v['min']:.4f}, mean {v['mean']:.5f}" for k, v in report.accuracy.items()
    )
    p50 = ", ".join(f"{k} {fmt(v)} ms" for k, v in report.single_sentence_p50_ms.items())
    lines = [
        "Per-sentence cosine to the fp32 vectors (the fp32 server's for the servers, the in-process "
        f"Encoder fp32's for the in-process contenders): {cosines}.",
        "",
    ]
    if p50:
        lines += [
            f"One-sentence p50 through each idle server, the servers taking turns sentence by sentence: {p50}.",
            "",
        ]
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
    roof = [*roofline_markdown(report.roofline), ""] if report.roofline is not None else []
    lines = [
        f"Compare: model {report.model_dir}, {report.sentences} sentences, max_seq_len {report.max_seq_len}, "
        f"median of {report.repeats} repeats (round-robin). Servers: 1 worker; bulk client sends requests of "
        f"{report.bulk_request}; in-process batch size {report.batch_size or 'the Encoder default'}.",
        "",
        f"CPU: {describe_cpu(report.environment)}.",
        "",
        *throughput_markdown(report.throughput),
        "",
        *roof,
        *accuracy_text(report),
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
