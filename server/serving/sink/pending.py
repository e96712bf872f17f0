"""One request as the sink assembles it: the rows placed so far, each counted once, and
the reply they make once all are in (cut to the dimensions asked for)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..protocol import formats
from ..protocol.link_bodies import ResultHeader


class BadParts(ValueError):
    """A result does not fit the request it names."""


class TooManyDimensions(ValueError):
    """A request asked for more dimensions than the model's vectors have."""


@dataclass
class Pending:
    client: bytes
    request_id: int
    count: int
    show_tokens: bool
    deadline: float
    admitted: float = field(default_factory=time.monotonic)
    parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (rows, vectors)
    tokens: list[Any] | None = None
    token_count: int = 0  # tokens of the rows placed, [CLS] and [SEP] included
    chunked: int = 0  # rows placed that were encoded in windows (long_inputs=chunk)
    version: int | None = None  # the model version its rows are computed with, pinned at admission
    format: formats.ReplyFormat = formats.NATIVE  # how its replies are laid out, chosen at admission
    dimensions: int | None = None  # keep the first k dimensions of each vector
    normalize: bool | None = None  # unit-length vectors (its dimensions kept) or not; None: as the model's modules say
    model_normalizes: bool = False  # the model's modules end in a Normalize module, which the graph leaves to us
    model: str = ""  # the served model it runs on: a label of its metrics
    filled: np.ndarray = field(init=False)
    truncated: np.ndarray = field(init=False)  # each row's input was cut to the model's length, as its worker said

    def __post_init__(self) -> None:
        self.filled = np.zeros(self.count, bool)
        self.truncated = np.zeros(self.count, bool)

    @property
    def complete(self) -> bool:
        return bool(self.filled.all())

    def add(
        self,
        rows: np.ndarray,
        vectors: np.ndarray,
        tokens: list[Any] | None,
        counts: np.ndarray | None = None,
        *,
        normalizes: bool = False,
    ) -> None:
        """Place the rows not placed yet; rows already in are duplicates and are skipped.
        ``counts`` holds each row's tokens, whether it was chunked and whether it was cut
        (0 or 1, :func:`row_counts`); ``normalizes`` says the worker's model ends in a
        Normalize module its graph left out."""
        self.model_normalizes = self.model_normalizes or normalizes
        if len(rows) != len(vectors) or (len(rows) and (rows.min() < 0 or rows.max() >= self.count)):
            raise BadParts(f"rows {rows[:8].tolist()}... do not fit a request of {self.count}")
        if self.parts and (vectors.ndim, vectors.shape[2:]) != (self.parts[0][1].ndim, self.parts[0][1].shape[2:]):
            raise BadParts(f"vectors of shape {vectors.shape} do not match {self.parts[0][1].shape}")
        new = ~self.filled[rows]
        if not new.any():
            return
        rows, vectors = rows[new], vectors[new]
        self.filled[rows] = True
        if counts is not None and len(counts) == len(new):
            self.token_count += int(counts[new, 0].sum())
            self.chunked += int(counts[new, 1].sum())
            self.truncated[rows] = counts[new, 2] > 0
        self.parts.append((rows, vectors))
        if self.show_tokens and tokens is not None:
            if self.tokens is None:
                self.tokens = [None] * self.count
            for row, row_tokens in zip(
                rows.tolist(), [t for t, keep in zip(tokens, new, strict=True) if keep], strict=True
            ):
                self.tokens[row] = row_tokens

    def assemble(self) -> np.ndarray:
        first = self.parts[0][1]
        tail = list(first.shape[1:])
        if first.ndim == 3:  # per-token vectors: parts may be padded to different widths
            tail[0] = max(vectors.shape[1] for _, vectors in self.parts)
        out = np.zeros([self.count, *tail], dtype=first.dtype)
        for rows, vectors in self.parts:
            if vectors.ndim == 3:
                out[rows, : vectors.shape[1]] = vectors
            else:
                out[rows] = vectors
        out = out if self.dimensions is None else self._cut(out)
        normalize = self.model_normalizes if self.normalize is None else self.normalize
        if normalize and out.ndim == 2:
            rows = out.astype(np.float32, copy=False)  # out is this request's own: scaled in place
            rows /= np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-12)
            out = rows.astype(out.dtype, copy=False)
        return out

    def _cut(self, out: np.ndarray) -> np.ndarray:
        """The first ``dimensions`` of each vector (Matryoshka)."""
        k = self.dimensions
        assert k is not None
        if k > out.shape[-1]:
            raise TooManyDimensions(
                f"dimensions={k} is more than this model's {out.shape[-1]} dimensions: ask for 1 to {out.shape[-1]}"
            )
        return np.ascontiguousarray(out[..., :k])


def row_counts(header: ResultHeader, rows: int) -> np.ndarray:
    """Each row's token count, whether it was chunked and whether it was cut, as ``[rows, 3]``
    (no tokens counted where the worker did not say them)."""
    lengths, windows = header.lengths, header.windows
    counts = np.zeros((rows, 3), np.int64)
    if isinstance(lengths, list) and len(lengths) == rows:
        counts[:, 0] = np.asarray(lengths, dtype=np.int64)
        if isinstance(windows, list) and len(windows) == rows:
            counts[:, 1] = np.asarray(windows, dtype=np.int64) > 1
    counts[:, 2] = np.asarray(header.truncated, dtype=bool)  # as many as the rows: checked by its schema
    return counts
