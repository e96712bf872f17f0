"""The benchmark suite's harness: server processes with their RSS and counters, client
load in threads, and small statistics helpers. See ``suite.py``."""

from __future__ import annotations

import itertools
import math
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    RunningServer,
    ServerStartError,
    start_server,
)
from bertserve.client import BertClient

START_TIMEOUT_S = 900.0  # a cold start builds the graph; on a busy machine that takes a while
STOP_TIMEOUT_S = 60.0
RSS_SAMPLE_S = 0.2
JOB_POLL_S = 0.05
CLIENT_TIMEOUT_MS = 900_000  # 64 clients queueing behind 4,096-sentence jobs wait minutes on two busy cores
SERVER_WARMUP_SENTENCES = 512


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


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
