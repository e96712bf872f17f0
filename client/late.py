"""Late interaction, for the clients and the server alike: the forms of a multi-vector answer,
MaxSim, and the several outputs of one request to a late-interaction model (BGE-M3's dense,
sparse and token vectors from one model run) as one array and back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .tasks import SparseVector, quantize

MULTIVECTOR_TYPES = ("float", "float16", "binary", "ubinary")
"""The forms a multi-vector answer can take over HTTP: float32 values, float16 values (rounded to
half precision), or one bit a dimension packed 8 to a byte (``binary`` as int8, ``ubinary`` as
uint8, as :data:`EMBEDDING_TYPES` packs a sentence vector)."""


def multivector_rows(vectors: np.ndarray) -> list[np.ndarray]:
    """``(N, T, D)`` token vectors as the server sends them, one ``(tokens, D)`` float32 array
    an input: the zero rows that pad an input's vectors to the longest's left out (a token
    vector is normalized, never zero)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    rows = []
    for row in vectors:
        real = np.flatnonzero(np.any(row != 0, axis=-1))
        rows.append(np.ascontiguousarray(row[: int(real[-1]) + 1 if len(real) else 0]))
    return rows


def multivector_form(vectors: np.ndarray, kind: str) -> np.ndarray:
    """One input's ``(tokens, D)`` vectors in the form ``kind`` of :data:`MULTIVECTOR_TYPES`."""
    if kind == "float16":
        return np.asarray(vectors, np.float32).astype(np.float16)
    if kind not in MULTIVECTOR_TYPES:
        raise ValueError(f"unknown multivector type {kind!r}; one of {', '.join(MULTIVECTOR_TYPES)}")
    return quantize(vectors, kind)


OUTPUTS = ("embed", "sparse", "multivector")
"""What one request may ask of a late-interaction model at once (``outputs``), each from the
same model run of each text: the dense vector, the sparse weights, the token vectors."""


OUTPUTS_TASK = "outputs:"
"""How the server names the task of a request for several outputs inside a job: ``outputs:``
and the outputs, in order (``outputs:embed,sparse``)."""


def check_outputs(value: object) -> tuple[str, ...]:
    """``outputs``: a non-empty list of :data:`OUTPUTS`, each once; ``ValueError`` otherwise."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"outputs must be a non-empty list of {', '.join(OUTPUTS)}, not {value!r}"[:200])
    for output in value:
        if output not in OUTPUTS:
            raise ValueError(f"outputs may hold {', '.join(OUTPUTS)}, not {output!r}"[:200])
    if len(set(value)) != len(value):
        raise ValueError("outputs names an output twice")
    return tuple(value)


def pack_outputs(answers: Mapping[str, np.ndarray], outputs: Sequence[str], width: int) -> np.ndarray:
    """Several outputs of each input as one ``(N, R, width)`` float32 array, as the server sends
    them (:func:`unpack_outputs` reads it): an input's first row holds its counts (sparse terms,
    token vectors), then its dense vector (one row), its ``[id, weight]`` pairs (flattened, in
    rows of ``width``), its token vectors (a row each), zero rows after. Ids below 2**24 are
    exact in float32."""
    rows = []
    count = len(next(iter(answers.values())))
    for i in range(count):
        parts = [np.zeros((1, width), np.float32)]
        if "embed" in outputs:
            parts.append(_widened(answers["embed"][i][None], width))
        if "sparse" in outputs:
            pairs = answers["sparse"][i]
            pairs = pairs[pairs[:, 1] != 0]
            parts[0][0, 0] = len(pairs)
            flat = pairs.reshape(-1)
            parts.append(_widened(np.pad(flat, (0, -len(flat) % width)).reshape(-1, width), width))
        if "multivector" in outputs:
            vectors = answers["multivector"][i]
            vectors = vectors[np.any(vectors != 0, axis=-1)]
            parts[0][0, 1] = len(vectors)
            parts.append(_widened(vectors, width))
        rows.append(np.concatenate(parts))
    out = np.zeros((count, max((len(r) for r in rows), default=1), width), np.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def unpack_outputs(packed: np.ndarray, outputs: Sequence[str], dims: Mapping[str, int]) -> list[dict[str, Any]]:
    """Each input's outputs from :func:`pack_outputs`' array: ``embed`` a vector of
    ``dims["embed"]`` values, ``sparse`` a :class:`SparseVector`, ``multivector`` a ``(tokens,
    dims["multivector"])`` array."""
    answers = []
    for row in np.asarray(packed, np.float32):
        terms, tokens = int(row[0, 0]), int(row[0, 1])
        at, width, answer = 1, row.shape[1], {}
        if "embed" in outputs:
            answer["embed"] = row[at, : dims["embed"]].copy()
            at += 1
        if "sparse" in outputs:
            used = -(-2 * terms // width)
            pairs = row[at : at + used].reshape(-1)[: 2 * terms].reshape(terms, 2)
            answer["sparse"] = SparseVector(pairs[:, 0].astype(np.int32), pairs[:, 1].copy())
            at += used
        if "multivector" in outputs:
            answer["multivector"] = row[at : at + tokens, : dims["multivector"]].copy()
        answers.append(answer)
    return answers


def _widened(rows: np.ndarray, width: int) -> np.ndarray:
    return np.pad(np.asarray(rows, np.float32), ((0, 0), (0, width - rows.shape[1])))


def maxsim(query: np.ndarray, document: np.ndarray, *, mean: bool = False) -> float:
    """Late interaction: for each query token vector its best dot product with any of the
    document's, summed over the query's tokens (ColBERT's score), or with ``mean`` averaged
    (BGE-M3's)."""
    best = (np.asarray(query, np.float32) @ np.asarray(document, np.float32).T).max(axis=1)
    return float(best.mean() if mean else best.sum())
