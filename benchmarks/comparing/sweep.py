"""``suite.py sweep``: one parameter varied at a time from a base configuration."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from lib.inputs import read_corpus
from lib.report import Progress, environment, format_load, pyplot
from lib.stats import Percentiles, clean, fmt

from comparing.load import Load, run_load, warm_up_server
from comparing.servers import ServerOptions, ServerPool, ServerProcess, WorkCounters


@dataclass(frozen=True)
class SweepParameter:
    name: str
    label: str
    side: Literal["client", "server"]
    values: tuple[str, ...]
    quick_values: tuple[str, ...]


SWEEP_PARAMETERS = (
    SweepParameter("client-batch", "sentences per request", "client", ("1", "16", "256", "4096"), ("1", "16")),
    SweepParameter("clients", "concurrent clients", "client", ("1", "4", "16", "64"), ("1", "4")),
    SweepParameter("max-seq-len", "max_seq_len", "server", ("32", "64", "128", "NONE"), ("16", "32")),
    SweepParameter("max-batch-size", "max_batch_size", "server", ("32", "128", "256", "512"), ("32", "256")),
    SweepParameter("pooling-layer", "pooling_layer", "server", ("-1", "-2", "-4"), ("-1", "-2")),
    SweepParameter("dtype", "dtype", "server", ("fp32", "bf16", "fp16"), ("fp32", "bf16")),
    SweepParameter("num-worker", "worker processes", "server", ("1", "2"), ("1", "2")),
)
QUICK_PARAMETERS = ("client-batch", "clients", "dtype")


@dataclass
class SweepPoint:
    """One measured point: the parameter, its value, the load and what it gave."""

    parameter: str
    value: str
    is_base: bool
    load: str
    clients: int
    client_batch: int
    requests: int
    sentences: int
    seconds: float
    sentences_per_second: float
    latency_ms: Percentiles
    padding_fraction: float | None
    worker_busy_fraction: float | None
    peak_rss_mib: float
    server_ready_seconds: float
    server: dict[str, Any]
    errors: list[str]


@dataclass
class SweepReport:
    kind: str
    model_dir: str
    duration_s: float
    quick: bool
    base_server: dict[str, Any]
    client_base_load: str
    server_load: str
    points: list[SweepPoint]
    load_average: dict[str, list[float]]
    elapsed_s: float
    environment: dict[str, Any]


@dataclass
class SweepSettings:
    base: ServerOptions
    client_load: Load
    server_load: Load
    duration: float
    quick: bool
    parameters: list[SweepParameter]
    corpus: list[str]


def sweep_values(parameter: SweepParameter, settings: SweepSettings) -> list[str]:
    """The values to run, the base value included (first if it was not in the list)."""
    values = list(parameter.quick_values if settings.quick else parameter.values)
    base = base_value(parameter, settings)
    return values if base in values else [base, *values]


def base_value(parameter: SweepParameter, settings: SweepSettings) -> str:
    if parameter.name == "clients":
        return str(settings.client_load.clients)
    if parameter.name == "client-batch":
        return str(settings.client_load.batch)
    return str(getattr(settings.base, parameter.name.replace("-", "_")))


def measure_point(
    server: ServerProcess, parameter: SweepParameter, value: str, load: Load, settings: SweepSettings
) -> SweepPoint:
    snapshot: list[WorkCounters] = []

    def at_start() -> None:  # the clients' warmup requests are done and left out
        snapshot.append(server.counters())
        server.rss.reset_serving_peak()

    result = run_load(server, load, settings.corpus, settings.duration, at_start)
    window = server.counters() - snapshot[0]
    return SweepPoint(
        parameter=parameter.name,
        value=value,
        is_base=value == base_value(parameter, settings),
        load=str(load),
        clients=load.clients,
        client_batch=load.batch,
        requests=result.requests,
        sentences=result.sentences,
        seconds=result.seconds,
        sentences_per_second=result.sentences_per_second,
        latency_ms=result.latency_ms,
        padding_fraction=clean(window.padding_fraction),
        worker_busy_fraction=clean(window.busy_seconds / server.options.num_worker / result.seconds),
        peak_rss_mib=round(server.rss.serving_peak_mib, 1),
        server_ready_seconds=round(server.ready_seconds, 2),
        server=server.options.describe(),
        errors=result.errors,
    )


def describe_point(point: SweepPoint) -> str:
    lat = point.latency_ms
    return (
        f"{point.sentences_per_second:8.1f} sentences/s, p50 {lat.p50:.1f} ms, p99 {lat.p99:.1f} ms, "
        f"{point.requests} requests"
    )


def sweep_client_side(server: ServerProcess, settings: SweepSettings, progress: Progress) -> list[SweepPoint]:
    """Client-side parameters: the base server, the client load varied."""
    points: list[SweepPoint] = []
    for parameter in (p for p in settings.parameters if p.side == "client"):
        for value in sweep_values(parameter, settings):
            load = settings.client_load.with_value(parameter.name, value)
            progress(f"sweep {parameter.name}={value}: {load} sentences")
            points.append(measure_point(server, parameter, value, load, settings))
            progress(f"  {describe_point(points[-1])}")
    return points


def sweep_server_side(
    pool: ServerPool, base: ServerProcess, settings: SweepSettings, progress: Progress
) -> list[SweepPoint]:
    """Server-side parameters: a server per point (the graph cache is shared), the same load.
    The base point of each parameter is measured on the base server, just before the others."""
    points: list[SweepPoint] = []
    for parameter in (p for p in settings.parameters if p.side == "server"):
        for value in sweep_values(parameter, settings):
            options = settings.base.with_value(parameter.name, value)
            progress(f"sweep {parameter.name}={value}: load {settings.server_load}")
            if options == settings.base:
                points.append(measure_point(base, parameter, value, settings.server_load, settings))
            else:
                with pool.running((f"{parameter.name}={value}", options)) as (server,):
                    warm_up_server(server, settings.corpus)
                    points.append(measure_point(server, parameter, value, settings.server_load, settings))
            progress(f"  {describe_point(points[-1])}")
    return points


def sweep_markdown(report: SweepReport) -> str:
    lines = [
        f"Sweep: model {report.model_dir}, {report.duration_s:g} s per point. Base server: "
        f"max_seq_len {report.base_server['max_seq_len']}, {report.base_server['dtype']}, "
        f"{report.base_server['num_worker']} worker, max_batch_size {report.base_server['max_batch_size']}, "
        f"pooling_layer {report.base_server['pooling_layer']}. Client-side sweeps start from "
        f"{report.client_base_load} (clients x sentences); server-side sweeps run {report.server_load}. "
        f"Base points are marked *.",
        "",
        "| parameter | value | clients x sentences | sentences/s | p50 ms | p90 ms | p99 ms | requests "
        "| padding | workers busy | peak RSS MiB |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in report.points:
        padding = fmt(p.padding_fraction, 3)
        busy = "n/a" if p.worker_busy_fraction is None else f"{p.worker_busy_fraction:.0%}"
        mark = "*" if p.is_base else ""
        lines.append(
            f"| {p.parameter} | {p.value}{mark} | {p.load} | {p.sentences_per_second:.1f} | {p.latency_ms.p50:.1f} "
            f"| {p.latency_ms.p90:.1f} | {p.latency_ms.p99:.1f} | {p.requests} | {padding} | {busy} "
            f"| {p.peak_rss_mib:.0f} |"
        )
    errors = [e for p in report.points for e in p.errors]
    if errors:
        lines += ["", f"{len(errors)} client error(s), first: {errors[0]}"]
    before, after = (format_load(report.load_average[k]) for k in ("before", "after"))
    lines += ["", f"load average (1/5/15 min): {before} before, {after} after; {report.elapsed_s:.0f} s in all"]
    return "\n".join(lines)


def run_sweep(args: argparse.Namespace, model_dir: Path | None, progress: Progress) -> SweepReport:
    settings = SweepSettings(
        base=base_options(args, model_dir),
        client_load=Load.parse(args.client_load),
        server_load=Load.parse(args.server_load),
        duration=args.duration,
        quick=args.quick,
        parameters=selected_parameters(args),
        corpus=read_corpus(args.corpus),
    )
    load_before = os.getloadavg()
    with ExitStack() as stack:
        pool = ServerPool(stack, progress)
        with pool.running(("base", settings.base)) as (base,):
            warm_up_server(base, settings.corpus)
            points = sweep_client_side(base, settings, progress)
            points += sweep_server_side(pool, base, settings, progress)
    return SweepReport(
        kind="sweep",
        model_dir=str(model_dir or "all-MiniLM-L6-v2 (server default)"),
        duration_s=settings.duration,
        quick=settings.quick,
        base_server=settings.base.describe(),
        client_base_load=str(settings.client_load),
        server_load=str(settings.server_load),
        points=points,
        load_average={"before": list(load_before), "after": list(os.getloadavg())},
        elapsed_s=round(progress.elapsed(), 1),
        environment=environment(),
    )


def selected_parameters(args: argparse.Namespace) -> list[SweepParameter]:
    names = args.only or (QUICK_PARAMETERS if args.quick else [p.name for p in SWEEP_PARAMETERS])
    return [p for p in SWEEP_PARAMETERS if p.name in names]


def base_options(args: argparse.Namespace, model_dir: Path | None) -> ServerOptions:
    return ServerOptions(model_dir=model_dir, graph_dir=args.graph_dir, max_seq_len=str(args.max_seq_len))


def panel_title(parameter: SweepParameter, point: SweepPoint) -> str:
    if parameter.name == "client-batch":
        return f"{parameter.label}, {point.clients} client(s)"
    if parameter.name == "clients":
        return f"{parameter.label}, {point.client_batch} sentences a request"
    return f"{parameter.label}, load {point.clients} clients x {point.client_batch}"


def _sweep_panel(ax: Any, parameter: SweepParameter, points: Sequence[SweepPoint]) -> None:
    """Throughput bars (the base value darker) with p50 and p99 latency on a second axis."""
    x = np.arange(len(points))
    colors = ["#1f5fa8" if p.is_base else "#8fb4de" for p in points]
    bars = ax.bar(x, [p.sentences_per_second for p in points], color=colors, width=0.6)
    ax.bar_label(bars, fmt="%.0f", fontsize="small")
    ax.set_xticks(x, [p.value + (" (base)" if p.is_base else "") for p in points])
    ax.set_xlabel(parameter.name)
    ax.set_ylabel("sentences / s (bars)")
    ax.set_title(panel_title(parameter, points[0]), fontsize="medium")
    latency_ax = ax.twinx()
    p50 = [p.latency_ms.p50 for p in points]
    p99 = [p.latency_ms.p99 for p in points]
    latency_ax.plot(x, p50, "o-", color="#d9822b", label="p50 latency")
    latency_ax.plot(x, p99, "s--", color="#b22222", label="p99 latency")
    positive = [v for v in p50 + p99 if v > 0 and not math.isnan(v)]
    if positive and max(positive) / min(positive) > 30:
        latency_ax.set_yscale("log")
    else:
        latency_ax.set_ylim(bottom=0)
    latency_ax.set_ylabel("request latency, ms (lines)")
    latency_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2, fontsize="small", frameon=False)


def plot_sweep(report: SweepReport, directory: Path) -> list[Path]:
    """``sweep.png`` (every panel) and ``sweep_<parameter>.png`` (one each)."""
    plt = pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    by_parameter = {p.name: [pt for pt in report.points if pt.parameter == p.name] for p in SWEEP_PARAMETERS}
    panels = [(p, by_parameter[p.name]) for p in SWEEP_PARAMETERS if by_parameter[p.name]]
    written = []
    for parameter, points in panels:
        fig, ax = plt.subplots(figsize=(5, 3.6), layout="constrained")
        _sweep_panel(ax, parameter, points)
        written.append(directory / f"sweep_{parameter.name}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    columns = min(4, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.8 * rows), squeeze=False, layout="constrained")
    for ax, (parameter, points) in zip(axes.flat, panels, strict=False):
        _sweep_panel(ax, parameter, points)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(
        f"bertserve sweep: throughput (bars, base darker) and request latency (lines), {report.duration_s:g} s a point"
    )
    written.append(directory / "sweep.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written
