"""Many requests for one call: a window of them in flight, answered in order, and a big input
cut into chunks whose answers join into the answer one request would get.

``encode_async`` checks its caller's batches with :func:`checked` and sends them through
:func:`in_order`. ``encode(show_progress=True)`` cuts its input with :func:`chunks` into
requests of :func:`chunk_size` texts, sends them the same way, and :func:`gather` counts
their answers on a progress bar and joins them (:class:`Gathered`, which the asyncio client's
tasks fill too). Nothing here opens a socket or waits: the requests are the caller's.
"""

from __future__ import annotations

import re
import warnings
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from ..errors import ServerError
from ..protocol import check_texts
from ..terminal import progress_bar
from .results import Embedding, EncodeResult, empty_embedding

ASYNC_WINDOW = 4
"""Requests ``encode_async``, and ``encode`` with ``show_progress``, keep in flight at once."""

# encode(show_progress=True) sends its input in chunks of this many of the server's mini-jobs
# (max_batch_size texts each): a chunk is still a bulk request the server sorts by length and
# cuts, and with a window of chunks in flight the server holds the next ones while we read.
_PROGRESS_CHUNK_JOBS = 4
_PROGRESS_CHUNK_DEFAULT = 1024  # when the server's config does not give max_batch_size
_TEXT_INDEX = re.compile(r"\btexts\[(\d+)\]")  # how an error names an input: texts[3]

BatchT = TypeVar("BatchT")
ResultT = TypeVar("ResultT")


def checked(
    batches: Iterable[Sequence[Any]],
    is_tokenized: bool,
    length_warning: Callable[[list[Any], bool], str | None] | None,
    *,
    pairs: bool = True,
) -> Iterator[list[Any]]:
    """``batches`` checked as ``encode`` checks its input (each input a sentence pair or not as
    ``pairs`` says), an error naming the batch; the first batch for which ``length_warning``
    has a message warns, once."""
    for index, batch in enumerate(batches):
        try:
            texts = check_texts(batch, is_tokenized, pairs=pairs)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"batch {index}: {exc}") from None
        if length_warning is not None and (message := length_warning(texts, is_tokenized)):
            warnings.warn(message, stacklevel=4)  # past in_order and encode_async: their caller
            length_warning = None
        yield texts


def in_order(
    batches: Iterator[BatchT],
    send: Callable[[BatchT], int],
    collect: Callable[[int], ResultT],
    give_up: Callable[[Iterable[int]], None],
    window: int = ASYNC_WINDOW,
) -> Generator[ResultT, None, None]:
    """``send`` each of ``batches`` as one request, at most ``window`` in flight, and yield
    what ``collect`` makes of their answers, in the order of the batches.

    Closing the generator hands the requests still in flight to ``give_up``.
    """
    in_flight: deque[int] = deque()
    try:
        while True:
            while len(in_flight) < window and (batch := next(batches, None)) is not None:
                in_flight.append(send(batch))
            if not in_flight:
                return
            result = collect(in_flight[0])  # still in flight while awaited: a Ctrl-C gives it up too
            in_flight.popleft()
            yield result
    finally:
        give_up(in_flight)


def chunk_size(config: dict[str, Any]) -> int:
    """Texts per request of ``encode(show_progress=True)``, from the server's ``config``."""
    size = _positive(config.get("max_batch_size"))
    return _PROGRESS_CHUNK_DEFAULT if size is None else _PROGRESS_CHUNK_JOBS * size


def request_limit(config: dict[str, Any]) -> int | None:
    """The most inputs the server takes in one request (its ``max_request_size``, and the rows
    its largest answer holds, ``max_reply_rows``), or None where its ``config`` does not say."""
    limits = [_positive(config.get(key)) for key in ("max_request_size", "max_reply_rows")]
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


def split_size(config: dict[str, Any], limit: int) -> int:
    """Inputs per request of an input past ``limit``: at most that many, and few enough that
    the ``ASYNC_WINDOW`` requests in flight fit in what one client may have queued
    (``max_client_queued_sentences``), or the server would refuse the later ones as busy."""
    queued = _positive(config.get("max_client_queued_sentences"))
    return max(1, min(limit, queued // ASYNC_WINDOW)) if queued is not None else limit


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def chunks(texts: list[Any], size: int) -> Iterator[list[Any]]:
    """``texts`` in consecutive pieces of ``size`` texts (the last may be shorter)."""
    return (texts[start : start + size] for start in range(0, len(texts), size))


class Gathered:
    """The answers to the consecutive chunks of one input, as they come, joined as the server
    joins the parts of one request (:meth:`joined`)."""

    def __init__(self) -> None:
        self._arrays: list[np.ndarray] = []
        self._tokens: list[list[str]] = []
        self.done = 0  # texts answered

    def add(self, result: EncodeResult) -> int:
        """Keep the answer to the next chunk; how many texts it answers."""
        self._arrays.append(np.asarray(result.embedding))
        self._tokens.extend(result.tokens or [])
        self.done += len(result.embedding)
        return len(result.embedding)

    def renumbered(self, error: ServerError) -> ServerError:
        """``error``, the answer to the next chunk, naming each text by its place in the whole
        input, as the answer to one request would."""
        return renumbered(error, self.done)

    def joined(self) -> tuple[np.ndarray, list[list[str]]]:
        """The vectors and tokens of every chunk, as one answer."""
        return join(self._arrays), self._tokens


def gather(
    answers: Generator[EncodeResult, None, None], total: int, *, progress: bool = True
) -> tuple[np.ndarray, list[list[str]]]:
    """The answers to the chunks of an input of ``total`` texts, counted on a bar (with
    ``progress``) as they come,
    joined as the server joins the parts of one request. An error names each text by its place
    in the whole input, as the answer to one request would; ``answers`` is closed either way."""
    gathered = Gathered()
    try:
        with progress_bar(total, disable=not progress) as bar:
            for result in answers:
                bar.update(gathered.add(result))
    except ServerError as exc:  # about the chunk from texts[done] on
        raise gathered.renumbered(exc) from None
    finally:
        answers.close()
    return gathered.joined()


def join(parts: list[np.ndarray]) -> np.ndarray:
    """The answers to consecutive parts of one input as one answer. Per-token vectors are
    padded with zeros to the widest part, as the server pads the parts of one request."""
    if parts[0].ndim == 3:
        width = max(part.shape[1] for part in parts)
        parts = [np.pad(part, ((0, 0), (0, width - part.shape[1]), (0, 0))) for part in parts]
    return np.concatenate(parts, axis=0)


def concatenated(embeddings: list[Embedding], output_fmt: str, config: dict[str, Any]) -> Embedding:
    """The answers to several requests as one: all their rows, in ``output_fmt`` (``"list"``
    or ``"ndarray"``); no answers at all make the empty answer of the server of ``config``."""
    if output_fmt == "list":
        return [row for embedding in embeddings for row in embedding]
    if not embeddings:
        empty = empty_embedding(config, "ndarray")
        return empty if empty is not None else np.zeros((0, 0), np.float32)
    return np.concatenate(embeddings, axis=0)


def renumbered(error: ServerError, offset: int) -> ServerError:
    """``error``, about a request of the texts from ``offset`` on, naming each text by its place
    in the whole input, as the answer to one request of the whole input would."""
    if not offset:
        return error
    message = _TEXT_INDEX.sub(lambda match: f"texts[{int(match[1]) + offset}]", error.message)
    return type(error)(message, kind=error.kind, request_id=error.request_id)
