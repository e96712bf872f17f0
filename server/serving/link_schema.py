"""The worker link's messages, parsed at the edge: what a peer may send, as typed objects.

Every message on the worker link (the head's side in :mod:`.link`, a host's in :mod:`.remote`),
and every READY and DONE of the head's own workers (:mod:`.ventilator`), is parsed here before
any policy code sees it: into a typed object whose numbers are within declared ranges, or
refused with :class:`LinkError`, whose one line says what is wrong. The core reads attributes,
never a peer's JSON, and never calls ``int()`` on it. The frame layouts and kinds are those of
:mod:`bertserve.client.protocol`; the JSON bodies are pydantic models in strict mode:

- an integer field takes only a JSON integer within its range (not ``1e999``, ``1.0``,
  ``true`` or ``"1"``); a float field only a finite number (no ``NaN``, no ``Infinity``);
- a string field only a string of bounded length, and names and labels only their characters;
- a field the schema does not know is ignored; one it requires must be there;
- a JSON frame longer than its kind's bound is refused unread, and so is a message with too
  many or too few frames, or of a kind the direction does not carry.

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
command line names it (:mod:`.remote`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PureWindowsPath
from typing import Annotated, Any, Literal, TypeVar

from bertserve.client import protocol as p
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from . import wire

MAX_CONTROL_BYTES = 64 * 1024
"""Largest JSON frame of HELLO, READY, DONE, WELCOME, REFUSED, and a GONE's or FORGET's reason."""

MAX_ERROR_BYTES = 1024 * 1024
"""Largest JSON frame of a JOB_ERROR (it repeats the job's parts)."""

MAX_RESULT_HEADER_BYTES = 64 * 1024 * 1024
"""Largest JSON header of a RESULT (its parts, tokens and lengths)."""

MAX_HOST_WORKERS = 256
"""Most workers one host may say it runs (HELLO's ``workers``)."""

ERROR_KINDS = frozenset({"worker", "input", "timeout"})
"""The kinds a JOB_ERROR may give its requests' error replies; any other becomes ``worker``."""

MAX_ERROR_CHARS = 500
"""A JOB_ERROR's text is cut to this many characters before it reaches a client."""

_NAME = re.compile(rb"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}\Z")
_ROWS = 1 << 31  # more rows than any request holds
_DTYPE_BYTES = {"float16": 2, "float32": 4, "float64": 8}

T = TypeVar("T", bound=BaseModel)


class LinkError(p.ProtocolError):
    """A message on the worker link does not follow its schema; ``kind`` is the message's."""

    def __init__(self, message: str, kind: bytes = b"") -> None:
        super().__init__(message)
        self.kind = kind


def printable(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters, its control characters escaped: safe in one log line."""
    text = text[:limit]
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# -- field types ---------------------------------------------------------------------------


def _no_controls(text: str) -> str:
    if not text.isprintable():
        raise ValueError("holds control characters")
    return text


# strings of at most so many characters, with no control characters (safe in a log line)
Text64 = Annotated[str, StringConstraints(max_length=64), AfterValidator(_no_controls)]
Text255 = Annotated[str, StringConstraints(max_length=255), AfterValidator(_no_controls)]
Text1024 = Annotated[str, StringConstraints(max_length=1024), AfterValidator(_no_controls)]
Text4096 = Annotated[str, StringConstraints(max_length=4096), AfterValidator(_no_controls)]
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")]
Label = Annotated[str, StringConstraints(max_length=64, pattern=r"^[A-Za-z0-9_.:/+-]*$")]
MODEL_CLASS_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
"""How a model class is named: ``package.module:Name``."""
ModelClass = Annotated[str, StringConstraints(max_length=255, pattern=MODEL_CLASS_PATTERN)]
Count = Annotated[int, Field(ge=0, le=2**48)]
Row = Annotated[int, Field(ge=0, lt=_ROWS)]
Scalar = bool | Annotated[int, Field(ge=-(2**53), le=2**53)] | float | Text1024 | None


def _plain_file_name(name: str) -> str:
    """A file name a head may give a host: relative, and inside the directory it is joined to."""
    parts = name.replace("\\", "/").split("/")
    if not name or "\x00" in name or os.path.isabs(name) or PureWindowsPath(name).anchor or ".." in parts:
        raise ValueError(f"{printable(name, 80)!r} is not a plain relative name inside the model directory")
    return name


FileName = Annotated[str, StringConstraints(max_length=255), AfterValidator(_no_controls),
                     AfterValidator(_plain_file_name)]  # fmt: skip


class _Schema(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", allow_inf_nan=False)


# -- bodies ------------------------------------------------------------------------------


class Hello(_Schema):
    """HELLO: a host asks to join."""

    link: int = Field(ge=0, le=2**31)
    version: Text64 = "?"
    hostname: Text255 = "?"
    model_sha256: str = Field(default="", max_length=128)
    workers: int = Field(default=1, ge=1, le=MAX_HOST_WORKERS)


class ModelInfo(_Schema):
    """What a worker's model says of itself (``Model.describe()``); the head reads the typed
    fields, and passes the rest on to CONFIG as plain JSON values."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Scalar | Annotated[list[Scalar], Field(max_length=64)]]

    output_dim: int = Field(default=0, ge=0, le=1 << 20)
    output_dtype: Literal["float16", "float32", "float64"] = "float32"
    token_level: bool = False
    chunking: bool = False
    pooling_strategy: Label | None = None
    dtype: Label | None = None
    max_seq_len: Annotated[int, Field(ge=1, le=1 << 20)] | Label | None = None
    model_dir: Text4096 | None = None
    model_class: Text255 | None = None

    def public(self) -> dict[str, Any]:
        """The fields the worker sent, as plain JSON values."""
        return self.model_dump(exclude_unset=True)


class Ready(_Schema):
    """READY: a worker takes jobs, up to ``credits`` at once."""

    worker: int = Field(ge=0, le=65_535)
    pid: int = Field(ge=0, le=2**31 - 1)
    credits: int = Field(ge=1, le=2**31 - 1)
    model: ModelInfo | None = None
    device: Text64 = ""
    hostname: Text255 = ""
    version: int | None = Field(default=None, ge=0, le=2**63 - 1)


class Done(_Schema):
    """DONE: a worker finished a job (its credit is free again), with statistics."""

    job: Name
    worker: Name
    seconds: float = Field(default=0.0, ge=0.0, le=1e6)
    tokens: Count = 0
    slots: Count = 0


class Part(_Schema):
    """The rows of one request a job carries, in the order of the job's rows."""

    key: str = Field(max_length=256)
    rows: list[Row]


class ResultHeader(_Schema):
    """A RESULT's header: whose rows these are, and the vectors' array header."""

    parts: list[Part] = Field(min_length=1, max_length=1 << 20)
    dtype: Literal["float16", "float32", "float64"]
    shape: list[Annotated[int, Field(ge=0, lt=_ROWS)]] = Field(min_length=2, max_length=3)
    tokens: list[list[str] | None] | None = None
    lengths: list[Count] | None = None
    windows: list[Count] | None = None
    model_version: int | None = Field(default=None, ge=0, le=2**63 - 1)

    @model_validator(mode="after")
    def _rows_agree(self) -> ResultHeader:
        rows = sum(len(part.rows) for part in self.parts)
        if self.shape[0] != rows:
            raise ValueError(f"the array has {self.shape[0]} rows, the parts {rows}")
        for name in ("tokens", "lengths", "windows"):
            values = getattr(self, name)
            if values is not None and len(values) != rows:
                raise ValueError(f"{name} has {len(values)} entries for {rows} rows")
        return self

    @property
    def nbytes(self) -> int:
        """The size of the buffer this header describes."""
        return math.prod(self.shape) * _DTYPE_BYTES[self.dtype]

    def plain(self) -> dict[str, Any]:
        """The header as the sink reads it (built from the parsed fields, not the peer's bytes)."""
        return self.model_dump(exclude_none=True)


class JobError(_Schema):
    """A JOB_ERROR's header: why the job failed (the head uses its own record of the parts)."""

    error: str = "the worker failed on this request"
    kind: str = "worker"

    @property
    def safe_kind(self) -> str:
        """``kind`` if it is one of :data:`ERROR_KINDS`, else ``worker``: a metrics label."""
        return self.kind if self.kind in ERROR_KINDS else "worker"

    @property
    def safe_error(self) -> str:
        text = self.error[:MAX_ERROR_CHARS]
        return text + "..." if len(self.error) > MAX_ERROR_CHARS else text


class WelcomeModel(_Schema):
    """The model options a head gives its hosts: those of :class:`~..config.ModelConfig` but
    the directories and device, which are each host's own. Absent or ``null``: the default."""

    model_config = ConfigDict(extra="forbid")

    ckpt_name: FileName | None = None
    config_name: FileName | None = None
    vocab_name: FileName | None = None
    max_seq_len: Annotated[int, Field(ge=1, le=1 << 20)] | Label | None = None
    pooling_strategy: Label | None = None
    pooling_layer: list[Annotated[int, Field(ge=-1024, le=1024)]] | None = Field(default=None, max_length=64)
    mask_cls_sep: bool | None = None
    normalize: bool | None = None
    do_lower_case: bool | None = None
    dtype: Label | None = None
    output_dtype: Label | None = None
    xla: bool | None = None
    batch_size: int | None = Field(default=None, ge=1, le=1 << 20)
    lite_max_tokens: int | None = Field(default=None, ge=0, le=1 << 20)
    long_inputs: Label | None = None
    chunk_stride: int | None = Field(default=None, ge=0, le=1 << 20)

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``ModelConfig`` (a ``null`` option is left at its default)."""
        return self.model_dump(exclude_none=True)


class Welcome(_Schema):
    """WELCOME: the head took this host; every worker runs these options."""

    model: WelcomeModel
    model_class: ModelClass | None = None
    tuned: bool = False
    heartbeat_timeout_ms: int = Field(ge=100, le=86_400_000)


class Refused(_Schema):
    """REFUSED: the head will not take this host, and says why."""

    error: str = "no reason given"


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


def from_host(frames: Sequence[Any]) -> FromHost:
    """A host's message to the head (``frames`` after the routing id), parsed; raises :class:`LinkError`."""
    kind, rest = _split(frames, _FROM_HOST)
    if kind == wire.HELLO:
        return parse(Hello, rest[0], kind)
    if kind == wire.HEARTBEAT:
        return Heartbeat(name(rest[0], kind)) if rest else Heartbeat()
    if kind == wire.READY:
        return WorkerReady(name(rest[0], kind), parse(Ready, rest[1], kind))
    if kind == wire.DONE:
        return parse(Done, rest[0], kind)
    if kind == wire.RESULT:
        header = parse(ResultHeader, rest[2], kind, MAX_RESULT_HEADER_BYTES)
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
    """A local worker's ``[READY, Ready]``."""
    kind, rest = _split(frames, {wire.READY: (1,)})
    return parse(Ready, rest[0], kind)


def local_credit(frames: Sequence[Any]) -> Done | Heartbeat:
    """A local worker's ``[DONE, Done]`` or ``[HEARTBEAT, W]``."""
    kind, rest = _split(frames, {wire.DONE: (1,), wire.HEARTBEAT: (1,)})
    return parse(Done, rest[0], kind) if kind == wire.DONE else Heartbeat(name(rest[0], kind))


# frames after the kind each kind may have
_FROM_HOST: dict[bytes, tuple[int, ...]] = {
    wire.HELLO: (1,), wire.HEARTBEAT: (0, 1), wire.READY: (2,), wire.DONE: (1,), wire.RESULT: (4,),
    wire.JOB_ERROR: (3,), wire.GONE: (1, 2), wire.DRAIN: (0,), wire.BYE: (0,),
}  # fmt: skip
_FROM_HEAD: dict[bytes, tuple[int, ...]] = {
    wire.WELCOME: (1,), wire.REFUSED: (1,), wire.HEARTBEAT: (0,), wire.JOB: (4,), wire.FORGET: (1, 2), wire.BYE: (0,),
}  # fmt: skip


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
