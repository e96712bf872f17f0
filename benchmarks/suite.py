"""End-to-end benchmark suite: real bertserve server processes, started on free ports.

Two sub-commands; each starts its own servers (``python -m bertserve.server.cli start``),
waits for the ``bertserve ... ready: ...`` line, measures, and stops them with SIGTERM.

``sweep``: varies one thing at a time from a base configuration and reports, per point,
sentences/second and the p50/p90/p99 request latency. Client-side parameters (request size,
concurrent clients) run on the base server, which stays up for the whole sweep; server-side
parameters (max_seq_len, max_batch_size, pooling_layer, dtype, workers) start a server for
every value but the base one, all sharing one graph cache.

``compare``: on benchmarks/data/corpus.txt, side by side in one run, repeated round-robin:
the server end to end (fp32, bf16), the in-process Encoder, sentence-transformers, 32
single-sentence clients with and without cross-client merging, latency under load, memory,
cold and warm start, padding; then a table of targets, each PASS or MISS.

    python benchmarks/suite.py sweep --json benchmarks/results/sweep.json --plots benchmarks/results/plots
    python benchmarks/suite.py compare --json benchmarks/results/compare.json --plots benchmarks/results/plots
    python benchmarks/suite.py sweep --quick --model-dir /tmp/tiny_bert      # a seconds-long smoke run

Progress goes to stderr, the markdown tables to stdout.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from _common import (
    DEFAULT_CORPUS,
    NO_MODEL_HINT,
    NO_ST_HINT,
    ST_NAME,
    Contender,
    RunningServer,
    ServerStartError,
    describe_corpus,
    encoder_contender,
    environment,
    format_load,
    read_corpus,
    resolve_model_dir,
    st_contender,
    start_server,
    write_json,
)
from bertserve.client import BertClient

START_TIMEOUT_S = 900.0  # a cold start builds the graph; on a busy machine that takes a while
STOP_TIMEOUT_S = 60.0
RSS_SAMPLE_S = 0.2
JOB_POLL_S = 0.05
CLIENT_TIMEOUT_MS = 900_000  # 64 clients queueing behind 4,096-sentence jobs wait minutes on two busy cores
SERVER_WARMUP_SENTENCES = 512

# ----------------------------------------------------------------------------------------
# small utilities
# ----------------------------------------------------------------------------------------


class BenchmarkError(Exception):
    """A benchmark could not run: a server did not start, clients failed."""


class Progress:
    """Progress lines on stderr, stamped with the time since the run started."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def __call__(self, message: str) -> None:
        print(f"[{self.elapsed():7.1f} s] {message}", file=sys.stderr, flush=True)


def cycle_take(corpus: Sequence[str], start: int, count: int) -> list[str]:
    """``count`` sentences of ``corpus`` from ``start`` on, wrapping around."""
    n = len(corpus)
    return [corpus[(start + i) % n] for i in range(count)]


def percentile_ms(seconds: Sequence[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(seconds) * 1000, q)), 2) if seconds else math.nan


