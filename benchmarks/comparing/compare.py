"""``suite.py compare``: the server, the in-process Encoder, sentence-transformers and ONNX
Runtime side by side, in rounds that take turns, with the machine's matmul ceiling
(``roofline``), the targets (``targets``), the report (``report``) and the latency under
load (``latency``)."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from lib.contenders import NO_ST_HINT, Contender, encoder_contender, st_contender
from lib.inputs import describe_corpus, mean_tokens, read_corpus
from lib.report import Progress, cpu_flags, describe_cpu, environment, int8_units, native_bf16
from lib.stats import clean, cosine_rows, fmt, median, percentile_ms, ratio

from comparing.latency import (
    LatencyRepeat,
    describe_latency_repeat,
    latency_repeat,
    single_sentence_turns,
    summarize_latency,
)
from comparing.load import Load, run_load
from comparing.onnx_contenders import onnx_contenders
from comparing.report import CompareReport, StartupResult, Timed, throughput_rows
from comparing.roofline import Roofline, RooflineRun, Shapes
from comparing.servers import BenchmarkError, ServerOptions, ServerPool, ServerProcess, WorkCounters
from comparing.targets import (
    CLIENTS_MERGE,
    CLIENTS_NO_MERGE,
    ENCODER_FP32,
    SERVER_AUTO,
    SERVER_BF16,
    SERVER_FP32,
    SERVER_INT8,
    SERVER_NO_MERGE,
    TargetInputs,
    compute_targets,
)

BULK_SERVERS = (SERVER_FP32, SERVER_BF16, SERVER_INT8, SERVER_AUTO)
THREADS = 2  # what every contender computes with: the server's worker, the Encoder, torch, ONNX Runtime


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
    onnx: bool = True
    roofline: bool = True
    roofline_tokens: int = 1536  # T of the timed products: a bulk batch, 64 sentences x 24 tokens
    roofline_repeats: int = 10
    native_bf16: bool = False  # the CPU multiplies bf16 natively, so --dtype auto means bf16


def time_bulk(server: ServerProcess, corpus: list[str], size: int) -> tuple[float, WorkCounters, np.ndarray]:
    """The whole corpus from one client in requests of ``size``: seconds, the workers'
    counters, and the vectors."""
    before = server.counters()
    parts = []
    with server.client() as client:
        started = time.perf_counter()
        for start in range(0, len(corpus), size):
            parts.append(client.encode(corpus[start : start + size]))
        elapsed = time.perf_counter() - started
    return elapsed, server.counters() - before, np.concatenate([np.asarray(p) for p in parts])


def time_contender(contender: Contender, corpus: list[str]) -> float:
    started = time.perf_counter()
    contender.vectors = contender.encode(corpus)
    return time.perf_counter() - started


def build_in_process(settings: CompareSettings, model_dir: Path) -> tuple[list[Contender], list[str]]:
    """Encoder fp32, bf16 (and int8 where the Encoder has it) with the servers' options,
    sentence-transformers and ONNX Runtime fp32 and int8 (with the Encoder's batch size) if
    wanted; and a line for each contender left out."""

    def encoder(dtype: str) -> Contender:
        return encoder_contender(
            model_dir,
            dtype,
            max_seq_len=settings.max_seq_len,
            batch_size=settings.batch_size,
            graph_dir=settings.base.graph_dir,
        )

    contenders = [encoder("fp32"), encoder("bf16")]
    skipped: list[str] = []
    try:
        contenders.append(encoder("int8"))
    except Exception as exc:  # an Encoder without int8 yet
        skipped.append(f"Encoder int8 left out: {type(exc).__name__}: {str(exc)[:200]}")
    batch_size = settings.batch_size or contenders[0].batch_size or 64
    if not settings.sentence_transformers:
        skipped.append("sentence-transformers skipped (--no-sentence-transformers)")
    else:
        st = st_contender(model_dir, max_seq_len=settings.max_seq_len, batch_size=batch_size)
        contenders += [st] if st is not None else []
        skipped += [NO_ST_HINT] if st is None else []
    if not settings.onnx:
        skipped.append("ONNX Runtime skipped (--no-onnx)")
    else:
        onnx, why = onnx_contenders(model_dir, max_seq_len=settings.max_seq_len, batch_size=batch_size)
        contenders += onnx
        skipped += [why] if why else []
    return contenders, skipped


@dataclass
class CompareState:
    """Everything the rounds of ``compare`` collect."""

    timed: dict[str, Timed]
    padding: dict[str, list[float]] = field(default_factory=dict)
    busy: dict[str, list[float]] = field(default_factory=dict)  # the workers' busy time / wall time
    latency: list[LatencyRepeat] = field(default_factory=list)
    first_bulk_status_padding: float | None = None
    vectors: dict[str, np.ndarray] = field(default_factory=dict)  # the last bulk run's, per server
    single: dict[str, list[float]] = field(default_factory=dict)  # one-sentence seconds, idle, per server


def bulk_round(
    servers: dict[str, ServerProcess],
    contenders: Sequence[Contender],
    state: CompareState,
    settings: CompareSettings,
    report: Callable[[str], None],
) -> None:
    """One turn of every bulk contender over the whole corpus."""
    corpus = settings.corpus
    for name in (n for n in BULK_SERVERS if n in servers):
        seconds, window, state.vectors[name] = time_bulk(servers[name], corpus, settings.bulk_request)
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
        bulk = {name: servers[name] for name in BULK_SERVERS if name in servers}
        progress(f"{step} {settings.idle_requests} single sentences to each idle server, in turns")
        for name, seconds in single_sentence_turns(bulk, settings.corpus, settings.idle_requests).items():
            state.single.setdefault(name, []).extend(seconds)
        progress(f"{step} {settings.clients} clients x 1 sentence, {settings.duration:g} s each")
        clients_round(servers, state, settings, settings.duration, progress)
        progress(f"{step} latency, idle then under a {settings.bulk_request}-sentence load")
        state.latency.append(
            latency_repeat(
                servers[SERVER_FP32],
                settings.corpus,
                bulk_request=settings.bulk_request,
                idle_requests=settings.idle_requests,
                latency_duration=settings.latency_duration,
            )
        )
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
        onnx=not args.no_onnx,
        roofline=not args.no_roofline,
        roofline_tokens=256 if args.quick else 1536,
        roofline_repeats=2 if args.quick else 10,
        native_bf16=native_bf16(cpu_flags()),
    )


def server_dtype(name: str, settings: CompareSettings) -> str:
    """The precision a bulk server computes in (``auto``: bf16 where the CPU has it natively)."""
    dtype = name.removeprefix("server ")
    return ("bf16" if settings.native_bf16 else "fp32") if dtype == "auto" else dtype


def initial_timed(
    servers: Sequence[str], contenders: Sequence[Contender], settings: CompareSettings
) -> dict[str, Timed]:
    request = f"1 client, requests of {settings.bulk_request}"
    timed = [
        *(Timed(n, f"end to end, {request}", dtype=server_dtype(n, settings)) for n in BULK_SERVERS if n in servers),
        *(
            Timed(c.name, "in-process", note=f"{c.note}, setup {c.setup_seconds:.1f} s", dtype=c.dtype)
            for c in contenders
        ),
        Timed(CLIENTS_MERGE, f"{settings.clients} clients x 1 sentence, fp32"),
        Timed(CLIENTS_NO_MERGE, f"{settings.clients} clients x 1 sentence, fp32, --merge-requests false"),
    ]
    return {t.name: t for t in timed}


def start_roofline(settings: CompareSettings, model_dir: Path, progress: Progress) -> RooflineRun | None:
    """The machine's matmul rates at the model's shapes, measured in a process of its own."""
    shapes = Shapes.of_model(model_dir)
    if not settings.roofline or shapes is None:
        return None
    progress(f"matmul rates at the model's shapes (T {settings.roofline_tokens}, {THREADS} threads)")
    tokens = mean_tokens(model_dir, settings.corpus, settings.max_seq_len)
    return RooflineRun(
        shapes,
        tokens_per_sentence=tokens,
        tokens=settings.roofline_tokens,
        threads=THREADS,
        repeats=settings.roofline_repeats,
    )


def finish_roofline(run: RooflineRun | None, progress: Progress) -> Roofline | None:
    if run is None:
        return None
    roof = run.result()
    rates = ", ".join(f"{d} {r.gflops} GFLOP/s" for d, r in roof.rates.items())
    progress(f"  {rates}; fp32 ceiling {roof.ceiling('fp32')} sentences/s" if not roof.error else roof.error)
    return roof


def accuracy(state: CompareState, contenders: Sequence[Contender]) -> dict[str, dict[str, Any]]:
    """Per-sentence cosine (min, mean) of each server's vectors to the fp32 server's, and of each
    in-process contender's (and the fp32 server's) to the Encoder fp32's: the fp32 references."""
    in_process = {c.name: c.vectors for c in contenders if c.vectors is not None}
    pairs = [(name, SERVER_FP32) for name in state.vectors if name != SERVER_FP32]
    pairs += [(name, ENCODER_FP32) for name in [*in_process, SERVER_FP32] if name != ENCODER_FP32]
    vectors = state.vectors | in_process
    result: dict[str, dict[str, Any]] = {}
    for name, reference in pairs:
        if name in vectors and reference in vectors and vectors[name].shape == vectors[reference].shape:
            cosines = cosine_rows(vectors[name], vectors[reference])
            result[name] = {
                "min": round(float(cosines.min()), 5),
                "mean": round(float(cosines.mean()), 6),
                "reference": reference,
            }
    return result


