"""Long inputs encoded in windows instead of truncated (``long_inputs="chunk"``).

An input longer than ``max_seq_len`` tokens is cut into windows of ``max_seq_len`` tokens,
each with its own ``[CLS]`` and ``[SEP]``, consecutive windows sharing ``chunk_stride``
tokens (the tokenizer makes them: :meth:`.tokenization.WordPieceTokenizer.tokenize` with
``chunk``). Every window is encoded like any input, and :func:`combine` turns the window
vectors back into one vector per input:

- REDUCE_MEAN: the mean of the window vectors, each weighted by the tokens it pooled, so a
  short last window counts for what it holds (without overlap, this is the mean over all
  the input's tokens);
- REDUCE_MAX: the element-wise maximum;
- REDUCE_MEAN_MAX: each layer's mean half and max half, so.

The window vectors combined are the graph's, before the model's L2 normalization
(:func:`~.graph.serving_graph`), which applies to the combined vector.

The other poolings describe one position (CLS_TOKEN, SEP_TOKEN, CLS_POOLED: the first or
last token of one window, which says nothing of the others) or every token (NONE), so they
cannot be combined and are refused with ``chunk`` (:func:`check_chunkable`).
"""

from __future__ import annotations

import numpy as np

from ..config.model import PoolingStrategy
from ..errors import ModelOptionError

CHUNKABLE = (PoolingStrategy.REDUCE_MEAN, PoolingStrategy.REDUCE_MAX, PoolingStrategy.REDUCE_MEAN_MAX)


def chunk_refusal(strategy: PoolingStrategy | str | None) -> str | None:
    """Why inputs pooled by ``strategy`` cannot be chunked; ``None`` if they can."""
    if strategy is None:
        return None
    strategy = PoolingStrategy.parse(strategy)
    if strategy in CHUNKABLE:
        return None
    if strategy is PoolingStrategy.NONE:
        what = "NONE pooling returns a vector per token, which windows cannot be merged into"
    elif strategy in (PoolingStrategy.REDUCE_MEAN_SQRT_LEN, PoolingStrategy.WEIGHTED_MEAN):
        what = (
            f"{strategy.value} reads every token, but its windows' vectors cannot be merged into the whole "
            "input's: the square root of each window's count, or each token's weight by its place in the "
            "window, is not what it is in the whole input"
        )
    else:
        what = f"{strategy.value} takes one token of one window, which says nothing of the other windows"
    return f"long_inputs=chunk needs REDUCE_MEAN, REDUCE_MAX or REDUCE_MEAN_MAX pooling: {what}"


def check_chunkable(strategy: PoolingStrategy | str | None) -> None:
    refusal = chunk_refusal(strategy)
    if refusal is not None:
        raise ModelOptionError(refusal)


def combine(
    vectors: np.ndarray,
    owners: np.ndarray,
    weights: np.ndarray,
    *,
    strategy: PoolingStrategy,
    layers: int,
) -> np.ndarray:
    """One row per input from one row per window: ``owners[w]`` is the input window ``w``
    belongs to (every input has at least one), ``weights[w]`` the tokens it pooled;
    ``layers`` is how many pooled layers each vector concatenates."""
    count = int(owners.max()) + 1 if len(owners) else 0
    rows = vectors.astype(np.float32, copy=False)
    if strategy is PoolingStrategy.REDUCE_MEAN_MAX:
        blocks = rows.reshape(len(rows), layers, 2, -1)
        mean = _weighted_mean(blocks[:, :, 0].reshape(len(rows), -1), owners, weights, count)
        maximum = _maximum(blocks[:, :, 1].reshape(len(rows), -1), owners, count)
        out = np.stack([mean.reshape(count, layers, -1), maximum.reshape(count, layers, -1)], axis=2)
        out = out.reshape(count, -1)
    elif strategy is PoolingStrategy.REDUCE_MAX:
        out = _maximum(rows, owners, count)
    elif strategy is PoolingStrategy.REDUCE_MEAN:
        out = _weighted_mean(rows, owners, weights, count)
    else:
        check_chunkable(strategy)
        raise AssertionError("unreachable")
    return out.astype(vectors.dtype, copy=False)


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Each row of ``vectors`` scaled to unit length (in fp32), in their dtype."""
    rows = vectors.astype(np.float32)
    rows /= np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-12)
    return rows.astype(vectors.dtype, copy=False)


def _weighted_mean(rows: np.ndarray, owners: np.ndarray, weights: np.ndarray, count: int) -> np.ndarray:
    weights = np.maximum(weights.astype(np.float32), 1.0)  # a window pools at least one token
    total = np.zeros((count, rows.shape[1]), np.float32)
    np.add.at(total, owners, rows * weights[:, None])
    return total / np.bincount(owners, weights=weights, minlength=count).astype(np.float32)[:, None]


def _maximum(rows: np.ndarray, owners: np.ndarray, count: int) -> np.ndarray:
    out = np.full((count, rows.shape[1]), -np.inf, np.float32)
    np.maximum.at(out, owners, rows)
    return out
