"""The soak's clients and their bookkeeping: the expected vectors and the check of a reply,
the log every request ends in, and the open-loop client threads (see ``soak.py``)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from bertserve.client import AsyncBertClient, BertClientError, ServerError, ServerTimeoutError
from bertserve.server.testing.launcher import RunningServer

# name: (fewest, most sentences, default weight)
SIZES: dict[str, tuple[int, int, float]] = {"small": (1, 8, 85.0), "medium": (9, 100, 12.0), "bulk": (200, 2000, 3.0)}
# A bulk request has one of these sizes, so that its unloaded time is measured, not interpolated.
# All are at least the server's default --max-batch-size (256): bulk to the server as well.
BULK_SIZES: tuple[int, ...] = (256, 512, 1024, 2000)
COSINE_MIN = 0.999
CONNECT_ATTEMPTS = 5

# Every request ends in exactly one of these.
OUTCOMES = ("ok", "wrong", "crossed", "busy", "expired", "timeout", "lost", "other")
FAILED = ("wrong", "crossed", "timeout", "lost")  # any of these fails the run


# ----------------------------------------------------------------------------------------
# expected vectors and the check of one reply
# ----------------------------------------------------------------------------------------


class Expected:
    """The unit-length expected vector of every corpus sentence, by corpus index."""

    def __init__(self, vectors: np.ndarray) -> None:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        self.unit = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
        self.dim = int(vectors.shape[1])

    def check(self, indices: np.ndarray, got: Any) -> str:
        """``"ok"``, ``"crossed"`` (a row is the vector of a sentence not in this request)
        or ``"wrong"`` (bad shape, values or order)."""
        got = np.asarray(got, dtype=np.float32)
        if got.ndim != 2 or got.shape[1] != self.dim:
            return "wrong"
        rows = got / np.maximum(np.linalg.norm(got, axis=1, keepdims=True), 1e-12)
        if got.shape[0] == len(indices):
            bad = np.sum(rows * self.unit[indices], axis=1) < COSINE_MIN
            if not bad.any():
                return "ok"
            rows = rows[bad]
        best = np.argmax(rows @ self.unit.T, axis=1)
        matched = np.sum(rows * self.unit[best], axis=1) >= COSINE_MIN
        foreign = ~np.isin(best, indices)
        return "crossed" if np.any(matched & foreign) else "wrong"


# ----------------------------------------------------------------------------------------
# the log of requests
# ----------------------------------------------------------------------------------------


class Record(NamedTuple):
    """One request: when it was sent (seconds since the load began), its size class and
    size, how it ended, and the seconds from send to that end (for ``busy``: to the refusal)."""

    sent_at: float
    size_class: str
    size: int
    outcome: str
    seconds: float
    kind: str = ""  # the error kind or exception name of an ``other`` outcome
    client: int = 0
    # whether this client had a bulk request under way when it sent this one: the server runs
    # a client's requests in the order it sent them, so this one waited for that one
    behind_bulk: bool = False


class RequestLog:
    """Every request's :class:`Record`, appended by the client threads; how late each send
    was against its schedule; connection failures."""

    def __init__(self, origin: float) -> None:
        self.origin = origin  # time.monotonic() when the load began
        self._lock = threading.Lock()
        self.records: list[Record] = []
        self.send_lag: list[float] = []
        self.sent = 0
        self.connect_errors: Counter[str] = Counter()

    def sending(self, lag: float) -> None:
        with self._lock:
            self.sent += 1
            self.send_lag.append(lag)

    def ended(self, record: Record) -> None:
        with self._lock:
            self.records.append(record)

    def connect_failed(self, exc: BaseException) -> None:
        with self._lock:
            self.connect_errors[type(exc).__name__] += 1

    def snapshot(self) -> tuple[int, list[Record]]:
        with self._lock:
            return self.sent, list(self.records)


# ----------------------------------------------------------------------------------------
# the clients
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What the clients send: the mix of size classes, the corpus, and the offered rate."""

    classes: list[str]
    weights: list[float]
    corpus: list[str]
    bulk_sizes: tuple[int, ...] = BULK_SIZES

    def draw(self, rng: random.Random) -> tuple[str, np.ndarray]:
        size_class = rng.choices(self.classes, self.weights)[0]
        if size_class == "bulk":
            count = rng.choice(self.bulk_sizes)
        else:
            fewest, most, _ = SIZES[size_class]
            count = rng.randint(fewest, most)
        return size_class, self.indices(rng, count)

    def indices(self, rng: random.Random, count: int) -> np.ndarray:
        return np.array([rng.randrange(len(self.corpus)) for _ in range(count)], dtype=np.int64)

    def texts(self, indices: np.ndarray) -> list[str]:
        return [self.corpus[i] for i in indices]

    def mean_size(self) -> float:
        """Sentences per request on average, over the mix."""
        means = {name: (SIZES[name][0] + SIZES[name][1]) / 2 for name in SIZES}
        means["bulk"] = sum(self.bulk_sizes) / len(self.bulk_sizes)
        return sum(w * means[c] for c, w in zip(self.classes, self.weights, strict=True)) / sum(self.weights)