def run_compare(args: argparse.Namespace, model_dir: Path, progress: Progress) -> CompareReport:
    settings = compare_settings(args, model_dir)
    print(describe_corpus(args.corpus, settings.corpus), file=sys.stderr)
    env = environment()
    progress(f"CPU: {describe_cpu(env)}")
    named = (
        (SERVER_FP32, settings.base),
        (SERVER_BF16, replace(settings.base, dtype="bf16")),
        (SERVER_NO_MERGE, replace(settings.base, merge_requests=False)),
    )
    optional = [(SERVER_INT8, replace(settings.base, dtype="int8"))]
    if args.quick:  # a smoke run keeps to the servers that differ; auto is fp32 or bf16
        skipped_auto = [f"{SERVER_AUTO} not started (--quick)"]
    else:
        optional.append((SERVER_AUTO, replace(settings.base, dtype="auto")))
        skipped_auto = []
    with ExitStack() as stack:
        pool = ServerPool(stack, progress)
        roofline_run = start_roofline(settings, model_dir, progress)
        if roofline_run is not None:
            stack.callback(roofline_run.stop)
        # A full run measures the rates on a quiet machine, before anything else starts; a
        # smoke run (--quick), whose figures mean nothing, lets it overlap the servers' start.
        roof = None if args.quick else finish_roofline(roofline_run, progress)
        progress("starting the servers: fp32, bf16, fp32 without merging; int8 and auto if this bertserve has them")
        with pool.running(*named, optional=optional) as started:
            servers = {s.name: s for s in started}
            progress("building the in-process contenders")
            contenders, skipped = build_in_process(settings, model_dir)
            roof = finish_roofline(roofline_run, progress) if args.quick else roof
            skipped = [*pool.refused.values(), *skipped_auto, *skipped]
            state = CompareState(timed=initial_timed(list(servers), contenders, settings))
            load_before = os.getloadavg()
            run_rounds(servers, contenders, state, settings, progress)
            load_after = os.getloadavg()
        memory = {
            s.name: {"serving": round(s.rss.serving_peak_mib, 1), "startup": round(s.rss.startup_peak_mib, 1)}
            for s in started
        }
        progress("time to ready: cold and warm starts")
        startup = measure_startup(pool, settings, progress)
    for name, busy in state.busy.items():
        state.timed[name].note = f"worker busy {median(busy):.0%} of the time"
    rows = throughput_rows(list(state.timed.values()), roof)
    latency = summarize_latency(state.latency)
    padding = {name: clean(median(values)) for name, values in state.padding.items()}
    single_p50 = {name: percentile_ms(seconds, 50, 2) for name, seconds in state.single.items()}
    accurate = accuracy(state, contenders)
    inputs = TargetInputs(
        rates={r.name: r.median_sentences_per_second for r in rows if r.median_sentences_per_second is not None},
        runs={r.name: r.runs for r in rows},
        latency=latency,
        padding=median(state.padding.get(SERVER_FP32, [])),
        warm_to_cold=math.nan if startup.warm_to_cold is None else startup.warm_to_cold,
        startup_detail=f"medians {fmt(startup.median_warm_seconds)} s vs {fmt(startup.median_cold_seconds)} s",
        st_targets=settings.st_targets,
        accuracy=accurate,
        single_p50_ms=single_p50,
        fp32_ceiling=None if roof is None else roof.ceiling("fp32"),
        native_bf16=settings.native_bf16,
        bf16_ceiling=None if roof is None else roof.ceiling("bf16"),
        int8_units=int8_units(cpu_flags()),
    )
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
        single_sentence_p50_ms={name: clean(p50) for name, p50 in single_p50.items()},
        accuracy=accurate,
        roofline=roof,
        targets=compute_targets(inputs),
        skipped="; ".join(skipped) or None,
        load_average={"before": list(load_before), "after": list(load_after)},
        elapsed_s=round(progress.elapsed(), 1),
        environment=env,
    )
