"""What every scenario of ``shared.py`` shares: its servers, clients, corpus and log."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer, start_server
from lib.inputs import cycle_take
from lib.load import timed
from lib.report import Progress
from lib.stats import cosine_rows

RSS_LIMIT_MIB = 64.0
TIMEOUT_MS = 120_000

log = Progress()


@dataclass
class Bench:
    """The model and corpus of a run, where its servers' logs go, and how each server stopped."""

    model_dir: Path
    corpus: list[str]
    scratch: Path
    base_flags: tuple[str, ...] = ()
    failed: bool = False
    stops: list[dict[str, Any]] = field(default_factory=list)

    def texts(self, count: int, offset: int = 0) -> list[str]:
        return cycle_take(self.corpus, offset, count)

    @contextmanager
    def server(self, name: str, *flags: str, env: dict[str, str] | None = None) -> Iterator[RunningServer]:
        log(f"{name}: starting a server {' '.join(flags)}")
        server = start_server(*self.base_flags, *flags, env=env, echo=False, log_path=self.scratch / f"{name}.log")
        log(f"{name}: ready in {server.ready_seconds:.1f} s")
        try:
            yield server
        finally:
            seconds, problems = timed(lambda: (server.terminate(), server.wait_stopped())[1])
            log(f"{name}: stopped in {seconds:.1f} s{'; ' + '; '.join(problems) if problems else ''}")
            self.stops.append({"scenario": name, "seconds": round(seconds, 2), "problems": problems})
            if problems:
                self.failed = True

    def server_log(self, name: str) -> str:
        """Everything the server of scenario ``name`` printed (its output keeps only the tail)."""
        return (self.scratch / f"{name}.log").read_text(encoding="utf-8", errors="replace")

    def client(self, server: RunningServer, **options: Any) -> BertClient:
        return BertClient(**server.client_kwargs, timeout=options.pop("timeout", TIMEOUT_MS), **options)


def compare_vectors(got: Any, reference: np.ndarray) -> tuple[float, float]:
    """(max abs difference, min row cosine) of ``got`` against ``reference``."""
    got = np.asarray(got)
    if got.shape != reference.shape:
        return float("inf"), -1.0
    return float(np.abs(got - reference).max()), float(cosine_rows(got, reference).min())


def is_wrong(diff: float, cosine: float) -> bool:
    return not (diff < 1e-3 and cosine > 0.9999)
