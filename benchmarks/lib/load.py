"""Calls that take turns, and the small timing helpers the scenarios share."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from lib.stats import latency_row


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``fn()`` took, and what it returned."""
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    """Poll ``predicate`` every ``interval`` seconds until it holds or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def take_turns(calls: dict[str, Callable[[list[str]], Any]], texts: Sequence[str], warmup: int) -> dict[str, dict]:
    """Time each call on each text alone, the calls taking turns (rotated per text); the
    first ``warmup`` texts are not timed. Per call: :func:`lib.stats.latency_row`."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i, text in enumerate(texts):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            calls[name]([text])
            if i >= warmup:
                times[name].append(time.perf_counter() - started)
    return {name: latency_row(values) for name, values in times.items()}
