"""Numbers from timings: percentiles, medians, ratios, cosines, and how the reports print them.

One helper for each: a percentile is ``percentile_ms``, whatever table it ends in; a median
of nothing is NaN, and so is a ratio with nothing on either side.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def percentile_ms(seconds: Sequence[float], q: float, digits: int | None = None) -> float:
    """The ``q``-th percentile of ``seconds`` in milliseconds (NaN when there are none),
    rounded to ``digits`` if given."""
    if not len(seconds):
        return math.nan
    value = float(np.percentile(np.asarray(seconds) * 1000, q))
    return value if digits is None else round(value, digits)


@dataclass(frozen=True)
class Percentiles:
    """Request latency in milliseconds, to two decimals."""

    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Percentiles:
        return cls(*(percentile_ms(seconds, q, 2) for q in (50, 90, 99)))


def latency_row(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p90 and p99 in milliseconds, and the count: a row of a one-request latency table."""
    return {f"p{q}_ms": percentile_ms(seconds, q) for q in (50, 90, 99)} | {"count": len(seconds)}


def median(values: Sequence[float]) -> float:
    """The median, NaN when there are no values."""
    return float(statistics.median(values)) if values else math.nan


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when either is NaN or ``b`` is zero."""
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def clean(value: float) -> float | None:
    """``value`` rounded for JSON, or None for NaN."""
    return None if math.isnan(value) else round(value, 4)


def milliseconds(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with the same row of ``b``."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return np.sum(a64 * b64, axis=1) / np.maximum(norms, 1e-12)
