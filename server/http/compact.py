"""Compact embeddings over HTTP: Cohere's ``embedding_types`` (``float``, ``int8``, ``uint8``,
``binary``, ``ubinary``) on ``/v1/embeddings`` and ``/embed``, made from the float vectors as
sentence-transformers' ``quantize_embeddings`` makes them (:func:`bertserve.client.tasks.quantize`).
int8 and uint8 need the model's calibration ranges (its ``CONFIG`` answer's ``calibration_ranges``)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from bertserve.client import late, tasks as t

from .schemas import HTTPError


def requested(value: Any) -> tuple[str, ...] | None:
    """The types ``embedding_types`` asks for, checked; None when it is left out."""
    if value is None:
        return None
    try:
        return t.check_embedding_types(value)
    except ValueError as exc:
        raise HTTPError(422, str(exc), param="embedding_types") from None


def requested_multivector(value: Any) -> tuple[str, ...] | None:
    """The types a multi-vector request's ``embedding_types`` asks for
    (:data:`~bertserve.client.late.MULTIVECTOR_TYPES`), checked; None when it is left out."""
    if value is None:
        return None
    types = [value] if isinstance(value, str) else value
    if not isinstance(types, list) or not types or len(set(map(repr, types))) != len(types):
        raise HTTPError(
            422,
            f"embedding_types must be one of {', '.join(late.MULTIVECTOR_TYPES)} or a non-empty list of them, "
            "each once",
            param="embedding_types",
        )
    for kind in types:
        if kind not in late.MULTIVECTOR_TYPES:
            raise HTTPError(
                422,
                f"embedding_types {str(kind)[:40]!r} is not answered for multi-vectors: "
                f"one of {', '.join(late.MULTIVECTOR_TYPES)}",
                param="embedding_types",
            )
    return tuple(types)


def forms(vectors: np.ndarray, types: tuple[str, ...], info: dict[str, Any]) -> dict[str, np.ndarray]:
    """``vectors`` in each of ``types``; a 422 that says how to calibrate for int8 and uint8
    without ranges. The ranges of the first dimensions serve vectors cut to ``dimensions``."""
    calibrated = t.calibration_ranges(info) is not None
    out = {}
    for kind in types:
        if kind in ("int8", "uint8") and not calibrated:
            raise HTTPError(422, f"embedding_types {kind}: {t.CALIBRATION_ADVICE}", param="embedding_types")
        out[kind] = t.compact(vectors, kind, info)
    return out


def encoded(array: np.ndarray, encoding_format: str) -> Any:
    """Each row of ``array`` as JSON numbers, or with ``base64`` its bytes (little-endian)."""
    if encoding_format != "base64":
        return array
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return [base64.b64encode(row.tobytes()).decode() for row in little]


_JSON_VALUE_BYTES = {"float": 16.0, "float16": 12.0, "int8": 5.0, "uint8": 5.0, "binary": 5 / 8, "ubinary": 5 / 8}
"""The most bytes one value of a vector takes in a JSON answer, by type: a float32 as text with
its comma; a byte as a number; binary types pack 8 values in a byte."""
_BASE64_VALUE_BYTES = {
    "float": 16 / 3,
    "float16": 8 / 3,
    "int8": 4 / 3,
    "uint8": 4 / 3,
    "binary": 1 / 6,
    "ubinary": 1 / 6,
}


def json_value_bytes(types: tuple[str, ...] | None, encoding_format: str = "float") -> float:
    """What one value of a vector costs in the JSON answer of ``types`` (None: floats), each
    type answered; base64 packs each row's bytes."""
    table = _BASE64_VALUE_BYTES if encoding_format == "base64" else _JSON_VALUE_BYTES
    return sum(table[kind] for kind in types or ("float",))
