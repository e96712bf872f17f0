"""What ``models.py`` sends to a server of several models, and how it checks every reply.

- :class:`References`: the in-process ``Encoder``'s vector of every corpus sentence, for each
  model's options, and the check of one reply against them (``ok``, ``wrong``, ``crossed``);
- :func:`drive`: clients in threads, each on one model, sending back to back for a window;
- :func:`one_at_a_time`: one-sentence requests, one after another, each timed;
- :class:`Flood`: client processes keeping bulk requests to one model in flight;
- :func:`machine_pair`: what this machine gives two one-thread processes at once, the
  ceiling of the throughput with a neighbour.

Replies are kept during a window and checked after it, so that the check takes no CPU from
the server while it is measured (the flood's processes check theirs as they come: they are
the load, not the measurement).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from bertserve.client import BertClient, ServerBusyError
from bertserve.server.testing.launcher import RunningServer
from lib.stats import latency_row

COSINE_MIN = 0.99999  # a reply row is its sentence's vector when its cosine to the reference is at least this
CLIENT_TIMEOUT_MS = 600_000  # a 1,000-sentence request queued behind others on one core waits a while
WARMUP_SENTENCES = 16


class References:
    """The expected vector of every corpus sentence under each model's options, unit length,
    and the check of a reply: a row is ``ok`` at cosine >= ``COSINE_MIN`` to its own
    sentence's vector under the model asked; a reply with a row that is another sentence's
    vector, or the same sentence's under another model, is ``crossed``; anything else ``wrong``."""

    def __init__(self, vectors: dict[str, np.ndarray]) -> None:
        self.models = list(vectors)
        self.unit = {name: _unit(np.asarray(v, dtype=np.float32)) for name, v in vectors.items()}
        self.size = len(next(iter(self.unit.values())))
        self.dim = int(next(iter(self.unit.values())).shape[1])
        self._all = np.concatenate([self.unit[name] for name in self.models])  # row m * size + i

    def indices(self, start: int, count: int) -> np.ndarray:
        """The corpus indices of ``count`` sentences from ``start`` on, wrapping around."""
        return (start + np.arange(count)) % self.size

    def check(self, model: str, indices: np.ndarray, got: Any) -> tuple[str, float]:
        """The reply's outcome, and the least cosine of its rows to their references (NaN for a bad shape)."""
        got = np.asarray(got, dtype=np.float32)
        if got.ndim != 2 or got.shape != (len(indices), self.dim):
            return "wrong", math.nan
        rows = _unit(got)
        cosines = np.sum(rows * self.unit[model][indices], axis=1)
        least = float(cosines.min())
        bad = cosines < COSINE_MIN
        if not bad.any():
            return "ok", least
        best = np.argmax(rows[bad] @ self._all.T, axis=1)
        matched = np.sum(rows[bad] * self._all[best], axis=1) >= COSINE_MIN
        own = self.models.index(model) * self.size + indices[bad]
        return ("crossed" if np.any(matched & (best != own)) else "wrong"), least

    def cross_model_cosine(self) -> float:
        """The median cosine between the models' vectors of the same sentence: how far apart
        they are, so a reply of the other model would be seen."""
        first, *others = self.models
        if not others:
            return math.nan
        return float(np.median(np.sum(self.unit[first] * self.unit[others[0]], axis=1)))


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