def median_or_nan(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def clean(value: float) -> float | None:
    """``value`` rounded for JSON, or None for NaN."""
    return None if math.isnan(value) else round(value, 4)


def milliseconds(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


@dataclass(frozen=True)
class Percentiles:
    """Request latency in milliseconds."""

    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Percentiles:
        return cls(percentile_ms(seconds, 50), percentile_ms(seconds, 90), percentile_ms(seconds, 99))


# ----------------------------------------------------------------------------------------
# server processes
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerOptions:
    """The ``bertserve start`` flags a benchmark varies."""

    model_dir: Path | None
    graph_dir: Path | None
    max_seq_len: str = "128"
    dtype: str = "fp32"
    num_worker: int = 1
    max_batch_size: int = 256
    pooling_layer: int = -1
    merge_requests: bool = True

    def flags(self) -> list[str]:
        flags = [
            "--max-seq-len", self.max_seq_len, "--dtype", self.dtype, "--num-worker", str(self.num_worker),
            "--max-batch-size", str(self.max_batch_size), "--pooling-layer", str(self.pooling_layer),
            "--merge-requests", "true" if self.merge_requests else "false",
        ]  # fmt: skip
        if self.model_dir is not None:
            flags += ["--model-dir", str(self.model_dir)]
        if self.graph_dir is not None:
            flags += ["--graph-dir", str(self.graph_dir)]
        return flags

    def with_value(self, name: str, value: str) -> ServerOptions:
        """A copy with the field for flag ``name`` (``max-seq-len``) set from the string ``value``."""
        attribute = name.replace("-", "_")
        current = getattr(self, attribute)
        return replace(self, **{attribute: type(current)(value)})

    def describe(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


@dataclass
class WorkCounters:
    """The workers' cumulative counters from ``server_status``; subtract two to get a window's."""

    jobs: int = 0
    busy_seconds: float = 0.0
    tokens: int = 0
    slots: int = 0

    @classmethod
    def from_status(cls, status: dict[str, Any]) -> WorkCounters:
        workers = status.get("workers", [])
        return cls(
            jobs=sum(int(w.get("jobs_done", 0)) for w in workers),
            busy_seconds=sum(float(w.get("busy_s", 0.0)) for w in workers),
            tokens=sum(int(w.get("tokens", 0)) for w in workers),
            slots=sum(int(w.get("token_slots", 0)) for w in workers),
        )

    def __sub__(self, other: WorkCounters) -> WorkCounters:
        return WorkCounters(
            self.jobs - other.jobs,
            self.busy_seconds - other.busy_seconds,
            self.tokens - other.tokens,
            self.slots - other.slots,
        )

    @property
    def padding_fraction(self) -> float:
        """Padded token slots / all token slots the model computed."""
        return 1 - self.tokens / self.slots if self.slots > 0 else math.nan


_LOG_NUMBERS = itertools.count(1)


class RssSampler:
    """Samples the summed RSS of a server and all its descendants every ``RSS_SAMPLE_S``."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.startup_peak_mib = 0.0
        self.serving_peak_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{server.process.pid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_S):
            rss = self.server.family_rss_mib()
            if self.server.ready.is_set():  # peaks before the ready line are startup peaks
                self.serving_peak_mib = max(self.serving_peak_mib, rss)
            else:
                self.startup_peak_mib = max(self.startup_peak_mib, rss)

    def reset_serving_peak(self) -> None:
        """Start a new serving peak, e.g. for one point of a sweep."""
        self.serving_peak_mib = 0.0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class ServerProcess:
    """One ``bertserve start`` process (the shared launcher's), its output in a log file."""

    def __init__(self, name: str, options: ServerOptions, log_dir: Path) -> None:
        self.name = name
        self.options = options
        self.log_path = log_dir / f"{name.replace(' ', '_')}-{next(_LOG_NUMBERS)}.log"
        self.server = start_server(*options.flags(), expect_ready=False, echo=False, log_path=self.log_path)
        self.port, self.port_out = self.server.port, self.server.port_out
        self.rss = RssSampler(self.server)
        self._control: BertClient | None = None

    @property
    def ready_seconds(self) -> float:
        return self.server.ready_seconds

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> float:
        """Seconds from launch to the ready line; raises BenchmarkError if it never comes."""
        try:
            return self.server.wait_ready(timeout)
        except ServerStartError as exc:
            raise BenchmarkError(f"server {self.name} did not become ready (log {self.log_path}): {exc}") from None

    def client(self, timeout_ms: float = CLIENT_TIMEOUT_MS) -> BertClient:
        return BertClient("127.0.0.1", self.port, self.port_out, timeout=timeout_ms, check_length=False)

    def status(self) -> dict[str, Any]:
        """``server_status``, through one control client kept for the server's life."""
        if self._control is None:
            self._control = self.client(timeout_ms=60_000)
        return self._control.server_status

    def counters(self) -> WorkCounters:
        return WorkCounters.from_status(self.status())

    def terminate(self) -> None:
        """Send SIGTERM (the server's graceful stop); :meth:`wait_stopped` waits for it."""
        if self._control is not None:
            self._control.close()
            self._control = None
        self.server.terminate()

    def wait_stopped(self) -> None:
        """Wait for the server and its children; whatever is left after ``STOP_TIMEOUT_S`` is killed."""
        for problem in self.server.wait_stopped(STOP_TIMEOUT_S):
            print(f"server {self.name}: {problem}; killed", file=sys.stderr)
        self.rss.stop()


class ServerPool:
    """Starts servers into a scratch directory for their logs and stops every one of them."""

    def __init__(self, stack: ExitStack, progress: Progress) -> None:
        self.log_dir = Path(tempfile.mkdtemp(prefix="bertserve-bench-"))
        self.progress = progress
        self.failed = False
        stack.callback(self._clean_up)

    def _clean_up(self) -> None:
        if self.failed:
            print(f"server logs kept in {self.log_dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    @contextmanager
    def running(self, *named: tuple[str, ServerOptions]) -> Iterator[list[ServerProcess]]:
        """Start the servers together, wait until all are ready, stop them all at the end."""
        servers: list[ServerProcess] = []
        try:
            for name, options in named:
                servers.append(ServerProcess(name, options, self.log_dir))
            for server in servers:
                seconds = server.wait_ready()
                self.progress(f"server {server.name} ready in {seconds:.1f} s (port {server.port})")
            yield servers
        except BaseException:
            self.failed = True
            raise
        finally:
            for server in servers:
                server.terminate()
            for server in servers:
                server.wait_stopped()


# ----------------------------------------------------------------------------------------
# load: clients in threads
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """``clients`` threads, each with its own BertClient, sending ``batch`` sentences a request."""

    clients: int
    batch: int

    @classmethod
    def parse(cls, text: str) -> Load:
        """``"4x256"``: 4 clients of 256 sentences."""
        clients, _, batch = text.lower().partition("x")
        return cls(int(clients), int(batch))

    def with_value(self, name: str, value: str) -> Load:
        return replace(self, clients=int(value)) if name == "clients" else replace(self, batch=int(value))

    def __str__(self) -> str:
        return f"{self.clients} x {self.batch}"


@dataclass
class LoadResult:
    """What a load measured: throughput over the window and every request's latency."""

    clients: int
    batch: int
    requests: int
    sentences: int
    seconds: float
    sentences_per_second: float
    latency_ms: Percentiles
    errors: list[str]


class _StartLine:
    """How the clients start together: all warm, then (after the caller's snapshot) all go;
    the last one through ``go`` opens the window of ``duration`` seconds."""

    def __init__(self, parties: int, duration: float) -> None:
        self.duration = duration
        self.start = self.deadline = 0.0
        self.warmed = threading.Barrier(parties)
        self.go = threading.Barrier(parties, action=self._open)

    def _open(self) -> None:
        self.start = time.perf_counter()
        self.deadline = self.start + self.duration

    def abort(self) -> None:
        self.warmed.abort()
        self.go.abort()


def _client_loop(
    server: ServerProcess,
    load: Load,
    index: int,
    corpus: Sequence[str],
    line: _StartLine,
    timings: list[tuple[float, float, int]],
    errors: list[str],
) -> None:
    """One client: connect, warm up, wait for the others, then send until the deadline."""
    offset = index * 7919  # clients start at different places in the corpus
    try:
        with server.client() as client:
            client.encode(cycle_take(corpus, offset, min(load.batch, 64)))
            line.warmed.wait()
            line.go.wait()
            while time.perf_counter() < line.deadline:
                texts = cycle_take(corpus, offset, load.batch)
                offset += load.batch
                started = time.perf_counter()
                client.encode(texts)
                timings.append((started, time.perf_counter(), len(texts)))
    except threading.BrokenBarrierError:
        return
    except Exception as exc:
        errors.append(f"client {index}: {type(exc).__name__}: {exc}")
        line.abort()


def run_load(
    server: ServerProcess,
    load: Load,
    corpus: Sequence[str],
    duration: float,
    at_start: Callable[[], object] | None = None,
) -> LoadResult:
    """Every client connects and warms up; ``at_start`` runs (say, a status snapshot); then
    every client sends back to back until ``duration`` has passed and finishes its request.

    Throughput is all sentences sent over the time from the common start to the last reply,
    so no request is left out and no partial one is counted.
    """
    line = _StartLine(load.clients + 1, duration)
    timings: list[tuple[float, float, int]] = []  # list.append is atomic: shared by the threads
    errors: list[str] = []
    threads = [  # daemons: an interrupted run must not wait for their replies
        threading.Thread(target=_client_loop, args=(server, load, i, corpus, line, timings, errors), daemon=True)
        for i in range(load.clients)
    ]
    for thread in threads:
        thread.start()
    try:
        line.warmed.wait(timeout=CLIENT_TIMEOUT_MS / 1000)
        if at_start is not None:
            at_start()
        line.go.wait()
    except threading.BrokenBarrierError:
        raise BenchmarkError(f"clients failed before the load started: {errors[:3]}") from None
    except BaseException:
        line.abort()
        raise
    for thread in threads:
        thread.join()
    end = max((t[1] for t in timings), default=line.start)
    seconds = end - line.start
    sentences = sum(t[2] for t in timings)
    return LoadResult(
        clients=load.clients,
        batch=load.batch,
        requests=len(timings),
        sentences=sentences,
        seconds=round(seconds, 3),
        sentences_per_second=round(sentences / seconds, 1) if seconds > 0 else math.nan,
        latency_ms=Percentiles.of([t[1] - t[0] for t in timings]),
        errors=errors,
    )


def warm_up_server(server: ServerProcess, corpus: Sequence[str]) -> None:
    """One untimed request, so a fresh worker has run each common shape once."""
    with server.client() as client:
        client.encode(cycle_take(corpus, 0, SERVER_WARMUP_SENTENCES))


# ----------------------------------------------------------------------------------------
# sweep
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepParameter:
    name: str
    label: str
    side: Literal["client", "server"]
    values: tuple[str, ...]
    quick_values: tuple[str, ...]


SWEEP_PARAMETERS = (
    SweepParameter("client-batch", "sentences per request", "client",
                   ("1", "16", "256", "4096"), ("1", "16")),
    SweepParameter("clients", "concurrent clients", "client", ("1", "4", "16", "64"), ("1", "4")),
    SweepParameter("max-seq-len", "max_seq_len", "server", ("32", "64", "128", "NONE"), ("16", "32")),
    SweepParameter("max-batch-size", "max_batch_size", "server", ("32", "128", "256", "512"), ("32", "256")),
    SweepParameter("pooling-layer", "pooling_layer", "server", ("-1", "-2", "-4"), ("-1", "-2")),
    SweepParameter("dtype", "dtype", "server", ("fp32", "bf16", "fp16"), ("fp32", "bf16")),
    SweepParameter("num-worker", "worker processes", "server", ("1", "2"), ("1", "2")),
)  # fmt: skip
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


# ----------------------------------------------------------------------------------------
# compare
# ----------------------------------------------------------------------------------------

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
    rows: Sequence[ThroughputRow], latency: LatencyResult, padding: float, startup: StartupResult
) -> list[Target]:
    by_name = {r.name: r for r in rows}
    p99, limit = latency.under_load.p99, latency.limit_ms
    warm_cold = math.nan if startup.warm_to_cold is None else startup.warm_to_cold
    return [
        throughput_target(by_name, "server fp32 / sentence-transformers", SERVER_FP32, ST_NAME, 1.3),
        throughput_target(by_name, "server bf16 / sentence-transformers", SERVER_BF16, ST_NAME, 1.6),
        throughput_target(by_name, "server fp32 / Encoder fp32", SERVER_FP32, "Encoder fp32", 0.9),
        throughput_target(by_name, "server bf16 / Encoder bf16", SERVER_BF16, "Encoder bf16", 0.9),
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
        targets=compute_targets(rows, latency, fp32_padding, startup),
        skipped=skipped,
        load_average={"before": list(load_before), "after": list(load_after)},
        elapsed_s=round(progress.elapsed(), 1),
        environment=environment(),
    )


# ----------------------------------------------------------------------------------------
# plots
# ----------------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
    plt = _pyplot()
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


def plot_compare(report: CompareReport, directory: Path) -> list[Path]:
    """``compare.png``: throughput per contender, single-sentence latency, peak memory."""
    plt = _pyplot()
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


# ----------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------

QUICK_DEFAULTS: dict[str, dict[str, Any]] = {
    "sweep": {"duration": 0.5, "max_seq_len": 32, "client_load": "1x16", "server_load": "2x32"},
    "compare": {
        "duration": 0.5, "latency_duration": 0.5, "repeats": 1, "idle_requests": 5, "start_repeats": 1,
        "max_seq_len": 32, "limit": 300, "clients": 8, "bulk_request": 256,
    },
}  # fmt: skip


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--model-dir", type=Path, default=None, help="model directory (default: all-MiniLM-L6-v2 if installed)")
    add("--graph-dir", type=Path, default=None, help="graph cache shared by every server (default: bertserve's)")
    add("--corpus", type=Path, default=DEFAULT_CORPUS, help="one sentence a line (default: %(default)s)")
    add("--max-seq-len", type=int, default=None, help="base max_seq_len (default: 128; 32 with --quick)")
    add("--duration", type=float, default=None, help="seconds of load per point (default: 10; 0.5 with --quick)")
    add("--quick", action="store_true", help="a seconds-long smoke run: tiny durations, few points")
    add("--json", type=Path, default=None, metavar="PATH", help="write the results as JSON")
    add("--markdown", type=Path, default=None, metavar="PATH", help="write the markdown report here too")
    add("--plots", type=Path, default=None, metavar="DIR", help="write PNG plots into DIR")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sweep = commands.add_parser("sweep", help="vary one parameter at a time from a base configuration")
    add_common_arguments(sweep)
    names = ", ".join(p.name for p in SWEEP_PARAMETERS)
    add = sweep.add_argument
    add("--only", action="append", choices=[p.name for p in SWEEP_PARAMETERS], metavar="PARAM",
        help=f"run only this parameter (repeatable): {names}")  # fmt: skip
    add("--client-load", default=None, metavar="CxB",
        help="base load of the client-side sweeps: C clients of B sentences (default: 1x16)")  # fmt: skip
    add("--server-load", default=None, metavar="CxB",
        help="load of the server-side sweeps (default: 4x256, enough to keep workers busy)")  # fmt: skip
    compare = commands.add_parser("compare", help="server vs Encoder vs sentence-transformers, with targets")
    add_common_arguments(compare)
    add = compare.add_argument
    add("--repeats", type=int, default=None, help="rounds, interleaved (default: 3)")
    add("--limit", type=int, default=None, help="use only the first N sentences of the corpus")
    add("--batch-size", type=int, default=None,
        help="sentences per model run of the in-process contenders (default: the server's)")  # fmt: skip
    add("--bulk-request", type=int, default=None, help="sentences per bulk request (default: 4096)")
    add("--clients", type=int, default=None, help="single-sentence clients (default: 32)")
    add("--latency-duration", type=float, default=None, help="seconds of single requests under load (default: 20)")
    add("--idle-requests", type=int, default=None, help="single requests timed on the idle server (default: 50)")
    add("--start-repeats", type=int, default=None, help="cold and warm starts timed (default: 3)")
    add("--no-sentence-transformers", action="store_true", help="leave sentence-transformers out")
    return parser


FULL_DEFAULTS: dict[str, dict[str, Any]] = {
    "sweep": {"duration": 10.0, "max_seq_len": 128, "client_load": "1x16", "server_load": "4x256"},
    "compare": {
        "duration": 10.0, "latency_duration": 20.0, "repeats": 3, "idle_requests": 50, "start_repeats": 3,
        "max_seq_len": 128, "limit": None, "clients": 32, "bulk_request": 4096,
    },
}  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Options left out take the full or the ``--quick`` defaults."""
    parser = build_parser()
    args = parser.parse_args(argv)
    defaults = (QUICK_DEFAULTS if args.quick else FULL_DEFAULTS)[args.command]
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.command == "compare" and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def emit(markdown: str, report: Any, plots: Callable[[Path], list[Path]], args: argparse.Namespace) -> None:
    print(markdown)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown + "\n", encoding="utf-8")
        print(f"wrote {args.markdown}", file=sys.stderr)
    if args.json is not None:
        write_json(asdict(report), args.json)
    if args.plots is not None:
        for path in plots(args.plots):
            print(f"wrote {path}", file=sys.stderr)


def stop_on_signals() -> None:
    """SIGTERM and SIGINT (even where a background shell ignores SIGINT) end the run through
    the usual exception path, so every server started so far is stopped."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupt)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_signals()
    progress = Progress()
    progress(f"load average (1/5/15 min): {format_load(os.getloadavg())}")
    model_dir = resolve_model_dir(args.model_dir)
    if args.model_dir is not None and model_dir is None:
        print(f"no model directory at {args.model_dir}", file=sys.stderr)
        return 2
    try:
        if args.command == "sweep":
            sweep = run_sweep(args, args.model_dir, progress)
            emit(sweep_markdown(sweep), sweep, lambda d: plot_sweep(sweep, d), args)
        else:
            if model_dir is None:
                print(NO_MODEL_HINT, file=sys.stderr)
                return 2
            compare = run_compare(args, model_dir, progress)
            emit(compare_markdown(compare), compare, lambda d: plot_compare(compare, d), args)
    except BenchmarkError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        print(f"interrupted ({exc or 'SIGINT'}); the servers were stopped", file=sys.stderr)
        return 130
    progress(f"done; load average (1/5/15 min): {format_load(os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
