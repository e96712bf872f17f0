"""The messages the sink reads, parsed at its edge: what the head and the workers may send it.

The head tells the sink which requests to expect and how each ended early; the workers send
it what they computed. Each message is parsed here, before the sink acts on it, into a typed
object: its JSON body into a strict pydantic model (as on the worker link, :mod:`.link_bodies`),
its other frames checked for count and form. One that does not follow its schema raises
:class:`SinkMessageError`; the sink logs it and drops it, and goes on.

Head -> sink::

    [REGISTER, Register]                         a request was admitted: expect its rows
    [FAIL, Fail]                                 requests that ended early: answer each with an error
    [PUBLISH, format, *reply frames]             a reply the head made (a refusal, an answer)
    [STATUS, format, client_id, request_id, JSON]  the head's STATUS, which the sink completes
    [STOP]                                       publish what is left, then exit

Worker -> sink::

    [RESULT, job_id, ResultHeader, buffer]       rows computed (the link's header, :mod:`.link_bodies`)
    [JOB_ERROR, job_id, JobFailed]               a job failed: answer its requests with an error

A request's deadline is the head's: it computes it once, as it admits the request, and
REGISTER carries it (:attr:`Register.deadline`). It is a ``time.monotonic()`` instant, which
both processes read from the same clock: the sink is a child of the head's process on the
same machine, and ``CLOCK_MONOTONIC`` is one clock for the whole system on Linux (as
``mach_absolute_time`` is on macOS, and ``QueryPerformanceCounter`` on Windows), unlike the
wall clock, which NTP or an operator may step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from bertserve.client import protocol as p
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from ...tracing import TRACEPARENT_PATTERN
from . import formats, wire
from .formats import ReplyFormat
from .link import MAX_CONTROL_BYTES, MAX_ERROR_BYTES, MAX_RESULT_HEADER_BYTES, parse
from .link_bodies import Part, ResultHeader

MAX_KEYS = 1 << 20
"""Most requests one FAIL names."""

MAX_FAIL_BYTES = 64 << 20
"""Largest JSON frame of a FAIL (at shutdown it names every request in flight)."""

MAX_STATUS_BYTES = 16 << 20
"""Largest JSON frame of the head's STATUS (it lists every worker)."""

MAX_KIND_CHARS = 64
MAX_ERROR_TEXT = 4096

_Key = Annotated[str, StringConstraints(min_length=1, max_length=256)]
_Kind = Annotated[str, StringConstraints(min_length=1, max_length=MAX_KIND_CHARS, pattern=r"^[a-z_]+$")]
_Instant = Annotated[float, Field(ge=0.0)]  # a time.monotonic() instant


def _known_format(name: str) -> str:
    if formats.named(name).name.decode() != name:
        raise ValueError(f"no reply format {name[:32]!r}")
    return name


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", allow_inf_nan=False)


class Register(_Body):
    """REGISTER: the head admitted a request; the sink expects ``count`` rows of it."""

    key: _Key  # the request's key inside the server, unique per admission
    client: str = Field(pattern=r"^(?:[0-9a-f]{2}){1,64}$")  # its client id, as hex
    request_id: int = Field(ge=-(2**63), lt=10**19)
    count: int = Field(ge=1, le=2**31)
    deadline: _Instant  # when it expires (``time.monotonic()``, the head's as it admitted it)
    admitted: _Instant  # when the head admitted it (same clock): the expiry's message says how long it had
    show_tokens: bool = False
    version: int | None = Field(default=None, ge=0, le=2**63 - 1)  # the model version its rows are computed with
    format: Annotated[str, AfterValidator(_known_format)] = "native"
    model: str = Field(default="", max_length=255)
    dimensions: int | None = Field(default=None, ge=1)  # keep the first k dimensions of each vector
    normalize: bool | None = None  # unit-length vectors (their dimensions kept) or not; None: as the model says
    trace: str | None = Field(default=None, pattern=TRACEPARENT_PATTERN)  # the head's span of it, when traced

    @property
    def client_id(self) -> bytes:
        return bytes.fromhex(self.client)

    @property
    def timeout_s(self) -> float:
        return self.deadline - self.admitted

    def frames(self) -> list[bytes]:
        return [wire.REGISTER, self.model_dump_json().encode()]


