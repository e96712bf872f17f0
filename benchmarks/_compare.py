"""``suite.py compare``: the server, the in-process Encoder and sentence-transformers side by
side, with the targets table."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    NO_ST_HINT,
    ST_NAME,
    Contender,
    describe_corpus,
    encoder_contender,
    environment,
    format_load,
    read_corpus,
    st_contender,
)
from _harness import (
    JOB_POLL_S,
    BenchmarkError,
    Load,
    Percentiles,
    Progress,
    ServerOptions,
    ServerPool,
    ServerProcess,
    WorkCounters,
    clean,
    cycle_take,
    fmt,
    median_or_nan,
    milliseconds,
    percentile_ms,
    pyplot,
    ratio,
    run_load,
)
from _sweep import base_options
from bertserve.client import BertClient

SERVER_FP32, SERVER_BF16 = "server fp32", "server bf16"
SERVER_NO_MERGE = "server fp32 no-merge"
CLIENTS_MERGE, CLIENTS_NO_MERGE = "single-sentence clients, merging on", "single-sentence clients, merging off"


@dataclass
class CompareSettings:
    corpus: list[str]
    base: ServerOptions
    repeats: int
    duration: float
    latency_duration: float
    idle_requests: int
    start_repeats: int
    clients: int
    bulk_request: int
    batch_size: int | None
    max_seq_len: int
    sentence_transformers: bool
    model_dir: Path | None
    st_targets: tuple[float, float] = (1.5, 3.0)  # server fp32 and bf16 / sentence-transformers


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
class LatencyRepeat:
    idle_ms: list[float]
    load_ms: list[float]
    bulk_job_seconds: float
    bulk_job_max_seconds: float
    bulk_jobs: int
    status_median_job_seconds: float
    status_median_job_sentences: float
    status_bulk_median_job_seconds: float
    loader_requests: int


@dataclass
class LatencyResult:
    idle: Percentiles
    under_load: Percentiles
    idle_requests: int
    load_requests: int
    bulk_job_seconds: float | None
    bulk_job_source: str
    window_bulk_job_seconds: float | None
    bulk_job_max_seconds: float | None
    status_median_job_seconds: float | None
    status_median_job_sentences: float | None
    limit_ms: float | None
    per_repeat: list[dict[str, Any]]


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


class BulkLoader:
    """A client in a thread that keeps a server busy with large requests until the block ends."""

    def __init__(self, server: ServerProcess, texts: list[str]) -> None:
        self.server = server
        self.texts = texts
        self.first_reply = threading.Event()
        self.requests = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bulk-loader", daemon=True)

    def __enter__(self) -> BulkLoader:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self._stop.set()
        if exc_type is None:
            self._thread.join()  # its last request finishes first; an interrupted run does not wait

    def _run(self) -> None:
        try:
            with self.server.client() as client:
                while not self._stop.is_set():
                    client.encode(self.texts)
                    self.requests += 1
                    self.first_reply.set()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self.first_reply.set()


def single_sentence_latencies(
    client: BertClient, corpus: Sequence[str], *, count: int | None = None, duration: float | None = None
) -> list[float]:
    """Seconds per request for one-sentence requests sent back to back (``count`` of them, or
    for ``duration`` seconds)."""
    latencies: list[float] = []
    deadline = time.perf_counter() + duration if duration is not None else math.inf
    index = 0
    while (count is None or index < count) and time.perf_counter() < deadline:
        sentence = corpus[(index * 131) % len(corpus)]
        started = time.perf_counter()
        client.encode([sentence])
        latencies.append(time.perf_counter() - started)
        index += 1
    return latencies


def job_times_until(server: ServerProcess, done: threading.Event) -> list[float]:
    """Run time of each job the workers finish until ``done`` is set, from ``server_status``
    polled every ``JOB_POLL_S`` (jobs finishing between two polls share their busy time)."""
    last = server.counters()
    times: list[float] = []
    while True:
        stop = done.wait(JOB_POLL_S)
        now = server.counters()
        finished = now.jobs - last.jobs
        if finished > 0:
            times += [(now.busy_seconds - last.busy_seconds) / finished] * finished
            last = now
        if stop:
            return times


def latency_repeat(server: ServerProcess, settings: CompareSettings) -> LatencyRepeat:
    """Idle single-sentence latency, then a bulk-only window (the bulk jobs' run times), then
    single sentences while the bulk client keeps the server saturated."""
    bulk_texts = cycle_take(settings.corpus, 0, settings.bulk_request)
    with server.client() as single:
        idle = single_sentence_latencies(single, settings.corpus, count=settings.idle_requests)
        with BulkLoader(server, bulk_texts) as loader:
            bulk_jobs = job_times_until(server, loader.first_reply)  # only the loader's jobs run now
            loaded = single_sentence_latencies(single, settings.corpus, duration=settings.latency_duration)
            recent = server.status().get("recent_jobs", {})
        if loader.error:
            raise BenchmarkError(f"the bulk client failed: {loader.error}")
    return LatencyRepeat(
        idle_ms=[round(s * 1000, 3) for s in idle],
        load_ms=[round(s * 1000, 3) for s in loaded],
        bulk_job_seconds=median_or_nan(bulk_jobs),
        bulk_job_max_seconds=max(bulk_jobs, default=math.nan),
        bulk_jobs=len(bulk_jobs),
        status_median_job_seconds=float(recent.get("median_seconds", math.nan)),
        status_median_job_sentences=float(recent.get("median_sentences", math.nan)),
        status_bulk_median_job_seconds=status_bulk_median(recent),
        loader_requests=loader.requests,
    )


def status_bulk_median(recent_jobs: dict[str, Any]) -> float:
    """``recent_jobs["bulk_median_seconds"]``, NaN when the server has no such field or no bulk job yet."""
    if not recent_jobs.get("bulk_count"):
        return math.nan
    return float(recent_jobs.get("bulk_median_seconds", math.nan))


def summarize_latency(repeats: Sequence[LatencyRepeat]) -> LatencyResult:
    """Percentiles over the requests of all repeats pooled; job times as medians of the repeats."""
    idle = [ms / 1000 for r in repeats for ms in r.idle_ms]
    loaded = [ms / 1000 for r in repeats for ms in r.load_ms]
    idle_p = Percentiles.of(idle)
    status_bulk = median_or_nan([r.status_bulk_median_job_seconds for r in repeats])
    window_bulk = median_or_nan([r.bulk_job_seconds for r in repeats])
    from_status = not math.isnan(status_bulk)  # the server's own figure when it has one
    bulk_job = status_bulk if from_status else window_bulk
    bulk_job_max = max((r.bulk_job_max_seconds for r in repeats), default=math.nan)
    limit = idle_p.p50 + 1.5 * bulk_job * 1000
    return LatencyResult(
        idle=idle_p,
        under_load=Percentiles.of(loaded),
        idle_requests=len(idle),
        load_requests=len(loaded),
        bulk_job_seconds=clean(bulk_job),
        bulk_job_source="server_status recent_jobs bulk_median_seconds" if from_status else "bulk-only window",
        window_bulk_job_seconds=clean(window_bulk),
        bulk_job_max_seconds=clean(bulk_job_max),
        status_median_job_seconds=clean(median_or_nan([r.status_median_job_seconds for r in repeats])),
        status_median_job_sentences=clean(median_or_nan([r.status_median_job_sentences for r in repeats])),
        limit_ms=clean(limit),
        per_repeat=[
            {
                "idle_p50_ms": percentile_ms([x / 1000 for x in r.idle_ms], 50),
                "load_p50_ms": percentile_ms([x / 1000 for x in r.load_ms], 50),
                "load_p99_ms": percentile_ms([x / 1000 for x in r.load_ms], 99),
                "load_requests": len(r.load_ms),
                "bulk_job_seconds": clean(r.bulk_job_seconds),
                "bulk_job_max_seconds": clean(r.bulk_job_max_seconds),
                "bulk_jobs": r.bulk_jobs,
                "status_median_job_seconds": clean(r.status_median_job_seconds),
                "status_median_job_sentences": clean(r.status_median_job_sentences),
                "status_bulk_median_job_seconds": clean(r.status_bulk_median_job_seconds),
                "loader_requests": r.loader_requests,
            }
            for r in repeats
        ],
    )


def time_bulk(server: ServerProcess, corpus: list[str], size: int) -> tuple[float, WorkCounters]:
    """The whole corpus from one client in requests of ``size``: seconds and the workers' counters."""
    before = server.counters()
    with server.client() as client:
        started = time.perf_counter()
        for start in range(0, len(corpus), size):
            client.encode(corpus[start : start + size])
        elapsed = time.perf_counter() - started
    return elapsed, server.counters() - before


def time_contender(contender: Contender, corpus: list[str]) -> float:
    started = time.perf_counter()
    contender.encode(corpus)
    return time.perf_counter() - started


def build_in_process(settings: CompareSettings, model_dir: Path) -> tuple[list[Contender], str | None]:
    """Encoder fp32 and bf16 with the servers' options, and sentence-transformers (with the
    Encoder's batch size) if wanted."""
    contenders = [
        encoder_contender(
            model_dir, dtype, max_seq_len=settings.max_seq_len, batch_size=settings.batch_size,
            graph_dir=settings.base.graph_dir,
        )
        for dtype in ("fp32", "bf16")
    ]  # fmt: skip
    if not settings.sentence_transformers:
        return contenders, "sentence-transformers skipped (--no-sentence-transformers)"
    batch_size = settings.batch_size or contenders[0].batch_size or 64
    st = st_contender(model_dir, max_seq_len=settings.max_seq_len, batch_size=batch_size)
    return ([*contenders, st], None) if st is not None else (contenders, NO_ST_HINT)


@dataclass
class CompareState:
    """Everything the rounds of ``compare`` collect."""

    timed: dict[str, Timed]
    padding: dict[str, list[float]] = field(default_factory=dict)
    busy: dict[str, list[float]] = field(default_factory=dict)  # the workers' busy time / wall time
    latency: list[LatencyRepeat] = field(default_factory=list)
    first_bulk_status_padding: float | None = None


def bulk_round(
    servers: dict[str, ServerProcess],
    contenders: Sequence[Contender],
    state: CompareState,
    settings: CompareSettings,
    report: Callable[[str], None],
) -> None:
    """One turn of every bulk contender over the whole corpus."""
    corpus = settings.corpus
    for name in (SERVER_FP32, SERVER_BF16):
        seconds, window = time_bulk(servers[name], corpus, settings.bulk_request)
        state.timed[name].rates.append(len(corpus) / seconds)
        state.padding.setdefault(name, []).append(window.padding_fraction)
        state.busy.setdefault(name, []).append(window.busy_seconds / seconds)
        if state.first_bulk_status_padding is None and name == SERVER_FP32:
            state.first_bulk_status_padding = servers[name].status().get("padding_fraction")
        report(f"  {name}: {len(corpus) / seconds:.1f} sentences/s, padding {window.padding_fraction:.3f}")
    for contender in contenders:
        seconds = time_contender(contender, corpus)
        state.timed[contender.name].rates.append(len(corpus) / seconds)
        report(f"  {contender.name}: {len(corpus) / seconds:.1f} sentences/s")


def clients_round(
    servers: dict[str, ServerProcess],
    state: CompareState,
    settings: CompareSettings,
    duration: float,
    report: Callable[[str], None],
) -> None:
    """The single-sentence clients against the merging server, then the non-merging one."""
    load = Load(settings.clients, 1)
    for name, server in ((CLIENTS_MERGE, servers[SERVER_FP32]), (CLIENTS_NO_MERGE, servers[SERVER_NO_MERGE])):
        result = run_load(server, load, settings.corpus, duration)
        if result.errors:
            raise BenchmarkError(f"{name}: {result.errors[0]}")
        state.timed[name].rates.append(result.sentences_per_second)
        report(
            f"  {name}: {result.sentences_per_second:.1f} sentences/s, p50 {result.latency_ms.p50:.1f} ms, "
            f"p99 {result.latency_ms.p99:.1f} ms"
        )


def describe_latency_repeat(repeat: LatencyRepeat) -> str:
    idle_p50 = percentile_ms([x / 1000 for x in repeat.idle_ms], 50)
    load_p99 = percentile_ms([x / 1000 for x in repeat.load_ms], 99)
    return (
        f"  idle p50 {idle_p50:.1f} ms, under load p99 {load_p99:.1f} ms ({len(repeat.load_ms)} requests), "
        f"bulk job median {repeat.bulk_job_seconds * 1000:.0f} ms, max {repeat.bulk_job_max_seconds * 1000:.0f} ms"
    )


def run_rounds(
    servers: dict[str, ServerProcess],
    contenders: Sequence[Contender],
    state: CompareState,
    settings: CompareSettings,
    progress: Progress,
) -> None:
    """One untimed warmup turn, then ``repeats`` timed turns of everything, round-robin."""
    progress("warmup: one untimed turn of every contender")
    warm = CompareState(timed={name: Timed(name, "") for name in state.timed})
    bulk_round(servers, contenders, warm, settings, progress)
    state.first_bulk_status_padding = warm.first_bulk_status_padding  # the fp32 server's very first jobs
    clients_round(servers, warm, settings, min(2.0, settings.duration), progress)
    for repeat in range(1, settings.repeats + 1):
        step = f"repeat {repeat}/{settings.repeats}:"
        progress(f"{step} the whole corpus per contender")
        bulk_round(servers, contenders, state, settings, progress)
        progress(f"{step} {settings.clients} clients x 1 sentence, {settings.duration:g} s each")
        clients_round(servers, state, settings, settings.duration, progress)
        progress(f"{step} latency, idle then under a {settings.bulk_request}-sentence load")
        state.latency.append(latency_repeat(servers[SERVER_FP32], settings))
        progress(describe_latency_repeat(state.latency[-1]))


def measure_startup(pool: ServerPool, settings: CompareSettings, progress: Progress) -> StartupResult:
    """Time to ready: a cold start (empty graph cache) then a warm start on the same cache."""
    cold: list[float] = []
    warm: list[float] = []
    for attempt in range(1, settings.start_repeats + 1):
        graph_dir = Path(tempfile.mkdtemp(prefix="bertserve-bench-graphs-"))
        try:
            for kind, times in (("cold", cold), ("warm", warm)):
                options = replace(settings.base, graph_dir=graph_dir)
                with pool.running((f"{kind} start {attempt}", options)) as (server,):
                    times.append(server.ready_seconds)
                progress(f"{kind} start {attempt}/{settings.start_repeats}: ready in {times[-1]:.1f} s")
        finally:
            shutil.rmtree(graph_dir, ignore_errors=True)
    median_cold, median_warm = median_or_nan(cold), median_or_nan(warm)
    return StartupResult(
        cold_seconds=[round(s, 2) for s in cold],
        warm_seconds=[round(s, 2) for s in warm],
        median_cold_seconds=clean(median_cold),
        median_warm_seconds=clean(median_warm),
        warm_to_cold=clean(ratio(median_warm, median_cold)),
    )


def throughput_rows(timed: Sequence[Timed]) -> list[ThroughputRow]:
    medians = {t.name: median_or_nan(t.rates) for t in timed}
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


def compare_settings(args: argparse.Namespace, model_dir: Path | None) -> CompareSettings:
    return CompareSettings(
        corpus=read_corpus(args.corpus, args.limit),
        base=base_options(args, model_dir),
        repeats=args.repeats,
        duration=args.duration,
        latency_duration=args.latency_duration,
        idle_requests=args.idle_requests,
        start_repeats=args.start_repeats,
        clients=args.clients,
        bulk_request=args.bulk_request,
        batch_size=args.batch_size,
        max_seq_len=args.max_seq_len,
        sentence_transformers=not args.no_sentence_transformers,
        model_dir=model_dir,
        st_targets=args.st_targets,
    )


def initial_timed(contenders: Sequence[Contender], settings: CompareSettings) -> dict[str, Timed]:
    request = f"1 client, requests of {settings.bulk_request}"
    timed = [
        Timed(SERVER_FP32, f"end to end, {request}"),
        Timed(SERVER_BF16, f"end to end, {request}"),
        *(Timed(c.name, "in-process", note=f"{c.note}, setup {c.setup_seconds:.1f} s") for c in contenders),
        Timed(CLIENTS_MERGE, f"{settings.clients} clients x 1 sentence, fp32"),
        Timed(CLIENTS_NO_MERGE, f"{settings.clients} clients x 1 sentence, fp32, --merge-requests false"),
    ]
    return {t.name: t for t in timed}


def run_compare(args: argparse.Namespace, model_dir: Path, progress: Progress) -> CompareReport:
    settings = compare_settings(args, model_dir)
    print(describe_corpus(args.corpus, settings.corpus), file=sys.stderr)
    named = (
        (SERVER_FP32, settings.base),
        (SERVER_BF16, replace(settings.base, dtype="bf16")),
        (SERVER_NO_MERGE, replace(settings.base, merge_requests=False)),
    )
    with ExitStack() as stack:
        pool = ServerPool(stack, progress)
        progress("starting the servers: fp32, bf16, fp32 without merging")
        with pool.running(*named) as started:
            servers = {s.name: s for s in started}
            progress("building the in-process contenders")
            contenders, skipped = build_in_process(settings, model_dir)
            state = CompareState(timed=initial_timed(contenders, settings))
            load_before = os.getloadavg()
            run_rounds(servers, contenders, state, settings, progress)
            load_after = os.getloadavg()
        memory = {s.name: {"serving": round(s.rss.serving_peak_mib, 1), "startup": round(s.rss.startup_peak_mib, 1)}
                  for s in started}  # fmt: skip
        progress("time to ready: cold and warm starts")
        startup = measure_startup(pool, settings, progress)
    for name, busy in state.busy.items():
        state.timed[name].note = f"worker busy {median_or_nan(busy):.0%} of the time"
    rows = throughput_rows(list(state.timed.values()))
    latency = summarize_latency(state.latency)
    padding = {name: clean(median_or_nan(values)) for name, values in state.padding.items()}
    fp32_padding = median_or_nan(state.padding.get(SERVER_FP32, []))
    return CompareReport(
        kind="compare",
        model_dir=str(model_dir),
        sentences=len(settings.corpus),
        repeats=settings.repeats,
        max_seq_len=settings.max_seq_len,
        batch_size=settings.batch_size,
        bulk_request=settings.bulk_request,
        clients=settings.clients,
        duration_s=settings.duration,
        throughput=rows,
        latency=latency,
        padding_fraction=padding,
        status_padding_fraction_after_first_bulk=state.first_bulk_status_padding,
        peak_rss_mib=memory,
        startup=startup,
        targets=compute_targets(rows, latency, fp32_padding, startup, settings.st_targets),
        skipped=skipped,
        load_average={"before": list(load_before), "after": list(load_after)},
        elapsed_s=round(progress.elapsed(), 1),
        environment=environment(),
    )


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
    for row_y, median, row in zip(y, medians, rows, strict=True):
        ax_tp.text(max([median, *row.runs]) * 1.02, row_y, f"{median:.0f}", va="center", fontsize="small")
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
