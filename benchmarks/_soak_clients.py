"""The soak's clients and their bookkeeping: the expected vectors and the check of a reply,
the counters every request ends in, and the client threads (see ``soak.py``)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import bertserve.client
import numpy as np
from bertserve.client import BertClient, BertClientError, ServerError, ServerTimeoutError
from lib.servers import RunningServer
from lib.stats import percentile_ms

# a ServerError of kind "busy"; newer clients raise it as this subclass
BUSY_ERROR: type[BaseException] | None = getattr(bertserve.client, "ServerBusyError", None)

# name: (fewest, most sentences, default weight)
SIZES: dict[str, tuple[int, int, float]] = {"small": (1, 8, 85.0), "medium": (9, 100, 12.0), "bulk": (200, 2000, 3.0)}
COSINE_MIN = 0.999
ASYNC_FRACTION = 0.15  # iterations that send 2-4 non-blocking requests, then fetch them
BUSY_BACKOFF_S = (0.05, 0.25)


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
# counters
# ----------------------------------------------------------------------------------------

OUTCOMES = ("ok", "wrong", "crossed", "lost", "busy", "error")


@dataclass
class Tally:
    """What happened to the requests of one size class. Every sent request ends in
    exactly one outcome; ``answered`` = ok + wrong + crossed (a reply with vectors)."""

    sent: int = 0
    sentences_answered: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # "error" outcomes by kind
    latencies: list[float] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return self.outcomes["ok"] + self.outcomes["wrong"] + self.outcomes["crossed"]

    @property
    def in_flight(self) -> int:
        return self.sent - sum(self.outcomes.values())

    def summary(self, seconds: float) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "answered": self.answered,
            **{name: self.outcomes[name] for name in OUTCOMES},
            # a request still unanswered after the drain deadline (its thread is stuck) is lost too
            "lost": self.outcomes["lost"] + self.in_flight,
            "in_flight_at_end": self.in_flight,
            "other_errors": self.outcomes["error"],
            "errors_by_kind": dict(self.errors),
            "sentences_per_second": round(self.sentences_answered / seconds, 1) if seconds > 0 else None,
            "latency_ms": {
                name: percentile_ms(self.latencies, q, 1) if self.latencies else None
                for name, q in (("p50", 50), ("p99", 99), ("max", 100))
            },
        }


class Counters:
    def __init__(self, classes: list[str]) -> None:
        self._lock = threading.Lock()
        self.by_class = {name: Tally() for name in classes}
        self.connect_errors: Counter[str] = Counter()  # BertClient() failed: no request was sent

    def connect_failed(self, exc: BaseException) -> None:
        with self._lock:
            self.connect_errors[type(exc).__name__] += 1

    def sent(self, size_class: str) -> None:
        with self._lock:
            self.by_class[size_class].sent += 1

    def ended(
        self, size_class: str, outcome: str, *, seconds: float | None = None, rows: int = 0, kind: str = ""
    ) -> None:
        with self._lock:
            tally = self.by_class[size_class]
            tally.outcomes[outcome] += 1
            if outcome == "error":
                tally.errors[kind] += 1
            if outcome in ("ok", "wrong", "crossed") and seconds is not None:
                tally.latencies.append(seconds)
                tally.sentences_answered += rows

    def total(self) -> Tally:
        with self._lock:
            total = Tally()
            for tally in self.by_class.values():
                total.sent += tally.sent
                total.sentences_answered += tally.sentences_answered
                total.outcomes.update(tally.outcomes)
                total.errors.update(tally.errors)
                total.latencies.extend(tally.latencies)
            return total


# ----------------------------------------------------------------------------------------
# the clients
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    classes: list[str]
    weights: list[float]
    corpus: list[str]
    timeout_ms: float

    def draw(self, rng: random.Random) -> tuple[str, np.ndarray]:
        size_class = rng.choices(self.classes, self.weights)[0]
        fewest, most, _ = SIZES[size_class]
        count = rng.randint(fewest, most)
        indices = np.array([rng.randrange(len(self.corpus)) for _ in range(count)], dtype=np.int64)
        return size_class, indices

    def texts(self, indices: np.ndarray) -> list[str]:
        return [self.corpus[i] for i in indices]


def _failure(exc: BaseException) -> tuple[str, str]:
    """(outcome, kind) of a failed request."""
    if isinstance(exc, ServerTimeoutError):
        return "lost", ""
    if (BUSY_ERROR is not None and isinstance(exc, BUSY_ERROR)) or (
        isinstance(exc, ServerError) and exc.kind == "busy"
    ):
        return "busy", ""
    if isinstance(exc, ServerError):
        return "error", f"server:{exc.kind}"
    return "error", type(exc).__name__


class SoakClient(threading.Thread):
    """One client thread: its own ``BertClient`` (identity ``soak-<n>``: identities that are
    prefixes of one another, as ZeroMQ topics, so a reply filtered by prefix alone would
    cross) sending requests until ``stop`` is set."""

    def __init__(
        self, number: int, server: RunningServer, plan: Plan, expected: Expected, counters: Counters, seed: int
    ) -> None:
        super().__init__(name=f"soak-{number}", daemon=True)
        self.server, self.plan, self.expected, self.counters = server, plan, expected, counters
        self.rng = random.Random(seed * 1_000_003 + number)
        self.identity = f"soak-{number}"
        self.stop = threading.Event()
        self.crash: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    client = BertClient(
                        "127.0.0.1", **self.server.client_kwargs, timeout=self.plan.timeout_ms,
                        identity=self.identity, check_length=False,
                    )  # fmt: skip
                except BertClientError as exc:
                    self.counters.connect_failed(exc)
                    self.stop.wait(1.0)
                    continue
                with client:
                    while not self.stop.is_set():
                        if self.rng.random() < ASYNC_FRACTION:
                            self._non_blocking(client)
                        else:
                            self._blocking(client)
        except BaseException as exc:  # a bug in the soak itself: reported, fails the run
            self.crash = exc

    def _end(self, size_class: str, indices: np.ndarray, got: Any, started: float) -> None:
        outcome = self.expected.check(indices, got)
        self.counters.ended(size_class, outcome, seconds=time.perf_counter() - started, rows=len(indices))

    def _fail(self, size_class: str, exc: BaseException) -> None:
        outcome, kind = _failure(exc)
        self.counters.ended(size_class, outcome, kind=kind)
        if outcome == "busy":
            self.stop.wait(self.rng.uniform(*BUSY_BACKOFF_S))

    def _blocking(self, client: BertClient) -> None:
        size_class, indices = self.plan.draw(self.rng)
        self.counters.sent(size_class)
        started = time.perf_counter()
        try:
            got = client.encode(self.plan.texts(indices))
        except BertClientError as exc:
            self._fail(size_class, exc)
            return
        self._end(size_class, indices, got, started)

    def _non_blocking(self, client: BertClient) -> None:
        pending: dict[int, tuple[str, np.ndarray, float]] = {}
        for _ in range(self.rng.randint(2, 4)):
            size_class, indices = self.plan.draw(self.rng)
            self.counters.sent(size_class)
            try:
                request_id = client.encode(self.plan.texts(indices), blocking=False)
            except BertClientError as exc:
                self._fail(size_class, exc)
                continue
            pending[int(request_id)] = (size_class, indices, time.perf_counter())
        while pending:
            try:
                for result in client.fetch():
                    size_class, indices, started = pending.pop(result.id)
                    self._end(size_class, indices, result.embedding, started)
            except ServerTimeoutError as exc:  # every request still outstanding is given up
                for size_class, _indices, _started in pending.values():
                    self._fail(size_class, exc)
                pending.clear()
            except ServerError as exc:  # one request failed; the others stay outstanding
                if exc.request_id in pending:
                    self._fail(pending.pop(exc.request_id)[0], exc)
                else:
                    raise
