"""The worker link's messages, parsed at the edge: what a peer may send, as typed objects.

Every message on the worker link (the head's side in :mod:`.link`, a host's in :mod:`..remote.host`),
and every READY and DONE of the head's own workers (:mod:`..head.ventilator`), is parsed here before
any policy code sees it: into a typed object whose numbers are within declared ranges, or
refused with :class:`LinkError`, whose one line says what is wrong. The core reads attributes,
never a peer's JSON, and never calls ``int()`` on it. The frame layouts and kinds are those of
:mod:`bertserve.client.protocol`; the JSON bodies are the strict pydantic models of
:mod:`.link_bodies`. A JSON frame longer than its kind's bound is
refused unread, and so is a message with too many or too few frames, or of a kind the
direction does not carry. A peer that has not joined is read only for its HELLO
(:func:`hello`, within :data:`MAX_HELLO_BYTES`), and a RESULT's header only within what the
job it answers could need (:func:`result_header_bound`): both are checked on the frames'
sizes, before any JSON is decoded.

Host -> head (``W`` names a worker on its host, ``job`` a job id, each 1 to 64 characters of
``[A-Za-z0-9._:-]``)::

    [HELLO, Hello]                               [HEARTBEAT] | [HEARTBEAT, W]
    [READY, W, Ready]                            [DONE, Done]
    [RESULT, W, job, ResultHeader, buffer]       [JOB_ERROR, W, job, JobError]
    [GONE, W] | [GONE, W, reason]                [DRAIN]   [BYE]

Head -> host::

    [WELCOME, Welcome]   [REFUSED, Refused]      [HEARTBEAT]   [BYE]
    [JOB, W, job, header, payload]               [FORGET, W] | [FORGET, W, reason]

A worker of the head, to its ventilator: ``[READY, Ready]`` and ``[DONE, Done]`` |
``[HEARTBEAT, W]``.

What the schemas cannot say is checked by policy: the head caps credits and accepts a result
only for the job its worker holds (:mod:`.link`); a host runs a model class only if its own
command line names it (:mod:`..remote.host`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from bertserve.client import protocol as p
from pydantic import BaseModel, ConfigDict, ValidationError

from . import wire
from .link_bodies import (
    Done,
    Hello,
    JobError,
    ModelInfo,
    Ready,
    Refused,
    ResultHeader,
    Welcome,
    printable,
)

MAX_FRAME_BYTES = 512 * 1024 * 1024
"""Largest frame either side of the link takes (ZeroMQ's MAXMSGSIZE on the head's ROUTER and on
each host's DEALER, with CURVE or without; a larger one drops its connection unread): a job's
vectors, up to 256 rows of 512 tokens of 1024 float32 values."""

MAX_HELLO_BYTES = 4096
"""Largest JSON frame of a HELLO: all a peer that has not joined may make the head read."""

MAX_CONTROL_BYTES = 64 * 1024
"""Largest JSON frame of READY, DONE, WELCOME, REFUSED, and a GONE's or FORGET's reason."""

MAX_ERROR_BYTES = 1024 * 1024
"""Largest JSON frame of a JOB_ERROR (it repeats the job's parts)."""

MAX_RESULT_HEADER_BYTES = 64 * 1024 * 1024
"""Largest JSON header of any RESULT (its parts, tokens and lengths); each is held to the
smaller bound of the job it answers (:func:`result_header_bound`)."""

RESULT_HEADER_BASE_BYTES = 16 * 1024
"""What a RESULT header may hold beyond its rows: field names, dtype, shape, model version."""

RESULT_HEADER_ROW_BYTES = 128
"""What each row adds to a RESULT header: its index in its part, its length, its windows, whether it was cut."""

RESULT_HEADER_PART_BYTES = 512
"""What each part adds to a RESULT header: its request key (at most 256 characters), the
traceparent of a traced request (55) and brackets."""

RESULT_TOKEN_BYTES_PER_CHAR = 16
"""What each character of a job's texts may add to a RESULT header when the job shows tokens:
a token per character at worst (``"##x",``, four bytes of UTF-8, escapes, ``[UNK]``)."""

_NAME = re.compile(rb"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}\Z")

T = TypeVar("T", bound=BaseModel)


class LinkError(p.ProtocolError):
    """A message on the worker link does not follow its schema; ``kind`` is the message's."""

    def __init__(self, message: str, kind: bytes = b"") -> None:
        super().__init__(message)
        self.kind = kind


# -- messages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heartbeat:
    worker: bytes = b""  # a worker's heartbeat passed on; empty: its host's (or the head's)


@dataclass(frozen=True)
class WorkerReady:
    worker: bytes
    ready: Ready


@dataclass(frozen=True)
class WorkerResult:
    worker: bytes
    job_id: str
    header: ResultHeader
    buffer: Any  # the vectors' raw bytes (a zmq.Frame, or bytes), as long as ``header.nbytes``


@dataclass(frozen=True)
class WorkerError:
    worker: bytes
    job_id: str
    error: JobError


@dataclass(frozen=True)
class Gone:
    worker: bytes
    reason: str


@dataclass(frozen=True)
class Drain:
    pass


@dataclass(frozen=True)
class Bye:
    pass


@dataclass(frozen=True)
class JobFor:
    worker: bytes
    job_id: bytes
    frames: list[Any]  # [job id, header, payload], passed on to the worker as they came


@dataclass(frozen=True)
class Forget:
    worker: bytes
    reason: str


FromHost = Hello | Heartbeat | WorkerReady | Done | WorkerResult | WorkerError | Gone | Drain | Bye
FromHead = Welcome | Refused | Heartbeat | JobFor | Forget | Bye


def is_hello(frames: Sequence[Any]) -> bool:
    """Whether ``frames`` (after the routing id) is a HELLO, judged by its kind frame alone."""
    return bool(frames) and _size(frames[0]) == len(wire.HELLO) and _bytes(frames[0]) == wire.HELLO


def hello(frames: Sequence[Any]) -> Hello:
    """The HELLO of a peer that has not joined, its one frame at most :data:`MAX_HELLO_BYTES`
    (checked before its JSON is decoded); raises :class:`LinkError`."""
    kind, rest = _split(frames, {wire.HELLO: _FROM_HOST[wire.HELLO]})
    return parse(Hello, rest[0], kind, MAX_HELLO_BYTES)


def result_of(frames: Sequence[Any]) -> tuple[bytes, str] | None:
    """The worker name and job id a RESULT names (``None`` for another kind, or another
    layout: :func:`from_host` says what is wrong), read before its header; raises
    :class:`LinkError` for a malformed name or id."""
    if len(frames) != 1 + _FROM_HOST[wire.RESULT][0] or _size(frames[0]) != len(wire.RESULT):
        return None
    if _bytes(frames[0]) != wire.RESULT:
        return None
    return name(frames[1], wire.RESULT), job_id(frames[2], wire.RESULT)


def result_header_bound(*, rows: int, parts: int, texts: Sequence[Any] | None = None) -> int:
    """The most bytes the RESULT header of a job of ``rows`` rows in ``parts`` parts may hold,
    with the tokens of its ``texts`` if it shows them (``None``: it does not); at most
    :data:`MAX_RESULT_HEADER_BYTES`. A header past it is refused unread."""
    bound = RESULT_HEADER_BASE_BYTES + rows * RESULT_HEADER_ROW_BYTES + parts * RESULT_HEADER_PART_BYTES
    if texts is not None:
        chars = sum(_text_chars(text) for text in texts)
        bound += RESULT_TOKEN_BYTES_PER_CHAR * (chars + 16 * rows)  # [CLS], [SEP], brackets and commas
    return min(bound, MAX_RESULT_HEADER_BYTES)


def _text_chars(text: Any) -> int:
    """Characters of one input: a text, or a list of tokens (each counted with a separator)."""
    if isinstance(text, list):
        return sum(len(str(token)) + 1 for token in text)
    return len(str(text))


def from_host(frames: Sequence[Any], *, result_header_bytes: int = MAX_RESULT_HEADER_BYTES) -> FromHost:
    """A joined host's message to the head (``frames`` after the routing id), parsed, a
    RESULT's header within ``result_header_bytes``; raises :class:`LinkError`."""
    kind, rest = _split(frames, _FROM_HOST)
    if kind == wire.HELLO:
        return parse(Hello, rest[0], kind, MAX_HELLO_BYTES)
    if kind == wire.HEARTBEAT:
        return Heartbeat(name(rest[0], kind)) if rest else Heartbeat()
    if kind == wire.READY:
        return WorkerReady(name(rest[0], kind), parse(Ready, rest[1], kind))
    if kind == wire.DONE:
        return parse(Done, rest[0], kind)
    if kind == wire.RESULT:
        header = parse(ResultHeader, rest[2], kind, min(result_header_bytes, MAX_RESULT_HEADER_BYTES))
        if _size(rest[3]) != header.nbytes:
            raise LinkError(f"RESULT's buffer holds {_size(rest[3])} bytes, its header says {header.nbytes}", kind)
        return WorkerResult(name(rest[0], kind), job_id(rest[1], kind), header, rest[3])
    if kind == wire.JOB_ERROR:
        return WorkerError(name(rest[0], kind), job_id(rest[1], kind), parse(JobError, rest[2], kind, MAX_ERROR_BYTES))
    if kind == wire.GONE:
        return Gone(name(rest[0], kind), _reason(rest[1], kind) if len(rest) > 1 else "its process died")
    return Drain() if kind == wire.DRAIN else Bye()


def from_head(frames: Sequence[Any]) -> FromHead:
    """The head's message to a host, parsed; raises :class:`LinkError`."""
    kind, rest = _split(frames, _FROM_HEAD)
    if kind == wire.WELCOME:
        return parse(Welcome, rest[0], kind)
    if kind == wire.REFUSED:
        return parse(Refused, rest[0], kind)
    if kind == wire.JOB:
        return JobFor(name(rest[0], kind), job_id(rest[1], kind).encode(), list(rest[1:]))
    if kind == wire.FORGET:
        return Forget(name(rest[0], kind), _reason(rest[1], kind) if len(rest) > 1 else "it stopped answering")
    return Heartbeat() if kind == wire.HEARTBEAT else Bye()


def local_ready(frames: Sequence[Any]) -> Ready:
    """A local worker's ``[READY, Ready]``: its model's description keeps only the fields
    :class:`ModelInfo` declares (a model class may describe more, which the head does not read)."""
    kind, rest = _split(frames, {wire.READY: (1,)})
    return parse(_OwnReady, rest[0], kind)


def declared_ready(raw: bytes) -> bytes:
    """A READY body of this machine's worker as a host passes it on: its model's description
    cut to the fields :class:`ModelInfo` declares, since the head refuses any other; raises
    :class:`LinkError` for a malformed one."""
    return parse(_OwnReady, raw, wire.READY).model_dump_json(exclude_unset=True).encode()


class _OwnModelInfo(ModelInfo):
    """A model description from a worker process of this machine: undeclared fields are left out."""

    model_config = ConfigDict(extra="ignore")


class _OwnReady(Ready):
    """READY from a worker process of this machine (see :class:`_OwnModelInfo`)."""

    model: _OwnModelInfo | None = None


def local_credit(frames: Sequence[Any]) -> Done | Heartbeat:
    """A local worker's ``[DONE, Done]`` or ``[HEARTBEAT, W]``."""
    kind, rest = _split(frames, {wire.DONE: (1,), wire.HEARTBEAT: (1,)})
    return parse(Done, rest[0], kind) if kind == wire.DONE else Heartbeat(name(rest[0], kind))


# frames after the kind each kind may have
_FROM_HOST: dict[bytes, tuple[int, ...]] = {
    wire.HELLO: (1,),
    wire.HEARTBEAT: (0, 1),
    wire.READY: (2,),
    wire.DONE: (1,),
    wire.RESULT: (4,),
    wire.JOB_ERROR: (3,),
    wire.GONE: (1, 2),
    wire.DRAIN: (0,),
    wire.BYE: (0,),
}
_FROM_HEAD: dict[bytes, tuple[int, ...]] = {
    wire.WELCOME: (1,),
    wire.REFUSED: (1,),
    wire.HEARTBEAT: (0,),
    wire.JOB: (4,),
    wire.FORGET: (1, 2),
    wire.BYE: (0,),
}


def _split(frames: Sequence[Any], layouts: dict[bytes, tuple[int, ...]]) -> tuple[bytes, Sequence[Any]]:
    if not frames:
        raise LinkError("an empty message")
    if _size(frames[0]) > 32:
        raise LinkError(f"a message of unknown kind ({_size(frames[0])} bytes)")
    kind = _bytes(frames[0])
    counts = layouts.get(kind)
    if counts is None:
        raise LinkError(f"a message of unknown kind {printable(kind.decode('latin-1'), 32)!r}", kind)
    if len(frames) - 1 not in counts:
        want = " or ".join(str(n) for n in counts)
        raise LinkError(f"{kind.decode()} has {len(frames) - 1} frame(s) after its kind, not {want}", kind)
    return kind, frames[1:]


def parse(model: type[T], frame: Any, kind: bytes = b"", limit: int = MAX_CONTROL_BYTES) -> T:
    """``frame``'s JSON as ``model``; raises :class:`LinkError` saying what is wrong."""
    what = kind.decode(errors="replace") or model.__name__
    size = _size(frame)
    if size > limit:
        raise LinkError(f"{what}'s JSON frame has {size} bytes; at most {limit} are read", kind)
    try:
        return model.model_validate_json(_bytes(frame))
    except ValidationError as exc:
        raise LinkError(f"{what}: {_problem(exc)}", kind) from None
    except RecursionError:
        raise LinkError(f"{what}: the JSON nests too deeply", kind) from None


def name(frame: Any, kind: bytes = b"") -> bytes:
    """A worker's name on its host (a frame)."""
    raw = _bytes(frame) if _size(frame) <= 64 else b""
    if not _NAME.match(raw):
        raise LinkError(f"{kind.decode(errors='replace')}: a worker name must be 1 to 64 of [A-Za-z0-9._:-]", kind)
    return raw


def job_id(frame: Any, kind: bytes = b"") -> str:
    """A job id (a frame)."""
    raw = _bytes(frame) if _size(frame) <= 64 else b""
    if not _NAME.match(raw):
        raise LinkError(f"{kind.decode(errors='replace')}: a job id must be 1 to 64 of [A-Za-z0-9._:-]", kind)
    return raw.decode()


def _reason(frame: Any, kind: bytes) -> str:
    if _size(frame) > MAX_CONTROL_BYTES:
        raise LinkError(f"{kind.decode()}'s reason has {_size(frame)} bytes", kind)
    return printable(_bytes(frame).decode("utf-8", "replace"), 200)


def _problem(exc: ValidationError) -> str:
    """The first of a validation's errors, on one line."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    first = errors[0]
    where = ".".join(printable(str(part), 40) for part in first["loc"])
    text = f"{where}: {first['msg']}" if where else first["msg"]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return printable(text, 240) + more


def _size(frame: Any) -> int:
    return len(frame.buffer) if hasattr(frame, "buffer") else len(frame)


def _bytes(frame: Any) -> bytes:
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)