class Fail(_Body):
    """FAIL: requests that ended before their rows were all computed, with the error each is answered."""

    keys: list[_Key] = Field(max_length=MAX_KEYS)
    error: str = Field(max_length=MAX_ERROR_TEXT)
    kind: _Kind = "error"

    def frames(self) -> list[bytes]:
        return [wire.FAIL, self.model_dump_json().encode()]


class JobFailed(_Body):
    """A worker's JOB_ERROR, as the sink reads it: the job's parts and why it failed."""

    model_config = ConfigDict(extra="ignore")
    parts: list[Part] = Field(min_length=1, max_length=1 << 20)
    error: str = Field(default="the worker failed on this request", max_length=MAX_ERROR_TEXT)
    kind: _Kind = "worker"


@dataclass(frozen=True)
class Publish:
    format: ReplyFormat
    frames: list[Any]  # the reply, its client id first


@dataclass(frozen=True)
class Status:
    format: ReplyFormat
    client: bytes
    request_id: int
    status: dict[str, Any]  # the head's part of the answer


@dataclass(frozen=True)
class Result:
    job_id: bytes
    header: ResultHeader
    buffer: Any  # the vectors' raw bytes, ``header.nbytes`` long (checked)


@dataclass(frozen=True)
class JobError:
    job_id: bytes
    body: JobFailed


@dataclass(frozen=True)
class Stop:
    pass


SinkMessage = Register | Fail | Publish | Status | Result | JobError | Stop


class SinkMessageError(p.ProtocolError):
    """A message to the sink does not follow its schema."""


_FRAMES = {
    wire.REGISTER: 1,
    wire.FAIL: 1,
    wire.PUBLISH: -1,  # two or more
    p.STATUS: 4,
    wire.RESULT: 3,
    wire.JOB_ERROR: 2,
    wire.STOP: 0,
}


def read(frames: Sequence[Any]) -> SinkMessage:
    """One message to the sink, parsed; raises :class:`SinkMessageError` saying what is wrong."""
    try:
        kind, rest = wire.split_message(frames, _FRAMES)
        return _read(kind, rest)
    except SinkMessageError:
        raise
    except p.ProtocolError as exc:
        raise SinkMessageError(str(exc)) from None


def _read(kind: bytes, rest: list[Any]) -> SinkMessage:
    if kind == wire.REGISTER:
        return parse(Register, rest[0], kind, MAX_CONTROL_BYTES)
    if kind == wire.FAIL:
        return parse(Fail, rest[0], kind, MAX_FAIL_BYTES)
    if kind == wire.RESULT:
        header = parse(ResultHeader, rest[1], kind, MAX_RESULT_HEADER_BYTES)
        if len(rest[2]) != header.nbytes:
            raise SinkMessageError(f"RESULT's buffer holds {len(rest[2])} bytes, its header says {header.nbytes}")
        return Result(bytes(rest[0]), header, rest[2])
    if kind == wire.JOB_ERROR:
        return JobError(bytes(rest[0]), parse(JobFailed, rest[1], kind, MAX_ERROR_BYTES))
    if kind == wire.PUBLISH:
        if len(rest) < 2:
            raise SinkMessageError(f"PUBLISH has {len(rest)} frames, expected at least 2")
        return Publish(_format(rest[0]), rest[1:])
    if kind == p.STATUS:
        return _status(rest)
    return Stop()


def _format(frame: Any) -> ReplyFormat:
    fmt = formats.named(frame)
    if fmt.name != bytes(frame):
        raise SinkMessageError(f"no reply format {bytes(frame)[:32]!r}")
    return fmt


def _status(rest: list[Any]) -> Status:
    fmt, client, raw_id, raw = _format(rest[0]), bytes(rest[1]), bytes(rest[2]), rest[3]
    if not 1 <= len(client) <= 64:
        raise SinkMessageError(f"STATUS names a client id of {len(client)} bytes")
    if not raw_id.lstrip(b"-").isdigit() or len(raw_id) > 20:
        raise SinkMessageError(f"STATUS names request id {raw_id[:24]!r}")
    if len(raw) > MAX_STATUS_BYTES:
        raise SinkMessageError(f"STATUS's JSON frame has {len(raw)} bytes")
    status = p.loads(raw)
    if not isinstance(status, dict):
        raise SinkMessageError("STATUS's JSON is not an object")
    return Status(fmt, client, int(raw_id), status)
