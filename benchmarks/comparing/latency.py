"""``suite.py compare``, its latency part: one-sentence requests to the idle fp32 server,
then the bulk jobs timed alone, then one-sentence requests while a bulk client saturates it."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from bertserve.client import BertClient
from lib.inputs import cycle_take
from lib.stats import Percentiles, clean, median, percentile_ms

from comparing.servers import BenchmarkError, ServerProcess

JOB_POLL_S = 0.05


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


def single_sentence_turns(
    servers: Mapping[str, ServerProcess], corpus: Sequence[str], count: int
) -> dict[str, list[float]]:
    """Seconds per one-sentence request to each idle server, the servers taking turns sentence
    by sentence (the same sentence to each, the first server rotating), so that noise falls on all."""
    latencies: dict[str, list[float]] = {name: [] for name in servers}
    with ExitStack() as stack:
        clients = {name: stack.enter_context(server.client()) for name, server in servers.items()}
        names = list(clients)
        for index in range(count):
            sentence = corpus[(index * 131) % len(corpus)]
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.perf_counter()
                clients[name].encode([sentence])
                latencies[name].append(time.perf_counter() - started)
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


def latency_repeat(
    server: ServerProcess, corpus: Sequence[str], *, bulk_request: int, idle_requests: int, latency_duration: float
) -> LatencyRepeat:
    """Idle single-sentence latency, then a bulk-only window (the bulk jobs' run times), then
    single sentences while the bulk client keeps the server saturated."""
    bulk_texts = cycle_take(corpus, 0, bulk_request)
    with server.client() as single:
        idle = single_sentence_latencies(single, corpus, count=idle_requests)
        with BulkLoader(server, bulk_texts) as loader:
            bulk_jobs = job_times_until(server, loader.first_reply)  # only the loader's jobs run now
            loaded = single_sentence_latencies(single, corpus, duration=latency_duration)
            recent = server.status().get("recent_jobs", {})
        if loader.error:
            raise BenchmarkError(f"the bulk client failed: {loader.error}")
    return LatencyRepeat(
        idle_ms=[round(s * 1000, 3) for s in idle],
        load_ms=[round(s * 1000, 3) for s in loaded],
        bulk_job_seconds=median(bulk_jobs),
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
    status_bulk = median([r.status_bulk_median_job_seconds for r in repeats])
    window_bulk = median([r.bulk_job_seconds for r in repeats])
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
        status_median_job_seconds=clean(median([r.status_median_job_seconds for r in repeats])),
        status_median_job_sentences=clean(median([r.status_median_job_sentences for r in repeats])),
        limit_ms=clean(limit),
        per_repeat=[
            {
                "idle_p50_ms": percentile_ms([x / 1000 for x in r.idle_ms], 50, 2),
                "load_p50_ms": percentile_ms([x / 1000 for x in r.load_ms], 50, 2),
                "load_p99_ms": percentile_ms([x / 1000 for x in r.load_ms], 99, 2),
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


def describe_latency_repeat(repeat: LatencyRepeat) -> str:
    idle_p50 = percentile_ms([x / 1000 for x in repeat.idle_ms], 50, 2)
    load_p99 = percentile_ms([x / 1000 for x in repeat.load_ms], 99, 2)
    return (
        f"  idle p50 {idle_p50:.1f} ms, under load p99 {load_p99:.1f} ms ({len(repeat.load_ms)} requests), "
        f"bulk job median {repeat.bulk_job_seconds * 1000:.0f} ms, max {repeat.bulk_job_max_seconds * 1000:.0f} ms"
    )