@dataclass
class Tally:
    """How the replies to one model's requests ended."""

    requests: int = 0
    sentences: int = 0
    ok: int = 0
    wrong: int = 0
    crossed: int = 0
    failed: int = 0  # an error instead of vectors
    busy: int = 0  # refused busy (only the flood retries those)
    min_cosine: float = math.nan

    def add(self, outcome: str, sentences: int, cosine: float = math.nan) -> None:
        self.requests += 1
        self.sentences += sentences if outcome in ("ok", "wrong", "crossed") else 0
        setattr(self, outcome, getattr(self, outcome) + 1)
        self.min_cosine = _least(self.min_cosine, cosine)

    def merge(self, other: Tally) -> Tally:
        for name in ("requests", "sentences", "ok", "wrong", "crossed", "failed", "busy"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.min_cosine = _least(self.min_cosine, other.min_cosine)
        return self

    @property
    def bad(self) -> int:
        return self.wrong + self.crossed + self.failed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _least(a: float, b: float) -> float:
    """The smaller of ``a`` and ``b``, NaN standing for none."""
    return b if math.isnan(a) else a if math.isnan(b) else min(a, b)


def client(server: RunningServer, model: str, timeout_ms: float = CLIENT_TIMEOUT_MS) -> BertClient:
    return BertClient(**server.client_kwargs, timeout=timeout_ms, check_length=False, model=model)


# -- clients in threads, back to back ------------------------------------------------------


@dataclass
class _Reply:
    model: str
    start: int
    sent: float
    answered: float
    vectors: np.ndarray


@dataclass
class _Window:
    """All clients warm, then all go together; the window is ``seconds`` from the go."""

    parties: int
    seconds: float
    warmed: threading.Barrier = field(init=False)
    go: threading.Event = field(default_factory=threading.Event)
    start: float = 0.0
    deadline: float = 0.0

    def __post_init__(self) -> None:
        self.warmed = threading.Barrier(self.parties + 1)

    def open(self) -> None:
        self.start = time.perf_counter()
        self.deadline = self.start + self.seconds
        self.go.set()


def _client_loop(
    server: RunningServer,
    model: str,
    offset: int,
    size: int,
    corpus: Sequence[str],
    window: _Window,
    replies: list[_Reply],
    errors: list[str],
) -> None:
    n = len(corpus)
    try:
        with client(server, model) as bert:
            bert.encode([corpus[(offset + i) % n] for i in range(WARMUP_SENTENCES)])
            window.warmed.wait()
            window.go.wait()
            while time.perf_counter() < window.deadline:
                texts = [corpus[(offset + i) % n] for i in range(size)]
                sent = time.perf_counter()
                vectors = bert.encode(texts)
                replies.append(_Reply(model, offset, sent, time.perf_counter(), vectors))
                offset = (offset + size) % n
    except threading.BrokenBarrierError:
        return
    except Exception as exc:
        errors.append(f"{model} client at {offset}: {type(exc).__name__}: {exc}")
        window.warmed.abort()


def drive(
    server: RunningServer,
    clients: dict[str, int],
    corpus: Sequence[str],
    size: int,
    seconds: float,
    references: References,
) -> dict[str, dict[str, Any]]:
    """``clients[model]`` threads per model, each its own ``BertClient`` on that model, send
    ``size`` sentences a request back to back for ``seconds``; a request under way at the end is
    finished and counted. Per model: sentences/s (its sentences over the time from the common
    start to its last reply), request latency, and its replies checked after the window."""
    total = sum(clients.values())
    window = _Window(total, seconds)
    replies: list[_Reply] = []  # list.append is atomic: shared by the threads
    errors: list[str] = []
    threads = []
    for m, (model, count) in enumerate(clients.items()):
        for i in range(count):
            offset = (m * 1201 + i * 157) % len(corpus)  # clients start at different places in the corpus
            args = (server, model, offset, size, corpus, window, replies, errors)
            threads.append(threading.Thread(target=_client_loop, args=args, daemon=True))
    for thread in threads:
        thread.start()
    try:
        window.warmed.wait(timeout=CLIENT_TIMEOUT_MS / 1000)
    except threading.BrokenBarrierError:
        window.go.set()
        raise RuntimeError(f"clients failed before the window opened: {errors[:3]}") from None
    window.open()
    for thread in threads:
        thread.join()
    results = {}
    for model in clients:
        mine = [r for r in replies if r.model == model]
        tally = Tally()
        for reply in mine:
            indices = references.indices(reply.start, len(reply.vectors))
            outcome, cosine = references.check(model, indices, reply.vectors)
            tally.add(outcome, len(indices), cosine)
        failed = [e for e in errors if e.startswith(f"{model} ")]
        tally.failed += len(failed)
        tally.requests += len(failed)
        end = max((r.answered for r in mine), default=window.start)
        elapsed = end - window.start
        results[model] = {
            "clients": clients[model],
            "request_size": size,
            "seconds": round(elapsed, 3),
            "sentences_per_s": round(tally.sentences / elapsed, 1) if elapsed > 0 else math.nan,
            "latency_ms": latency_row([r.answered - r.sent for r in mine]),
            "replies": tally.as_dict(),
            "errors": failed[:5],
        }
    return results


# -- one sentence at a time ----------------------------------------------------------------


def one_at_a_time(
    server: RunningServer, model: str, corpus: Sequence[str], starts: Sequence[int], references: References
) -> tuple[list[float], Tally]:
    """One-sentence requests to ``model``, one after another, the sentences at ``starts``:
    each one's seconds, and their replies checked."""
    seconds: list[float] = []
    tally = Tally()
    with client(server, model) as bert:
        for start in starts:
            text = [corpus[start % len(corpus)]]
            began = time.perf_counter()
            try:
                vectors = bert.encode(text)
            except Exception:
                tally.add("failed", 1)
                continue
            seconds.append(time.perf_counter() - began)
            outcome, cosine = references.check(model, references.indices(start, 1), vectors)
            tally.add(outcome, 1, cosine)
    return seconds, tally


# -- bulk requests from processes of their own ---------------------------------------------


def _flood_client(
    port: int,
    port_out: int,
    model: str,
    corpus: list[str],
    references: References,
    size: int,
    offset: int,
    stop: Any,
    results: Any,
) -> None:
    """One flood process: requests of ``size`` sentences to ``model`` back to back until
    ``stop``; a ``busy`` refusal is retried after a moment. Its tally goes to ``results``."""
    tally = Tally()
    n = len(corpus)
    try:
        with BertClient(
            port=port, port_out=port_out, timeout=CLIENT_TIMEOUT_MS, check_length=False, model=model
        ) as bert:
            while not stop.is_set():
                indices = references.indices(offset, size)
                try:
                    vectors = bert.encode([corpus[i] for i in indices])
                except ServerBusyError:
                    tally.add("busy", size)
                    time.sleep(0.2)
                    continue
                outcome, cosine = references.check(model, indices, vectors)
                tally.add(outcome, size, cosine)
                offset = (offset + size) % n
    except Exception:
        tally.add("failed", size)
    results.put(tally)


class Flood:
    """``clients`` processes (spawned: they import no TensorFlow and take no GIL from the
    measurement) each keeping one request of ``size`` sentences to ``model`` in flight."""

    def __init__(
        self, server: RunningServer, model: str, corpus: Sequence[str], references: References, size: int, clients: int
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._results = context.Queue()
        texts = list(corpus)
        self._processes = []
        for i in range(clients):
            args = (server.port, server.port_out, model, texts, references, size, i * 613, self._stop, self._results)
            self._processes.append(context.Process(target=_flood_client, args=args, daemon=True))

    def start(self) -> None:
        for process in self._processes:
            process.start()

    def stop(self, timeout: float = CLIENT_TIMEOUT_MS / 1000) -> Tally:
        """Stop sending, wait for the requests under way; every process's tally summed (a
        process that does not answer counts as one failed request)."""
        self._stop.set()
        tally = Tally()
        deadline = time.monotonic() + timeout
        for _ in self._processes:
            try:
                tally.merge(self._results.get(timeout=max(1.0, deadline - time.monotonic())))
            except Exception:
                tally.add("failed", 0)
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.kill()
        return tally


# -- the machine's own ceiling -------------------------------------------------------------

_SPIN = """
import time, numpy as np
a, b = np.ones((1536, 384), np.float32), np.ones((384, 1536), np.float32)
n, end = 0, time.perf_counter() + {seconds}
while time.perf_counter() < end:
    a @ b
    n += 1
print(n / {seconds})
"""
"""One process multiplying at the model's widest shape (a bulk job's 1,536 tokens times the
feed-forward layer, 384 x 1,536) on one BLAS thread for ``seconds``; prints products/s."""


def machine_pair(seconds: float = 4.0) -> dict[str, Any]:
    """Products/s of one one-thread process alone, then of each of two at once: on two real
    cores each of the pair keeps its rate (ratio 1); where the two CPUs are one core's
    hyperthreads, or the host shares them out, it does not. The ceiling for one-thread
    workers side by side, whatever the server does."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, "-c", _SPIN.format(seconds=seconds)]

    def rates(count: int) -> list[float]:
        processes = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(count)]
        return [float(process.communicate(timeout=seconds + 60)[0]) for process in processes]

    (alone,) = rates(1)
    pair = rates(2)
    return {
        "alone_per_s": round(alone, 2),
        "pair_per_s": [round(r, 2) for r in pair],
        "ratio": round(sum(pair) / len(pair) / alone, 3),
    }
