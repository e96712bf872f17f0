"""What a request carries, built and checked before it is sent.

:func:`request_frames` frames a request, its header saying what it asks and which client
version asks it; :func:`check_size` refuses frames larger than the server takes;
:func:`encode_options` reads and checks the options of an encode call, for every client. Before an
encode call sends anything, :func:`plan_encode` checks its options against the configuration
of its model and says what to warn of, whether the answer is known without asking (no texts),
and whether the input goes as one request or in chunks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .._version import __version__
from ..advice import PYTHON, Advice
from ..protocol import encode_request
from .chunking import chunk_size, request_limit, split_size
from .keywords import REQUEST_DEFAULTS, read_options
from .options import EncodeOptions, check_model
from .results import Embedding, empty_embedding


def request_frames(
    identity: bytes, command: bytes, request_id: int, header: dict[str, Any] | None = None, texts: Sequence[Any] = ()
) -> list[bytes]:
    """The frames of request ``request_id`` from the client ``identity``: ``command`` with
    ``header`` (and this client's version) and ``texts``."""
    return encode_request(identity, command, request_id, {"client_version": __version__, **(header or {})}, texts)


def check_size(frames: list[bytes], config: dict[str, Any]) -> None:
    """Raise ``ValueError`` if the request ``frames`` are larger than the server of ``config``
    takes: its socket would drop them unread, and the client would only see a timeout."""
    limit = config.get("max_message_bytes")
    if isinstance(limit, int) and not isinstance(limit, bool) and len(frames[-1]) > limit:
        raise ValueError(
            f"the request is {len(frames[-1])} bytes as JSON; the server takes at most {limit} bytes per "
            "message (max_message_bytes): send fewer or shorter texts per request"
        )


def encode_options(
    where: str, given: Mapping[str, Any], model: str | None, *, show_tokens: bool = False
) -> EncodeOptions:
    """The options ``given`` to the client's method ``where`` (:data:`~.keywords.RequestOptions`),
    read (:func:`~.keywords.read_options`) and checked; its requests go to their ``model``, or
    if none to ``model`` (the client's). Every client builds its options here."""
    asked = read_options(where, given, REQUEST_DEFAULTS)
    asked["model"] = check_model(asked["model"]) or model
    return EncodeOptions(**asked, show_tokens=show_tokens)


def length_warning(config: dict[str, Any], texts: list[Any], is_tokenized: bool, advice: Advice = PYTHON) -> str | None:
    """What to warn of, in the words of ``advice``, if one of ``texts`` has more words than
    the ``max_seq_len`` of the server of ``config``."""
    limit = config.get("max_seq_len")
    if isinstance(limit, bool) or not isinstance(limit, int):
        return None
    for i, item in enumerate(texts):
        if (words := len(item) if is_tokenized else len(item.split())) > limit:
            silence = f", or {advice.silence_length} to silence this" if advice.silence_length else ""
            chunk = f"{advice.chunk} to encode it in windows, " if config.get("chunking", True) is not False else ""
            return (
                f"{advice.name(i)} has {words} words, more than the server's max_seq_len={limit} tokens: "
                f"it and any other long {advice.input} will be truncated; {chunk}"
                f"{'' if silence else 'or '}start the server with a larger {advice.max_seq_len}{silence}"
            )
    return None


@dataclass(frozen=True)
class EncodePlan:
    """What an encode call does before it sends anything."""

    warning: str | None  # what to warn the caller of: a text the server will cut
    empty: Embedding | None  # the answer, known without asking: no texts, and the config tells the shape
    chunk: int | None  # texts per request, if the input goes as several requests
    progress: bool = False  # a bar counts the texts answered (show_progress)


def plan_encode(
    options: EncodeOptions,
    texts: list[Any],
    config: dict[str, Any],
    *,
    output_fmt: Literal["ndarray", "list"],
    check_length: bool,
    show_progress: bool,
    blocking: bool = True,
) -> EncodePlan:
    """The plan of an encode call of ``texts`` (already checked) with ``options``, to the model
    whose configuration is ``config``; ``ValueError`` if that model cannot do what they ask."""
    options.check_server(config)
    warning = None
    if check_length and not options.chunks_long_inputs(config):
        warning = length_warning(config, texts, options.is_tokenized)
    empty = empty_embedding(config, output_fmt, options.dimensions) if blocking and not texts else None
    size, limit = chunk_size(config), request_limit(config)
    chunk = None
    if show_progress and len(texts) > size:
        chunk = min(size, limit or size)
    elif blocking and limit is not None and len(texts) > limit:  # more than one request holds: split, in order
        chunk = split_size(config, limit)
    return EncodePlan(warning, empty, chunk, progress=show_progress)