def outcome_of(exc: BaseException) -> tuple[str, str]:
    """(outcome, kind) of a failed request."""
    if isinstance(exc, ServerTimeoutError):
        return "timeout", ""
    if isinstance(exc, ServerError) and exc.kind in ("busy", "expired"):
        return exc.kind, ""
    if isinstance(exc, ServerError):
        return "other", f"server:{exc.kind}"
    return "other", type(exc).__name__


class OpenLoopClient(threading.Thread):
    """One client thread: its own event loop and ``AsyncBertClient`` (identity ``soak-<n>``:
    identities that are prefixes of one another, as ZeroMQ topics, so a reply filtered by
    prefix alone would cross). From ``start_at`` to ``stop_at`` (``time.monotonic()``) it
    sends requests at Poisson arrivals of ``rate`` per second, each without waiting for the
    ones before it, and waits for each answer at most ``wait_ms``. After ``stop_at`` it waits
    at most ``drain_s`` for the requests still under way; those still unanswered are lost."""

    def __init__(
        self,
        number: int,
        server: RunningServer,
        plan: Plan,
        expected: Expected,
        log: RequestLog,
        *,
        rate: float,
        wait_ms: float,
        start_at: float,
        stop_at: float,
        drain_s: float,
        seed: int,
    ) -> None:
        super().__init__(name=f"soak-{number}", daemon=True)
        self.server, self.plan, self.expected, self.log = server, plan, expected, log
        self.rate, self.wait_ms, self.drain_s = rate, wait_ms, drain_s
        self.start_at, self.stop_at = start_at, stop_at
        self.rng = random.Random(seed * 1_000_003 + number)
        self.identity = f"soak-{number}"
        self.number = number
        self.crash: BaseException | None = None
        self.unfinished = 0
        self._bulk_under_way = 0

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # a bug in the soak itself: reported, fails the run
            self.crash = exc

    async def _main(self) -> None:
        client = AsyncBertClient(
            "127.0.0.1", **self.server.client_kwargs, timeout=self.wait_ms, identity=self.identity, check_length=False
        )
        try:
            await self._connect(client)
            tasks: set[asyncio.Task[None]] = set()
            due = self.start_at + self.rng.expovariate(self.rate)
            while due < self.stop_at:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                task = asyncio.create_task(self._request(client, lag=time.monotonic() - due))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                due += self.rng.expovariate(self.rate)
            if tasks:
                left = max(0.0, self.stop_at + self.drain_s - time.monotonic())
                _, pending = await asyncio.wait(set(tasks), timeout=left)
                self.unfinished = len(pending)
                for task in pending:
                    task.cancel()  # each records itself as lost
                if pending:
                    await asyncio.wait(pending)
        finally:
            await client.aclose()

    async def _connect(self, client: AsyncBertClient) -> None:
        for attempt in range(CONNECT_ATTEMPTS):
            try:
                await client.connect()
                return
            except BertClientError as exc:
                self.log.connect_failed(exc)
                if attempt == CONNECT_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(1.0)

    async def _request(self, client: AsyncBertClient, *, lag: float) -> None:
        size_class, indices = self.plan.draw(self.rng)
        self.log.sending(lag)
        sent_at = time.monotonic()
        started = time.perf_counter()
        behind = self._bulk_under_way > 0
        bulk = size_class == "bulk"
        self._bulk_under_way += bulk

        def end(outcome: str, kind: str = "") -> None:
            seconds = time.perf_counter() - started
            self.log.ended(
                Record(sent_at - self.log.origin, size_class, len(indices), outcome, seconds, kind, self.number, behind)
            )

        try:
            got = await client.encode(self.plan.texts(indices))
        except asyncio.CancelledError:
            end("lost")
            raise
        except BertClientError as exc:
            end(*outcome_of(exc))
            return
        finally:
            self._bulk_under_way -= bulk
        end(self.expected.check(indices, got))
