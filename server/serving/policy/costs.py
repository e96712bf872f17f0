"""What a request costs, counted before any of its work runs: the tokens of model work it asks
for, and the bytes of its answer. Pure functions of the inputs' sizes and of what a model's
workers said of it (its ``CONFIG`` facts); nothing here tokenizes.

**Tokens.** Each input costs the tokens the model runs of it. Uncut, that is at most its UTF-8
bytes and the special tokens the model adds (no tokenizer here makes more than one token of a
byte of text); cut to the model's length, at most ``max_len``; encoded in windows
(``long_inputs=chunk``), every window's tokens. A rerank pair is its query and its document,
counted for each pair. The count is an upper bound known before any tokenizer runs.

**Bytes.** An answer holds ``rows x values x bytes``: ``values`` is a vector's width (the
``dimensions`` asked for, else the model's), times the model's length for a model that returns
one vector per token (a late-interaction model's multi-vector: its length's, of its token
vectors' width); a sparse (SPLADE) row is at most every vocabulary entry, each an id and a
weight (a late-interaction model's: a term a token). The bytes of a value are those of the
array the workers and the sink hold, or, for an HTTP answer, of the JSON text that carries it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from bertserve.client.late import OUTPUTS_TASK

SPARSE_TERM_BYTES = 8
"""A sparse row's term as the workers send it: its vocabulary id and its weight, 4 bytes each."""
JSON_FLOAT_BYTES = 16
"""The most a float32 takes as JSON text, with its comma (``-1.2345678e-05,``)."""
JSON_SPARSE_TERM_BYTES = 40
"""The most a sparse term takes as JSON: ``{"index":250001,"value":1.2345678e-05},``."""


