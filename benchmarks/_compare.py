"""``suite.py compare``: the server, the in-process Encoder and sentence-transformers side by
side, in rounds that take turns, with the targets table (``_compare_report.py``) and the
latency under load (``_compare_latency.py``)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from _compare_latency import LatencyRepeat, describe_latency_repeat, latency_repeat, summarize_latency
from _compare_report import (
    CLIENTS_MERGE,
    CLIENTS_NO_MERGE,
    SERVER_BF16,
    SERVER_FP32,
    SERVER_NO_MERGE,
    CompareReport,
    StartupResult,
    Timed,
    compute_targets,
    throughput_rows,
)
from lib.contenders import NO_ST_HINT, Contender, encoder_contender, st_contender
from lib.inputs import describe_corpus, read_corpus
from lib.load import Load, run_load
from lib.report import Progress, environment
from lib.servers import BenchmarkError, ServerOptions, ServerPool, ServerProcess, WorkCounters
from lib.stats import clean, median, ratio


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
        state.latency.append(
            latency_repeat(
                servers[SERVER_FP32], settings.corpus, bulk_request=settings.bulk_request,
                idle_requests=settings.idle_requests, latency_duration=settings.latency_duration,
            )
        )  # fmt: skip
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
    median_cold, median_warm = median(cold), median(warm)
    return StartupResult(
        cold_seconds=[round(s, 2) for s in cold],
        warm_seconds=[round(s, 2) for s in warm],
        median_cold_seconds=clean(median_cold),
        median_warm_seconds=clean(median_warm),
        warm_to_cold=clean(ratio(median_warm, median_cold)),
    )


def compare_settings(args: argparse.Namespace, model_dir: Path | None) -> CompareSettings:
    return CompareSettings(
        corpus=read_corpus(args.corpus, args.limit),
        base=ServerOptions(model_dir=model_dir, graph_dir=args.graph_dir, max_seq_len=str(args.max_seq_len)),
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
        state.timed[name].note = f"worker busy {median(busy):.0%} of the time"
    rows = throughput_rows(list(state.timed.values()))
    latency = summarize_latency(state.latency)
    padding = {name: clean(median(values)) for name, values in state.padding.items()}
    fp32_padding = median(state.padding.get(SERVER_FP32, []))
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
