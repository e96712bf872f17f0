"""What a reply becomes on the client's side: an :class:`EncodeResult`, or the
:class:`~bertserve.client.errors.ServerError` it carries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import numpy as np

from ..errors import ServerBusyError, ServerError, UnknownModelError
from ..protocol import BUSY, UNKNOWN_MODEL, Reply

Embedding: TypeAlias = "np.ndarray | list[Any]"
"""One request's vectors: an array, or nested lists with ``output_fmt="list"``."""

_REPLY_INFO = ("token_count", "chunked", "truncated", "model_version", "model")  # reply header fields kept in last_info
_ERRORS = {BUSY: ServerBusyError, UNKNOWN_MODEL: UnknownModelError}  # the kinds a caller may catch on their own


@dataclass(frozen=True)
class EncodeResult:
    """The answer to one non-blocking request, as :meth:`BertClient.fetch` yields it."""

    id: int
    embedding: Embedding
    tokens: list[list[str]] | None = None
    info: dict[str, Any] = field(default_factory=dict)  # token_count, chunked, truncated...: see BertClient.last_info


def server_error(reply: Reply) -> ServerError:
    """The error an error reply carries: :class:`ServerBusyError` for a refusal of kind busy,
    :class:`UnknownModelError` for a model the server does not serve."""
    message = str(reply.header.get("error", "the server gave no reason"))
    kind = reply.header.get("kind")
    error = _ERRORS.get(kind, ServerError) if isinstance(kind, str) else ServerError
    return error(message, kind=None if kind is None else str(kind), request_id=reply.request_id)


def answer(reply: Reply) -> dict[str, Any]:
    """The answer to a command (CONFIG, STATUS, ...), or its error raised."""
    if not reply.ok:
        raise server_error(reply)
    return reply.header


def encode_result(reply: Reply, show_tokens: bool, output_fmt: Literal["ndarray", "list"]) -> EncodeResult:
    """The answer to an ENCODE request in ``output_fmt``, or its error raised."""
    if not reply.ok:
        raise server_error(reply)
    array = reply.array().copy()  # own the memory, not the ZeroMQ frame's
    embedding: Embedding = array.tolist() if output_fmt == "list" else array
    tokens = reply.header.get("tokens") if show_tokens else None
    info = {key: reply.header[key] for key in _REPLY_INFO if key in reply.header}
    return EncodeResult(reply.request_id, embedding, tokens, info)


def empty_embedding(
    config: dict[str, Any], output_fmt: Literal["ndarray", "list"], dimensions: int | None = None
) -> Embedding | None:
    """The answer to an empty request, if the server's ``config`` tells its shape (``dimensions``
    wide if given)."""
    dim = config.get("output_dim")
    if isinstance(dim, bool) or not isinstance(dim, int) or config.get("token_level"):
        return None
    dim = min(dim, dimensions or dim)
    dtype = config.get("output_dtype")
    empty = np.zeros((0, dim), np.float16 if dtype == "float16" else np.float32)
    return empty.tolist() if output_fmt == "list" else empty


def shaped(
    embedding: Embedding, tokens: list[list[str]] | None, show_tokens: bool
) -> Embedding | tuple[Embedding, list[list[str]]]:
    """What ``encode`` returns: the vectors, or ``(vectors, tokens)`` with ``show_tokens``."""
    return (embedding, tokens or []) if show_tokens else embedding


def in_format(vectors: np.ndarray, output_fmt: Literal["ndarray", "list"]) -> Embedding:
    """``vectors`` as ``output_fmt`` asks: the array, or nested lists."""
    return vectors.tolist() if output_fmt == "list" else vectors
