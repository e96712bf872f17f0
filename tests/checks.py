"""Numerical comparisons shared by the tests, and the bounds bf16 holds on this machine's CPU."""

from __future__ import annotations

import numpy as np
from bertserve.server.model.hardware import BF16_FLAGS, cpu

NATIVE_BF16 = bool(cpu().flags and set(BF16_FLAGS) & cpu().flags)
"""Whether this CPU has bf16 matrix instructions (AMX, AVX-512 bf16). Without them TensorFlow
emulates bf16, rounding more on the way (``--dtype auto`` picks fp32 there, and the ready line
says so of an explicit bf16): the bf16 bounds are looser there (:func:`bf16_bound`)."""


def bf16_bound(native: float, emulated: float) -> float:
    """A bound bf16 holds: ``native`` on a CPU with bf16 instructions, else ``emulated``."""
    return native if NATIVE_BF16 else emulated


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of matching rows (any trailing shape is flattened)."""
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
