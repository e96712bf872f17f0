"""Clients in threads encoding under a model swap, every reply checked against the version it names."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from bertserve.client import BertClient

COSINE_MIN = 0.99999


class Load:
    """Clients in threads encoding random corpus slices of ``sizes`` on ``model`` (the
    default: the server's), each request after the last (and a pause, exponential with mean
    ``think_s``); every reply checked against ``references`` of the version it names (cosine
    >= :data:`COSINE_MIN` each row). Records (sent, seconds, outcome, version) per request;
    a failed request is told to ``log``."""

    def __init__(
        self,
        server: Any,
        texts: list[str],
        references: dict[int | None, np.ndarray],
        sizes: tuple[int, ...],
        *,
        model: str | None = None,
        think_s: float = 0.0,
        log: Callable[[str], None],
    ) -> None:
        self.server, self.texts, self.references, self.sizes = server, texts, references, sizes
        self.model, self.think_s, self.log = model, think_s, log
        self.records: list[tuple[float, float, str, int | None]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, clients: int) -> None:
        self.threads = [threading.Thread(target=self._loop, args=(seed,)) for seed in range(clients)]
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)

    def _loop(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        with BertClient(**self.server.client_kwargs, timeout=120_000, model=self.model) as client:
            while not self.stop.is_set():
                size = int(rng.choice(self.sizes))
                start = int(rng.integers(0, len(self.texts) - size))
                sent = time.monotonic()
                version = None
                try:
                    vectors = client.encode(self.texts[start : start + size])
                    version = client.last_info.get("model_version")
                    want = self.references.get(version)
                    ok = want is not None and bool(
                        np.min(np.sum(vectors * want[start : start + size], axis=1)) >= COSINE_MIN
                    )
                    outcome = "ok" if ok else "wrong"
                except Exception as exc:
                    self.log(f"a request{f' to {self.model}' if self.model else ''} failed: {exc}")
                    outcome = "failed"
                with self.lock:
                    self.records.append((sent, time.monotonic() - sent, outcome, version))
                if self.think_s:
                    self.stop.wait(rng.exponential(self.think_s))

    def seconds(self, start: float, end: float, *, ok_only: bool = True) -> list[float]:
        """The latencies of the requests sent from ``start`` to ``end`` (those answered right)."""
        return [r[1] for r in self.records if start <= r[0] < end and (r[2] == "ok" or not ok_only)]

    def count(self, outcome: str) -> int:
        return sum(r[2] == outcome for r in self.records)

    def by_version(self) -> dict[str, int]:
        """Replies (and failures, under ``None``) by the model version they name."""
        return dict(Counter(str(r[3]) for r in self.records))