@dataclass(frozen=True)
class TokenRule:
    """How one model turns an input's bytes into tokens, at most: its length, the special
    tokens it adds to an input and to a pair, and the tokens consecutive windows share."""

    max_len: int
    single: int
    pair: int
    stride: int = 0

    def row(self, nbytes: int, *, pair: bool = False, chunk: bool = False) -> int:
        """The most tokens the model runs of one input of ``nbytes`` UTF-8 bytes."""
        specials = self.pair if pair else self.single
        if not chunk or pair:  # a pair is cut, never encoded in windows
            return min(self.max_len, nbytes + specials)
        content = self.max_len - self.single
        step = max(1, content - self.stride)
        windows = 1 if nbytes <= content else 1 + -(-(nbytes - content) // step)
        return nbytes + self.single * windows + self.stride * (windows - 1)


def utf8_bytes(text: str) -> int:
    """``len(text.encode())``, without making the copy."""
    if text.isascii():
        return len(text)
    return sum(1 if c < "\x80" else 2 if c < "\u0800" else 3 if c < "\U00010000" else 4 for c in text)


def input_tokens(
    rule: TokenRule, texts: Iterable[Any], *, chunk: bool = False, prefix_bytes: int = 0, separator: str = "|||"
) -> int:
    """The most tokens of model work in ``texts``: strings (a pair written with ``separator``)
    or pre-tokenized inputs (lists of tokens, each at most one token of work), each with a
    prompt of ``prefix_bytes`` before it."""
    total = 0
    for text in texts:
        if isinstance(text, str):
            total += rule.row(prefix_bytes + utf8_bytes(text), pair=separator in text, chunk=chunk)
        else:
            tokens = list(text)
            pair = separator in tokens
            total += rule.row(prefix_bytes + len(tokens) - pair, pair=pair, chunk=chunk)
    return total


def pair_tokens(rule: TokenRule, query_bytes: int, document_bytes: Iterable[int]) -> int:
    """The most tokens of model work in ranking documents of ``document_bytes`` UTF-8 bytes
    against a query of ``query_bytes``: the query counted again in every pair."""
    return sum(rule.row(query_bytes + size, pair=True) for size in document_bytes)


def too_many_tokens(total: int, limit: int) -> str | None:
    """Why a request of ``total`` tokens is refused, or None."""
    if total <= limit:
        return None
    return (
        f"the request asks for up to {total} tokens of model work (each input at most the model's length; "
        f"a rerank pair counts its query and its document); this server takes at most {limit} tokens per "
        "request (--max-request-tokens): send fewer or shorter inputs per request"
    )


def row_values(info: Mapping[str, Any], dimensions: int | None = None, task: str | None = None) -> int:
    """The most values one row of the answer to a request of ``task`` (by default the model's
    own) holds, by what the model's workers said of it (``output_dim``, ``token_level``,
    ``max_seq_len``, ``task``; a late-interaction model's ``multivector_dim`` and
    ``query_length``); 0 if they have not said."""
    width = info.get("output_dim")
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        return 0
    if info.get("late") and task not in (None, "embed"):
        return _late_values(info, task)
    if dimensions is not None and 1 <= dimensions < width and info.get("task", "embed") == "embed":
        width = dimensions
    length = info.get("max_seq_len")
    if info.get("token_level") and isinstance(length, int) and not isinstance(length, bool) and length > 0:
        width *= length
    return width


def _late_values(info: Mapping[str, Any], task: str, positions: int | None = None) -> int:
    """A late-interaction model's row: a score, a term a token (an id and a weight: its
    ``SPARSE_TERM_BYTES`` count it), or a vector a position, of at most ``positions`` (by
    default its length) token positions."""
    if task == "rerank":
        return 1
    if positions is None:
        positions = max(_count(info.get("max_seq_len")), _count(info.get("query_length")))
    if task.startswith(OUTPUTS_TASK):  # packed a row of the widest output's width each (client.late.pack_outputs)
        outputs = task[len(OUTPUTS_TASK) :].split(",")
        width = max(_count(info.get("output_dim")), _count(info.get("multivector_dim")), 2)
        rows = 1 + ("embed" in outputs) + ("multivector" in outputs) * positions
        return (rows + ("sparse" in outputs) * -(-2 * positions // width)) * width
    return positions if task == "sparse" else positions * _count(info.get("multivector_dim"))


LATE_EXTRA_TOKENS = 4
"""The most tokens a late-interaction model adds to a text beyond one a UTF-8 byte: ColBERT's
[CLS], prefix and [SEP] (BGE-M3's ``<s>`` and ``</s>``), and one to spare."""


def token_answer_bytes(
    info: Mapping[str, Any], texts: Iterable[Any], task: str, value_bytes: float, *, query: bool = False
) -> list[int]:
    """The most bytes of each input's answer to a request of ``task`` of a late-interaction
    model whose answer is a vector a token (``multivector``, or ``outputs`` holding it): one
    for each of its positions, at most its UTF-8 bytes and :data:`LATE_EXTRA_TOKENS`, at most
    the model's length (a ColBERT query: its query length, every position a vector); each
    value ``value_bytes``."""
    length, query_length = _count(info.get("max_seq_len")), _count(info.get("query_length"))
    sizes = []
    for text in texts:
        if query and query_length:
            positions = query_length
        else:
            size = utf8_bytes(text) if isinstance(text, str) else len(list(text))
            positions = min(length, size + LATE_EXTRA_TOKENS) if length else size + LATE_EXTRA_TOKENS
        sizes.append(math.ceil(_late_values(info, task, positions) * value_bytes))
    return sizes


def answers_by_token(info: Mapping[str, Any], task: str | None) -> bool:
    """Whether a request of ``task`` gets a late-interaction model's vectors a token, whose
    answer is counted by its inputs' sizes (:func:`token_answer_bytes`)."""
    return bool(info.get("late")) and task is not None and (task == "multivector" or task.startswith(OUTPUTS_TASK))


def too_large_answer(sizes: Sequence[int], limit: int, what: str = "", how: str = "") -> str | None:
    """Why an answer of inputs of ``sizes`` bytes is refused, or None: past ``limit``, how many
    of its first inputs would fit (at least one, which is always answered)."""
    total = sum(sizes)
    if total <= limit or len(sizes) == 1:  # a request of one input is always answered, as by too_large_reply
        return None
    fits = max(1, int(np.searchsorted(np.cumsum(sizes), limit, side="right")))
    return (
        f"the answer would take up to {total / 2**20:.1f} MiB{what} ({len(sizes)} inputs, a vector for each "
        f"of their tokens); this server answers at most {limit / 2**20:.1f} MiB per request (--max-reply-bytes): "
        f"send at most {fits} of these inputs per request" + (f", {how}" if how else "")
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def reply_row_bytes(info: Mapping[str, Any], dimensions: int | None = None, task: str | None = None) -> int:
    """The most bytes one row of the answer to a request of ``task`` (by default the model's
    own) takes as the workers send it and the sink holds it."""
    values = row_values(info, dimensions, task)
    if (task or info.get("task")) == "sparse":
        return values * SPARSE_TERM_BYTES
    return values * (2 if info.get("output_dtype") == "float16" else 4)


def reply_rows(limit: int, row_bytes: int) -> int | None:
    """The most rows an answer of ``row_bytes`` a row may hold within ``limit`` bytes (at least
    one: a row larger than the limit is the model's, and a request of one is always answered)."""
    return max(1, limit // row_bytes) if row_bytes > 0 else None


def too_large_reply(rows: int, row_bytes: int, limit: int, what: str = "") -> str | None:
    """Why an answer of ``rows`` rows of ``row_bytes`` is refused, or None."""
    fits = reply_rows(limit, row_bytes)
    if fits is None or rows <= fits:
        return None
    return (
        f"the answer would take up to {rows * row_bytes / 2**20:.1f} MiB{what} ({rows} inputs of up to "
        f"{row_bytes} bytes each); this server answers at most {limit / 2**20:.1f} MiB per request "
        f"(--max-reply-bytes): send at most {fits} inputs per request"
    )
