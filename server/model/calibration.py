"""A model's calibration ranges: each output dimension's minimum and maximum over a set of
sentences, which the ``int8`` and ``uint8`` embedding types cut into 256 steps
(:func:`bertserve.client.tasks.quantize`, as sentence-transformers' ``quantize_embeddings``).

``bertserve calibrate`` encodes a file of sentences and writes ``calibration.json`` into the
model directory, where the workers find it; ``--calibration FILE`` names another. The file::

    {"format": 1, "dim": 384, "count": 1000, "min": [...], "max": [...]}

The ranges are read in float32, where quantizing computes with them: a file whose ranges hold
only in float64 (``1e300``, or bounds float32 cannot tell apart) is refused naming the entry.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from ..config.model import ModelConfig
from ..errors import ModelFileError
from .json_file import read_json

CALIBRATION_FILE = "calibration.json"
_FORMAT = 1


def calibration_path(config: ModelConfig) -> str | None:
    """The calibration file of ``config``'s model: ``calibration`` if given, else the model
    directory's ``calibration.json`` if there is one."""
    if config.calibration is not None:
        return config.calibration
    path = os.path.join(config.model_dir, CALIBRATION_FILE)
    return path if os.path.isfile(path) else None


def ranges_of(vectors: np.ndarray) -> np.ndarray:
    """``(2, D)``: each dimension's minimum and maximum over ``vectors`` ``(N, D)``."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or not len(vectors):
        raise ValueError("calibration needs at least one sentence vector")
    return np.vstack([vectors.min(axis=0), vectors.max(axis=0)]).astype(np.float32)


def write_calibration(path: str, vectors: np.ndarray) -> np.ndarray:
    """Write the ranges of ``vectors`` to ``path``; returns them."""
    ranges = ranges_of(vectors)
    content = {
        "format": _FORMAT,
        "dim": int(ranges.shape[1]),
        "count": len(vectors),
        "min": ranges[0].tolist(),
        "max": ranges[1].tolist(),
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(content, f)
    os.replace(tmp, path)
    return ranges


def read_calibration(path: str, dim: int) -> np.ndarray:
    """The ``(2, dim)`` ranges ``path`` holds, checked; :class:`ModelFileError` naming the fault."""
    if not os.path.isfile(path):
        raise ModelFileError(f"the calibration file {path} does not exist: write one with `bertserve calibrate`")
    raw: dict[str, Any] = read_json(path)
    rows: list[list[float]] = []
    for name in ("min", "max"):
        values = raw.get(name)
        if not isinstance(values, list) or len(values) != dim:
            raise ModelFileError(f"{path}: {name} should list {dim} numbers, one for each of the model's dimensions")
        if not all(_is_finite(v) for v in values):
            raise ModelFileError(f"{path}: {name} should hold finite numbers only")
        rows.append(values)
    return float32_ranges(path, *rows)


def _is_finite(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def float32_ranges(path: str, low: list[float], high: list[float]) -> np.ndarray:
    """``[low, high]`` in float32, where quantizing computes with them, refused naming the first
    entry that does not hold there: a bound beyond float32 (``1e300``), a width ``max - min``
    that overflows it, or two bounds float32 cannot tell apart or cut into 255 steps. Any of
    these makes every int8 and uint8 value of its dimension the same. Bounds the file gives
    equal (a dimension constant over the calibration set) are kept, as quantizing expects."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        ranges = np.asarray([low, high], dtype=np.float64).astype(np.float32)
        width = ranges[1] - ranges[0]
        steps = width / np.float32(255)
    for name, row, values in (("min", 0, low), ("max", 1, high)):
        beyond = np.flatnonzero(~np.isfinite(ranges[row]))
        if beyond.size:
            i = int(beyond[0])
            raise ModelFileError(f"{path}: {name}[{i}] = {values[i]!r} is beyond float32, in which the ranges are used")
    declared = np.asarray(high, dtype=np.float64) - np.asarray(low, dtype=np.float64)
    faults = (
        (declared < 0, "min is above max"),
        (~np.isfinite(width), "max - min overflows float32"),
        ((declared > 0) & (steps <= 0), "float32 cannot cut so narrow a range into 255 steps"),
    )
    for bad, fault in faults:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ModelFileError(f"{path}: min[{i}] = {low[i]!r} and max[{i}] = {high[i]!r}: {fault}")
    return ranges
