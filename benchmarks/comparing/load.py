"""The suite's load: clients in threads, each with its own BertClient, sending back to back
for a window, all starting together; and the warm-up a fresh server gets before it is measured."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from lib.inputs import cycle_take
from lib.stats import Percentiles

from comparing.servers import CLIENT_TIMEOUT_MS, BenchmarkError, ServerProcess

SERVER_WARMUP_SENTENCES = 512


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
