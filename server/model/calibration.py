"""A model's calibration ranges: each output dimension's minimum and maximum over a set of
sentences, which the ``int8`` and ``uint8`` embedding types cut into 256 steps
(:func:`bertserve.client.tasks.quantize`, as sentence-transformers' ``quantize_embeddings``).

``bertserve calibrate`` encodes a file of sentences and writes ``calibration.json`` into the
model directory, where the workers find it; ``--calibration FILE`` names another. The file::

    {"format": 1, "dim": 384, "count": 1000, "min": [...], "max": [...]}
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
    low, high = raw.get("min"), raw.get("max")
    for name, values in (("min", low), ("max", high)):
        if not isinstance(values, list) or len(values) != dim:
            raise ModelFileError(f"{path}: {name} should list {dim} numbers, one for each of the model's dimensions")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            raise ModelFileError(f"{path}: {name} should hold finite numbers only")
    ranges = np.asarray([low, high], dtype=np.float32)
    if (ranges[0] > ranges[1]).any():
        raise ModelFileError(f"{path}: a dimension's min is above its max")
    return ranges
