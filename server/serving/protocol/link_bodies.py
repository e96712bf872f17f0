"""The JSON bodies of the worker link's messages (:mod:`.link`), as pydantic models in
strict mode:

- an integer field takes only a JSON integer within its range (not ``1e999``, ``1.0``,
  ``true`` or ``"1"``); a float field only a finite number (no ``NaN``, no ``Infinity``);
- a string field only a string of bounded length, and names and labels only their characters;
- a field the schema does not know is ignored (but in a model's description, where it is
  refused); one it requires must be there.
"""

from __future__ import annotations

import math
import os
from pathlib import PureWindowsPath
from typing import Annotated, Any, Literal

from bertserve.client.protocol import MODEL_NAME_PATTERN
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from ...errors import ModelFileError
from ...model.calibration import float32_ranges

MAX_HOST_WORKERS = 256
MAX_LABELS = 4096  # a classifier's labels a worker may report
"""Most workers one host may say it runs (HELLO's ``workers``)."""

ERROR_KINDS = frozenset({"worker", "input", "timeout", "expired"})
"""The kinds a JOB_ERROR may give its requests' error replies; any other becomes ``worker``."""

MAX_ERROR_CHARS = 500
"""A JOB_ERROR's text is cut to this many characters before it reaches a client."""

_ROWS = 1 << 31  # more rows than any request holds
_DTYPE_BYTES = {"float16": 2, "float32": 4, "float64": 8}


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
ModelName = Annotated[str, StringConstraints(pattern=rf"^{MODEL_NAME_PATTERN}$")]
Label = Annotated[str, StringConstraints(max_length=64, pattern=r"^[A-Za-z0-9_.:/+-]*$")]
MODEL_CLASS_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
"""How a model class is named: ``package.module:Name``."""
ModelClass = Annotated[str, StringConstraints(max_length=255, pattern=MODEL_CLASS_PATTERN)]
Count = Annotated[int, Field(ge=0, le=2**48)]
Row = Annotated[int, Field(ge=0, lt=_ROWS)]


def _plain_file_name(name: str) -> str:
    """A file name a head may give a host: relative, and inside the directory it is joined to."""
    parts = name.replace("\\", "/").split("/")
    if not name or "\x00" in name or os.path.isabs(name) or PureWindowsPath(name).anchor or ".." in parts:
        raise ValueError(f"{printable(name, 80)!r} is not a plain relative name inside the model directory")
    return name


FileName = Annotated[
    str, StringConstraints(max_length=255), AfterValidator(_no_controls), AfterValidator(_plain_file_name)
]


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
    model_name: ModelName | None = None  # the served model its workers join for (None: the head's default)


_Task = Literal["embed", "rerank", "classify", "sparse", "multivector"]


class ModelInfo(_Schema):
    """What a worker's model says of itself (``Model.describe()``), allow-listed: the fields
    declared here, each typed and bounded, and nothing else (a READY whose description holds
    another key is refused, so no worker can speak for the head's own fields of CONFIG, such
    as ``protocol``). A worker sends only these fields of its model's description
    (:meth:`declared`)."""

    model_config = ConfigDict(extra="forbid")

    output_dim: int = Field(default=0, ge=0, le=1 << 20)
    output_dtype: Literal["float16", "float32", "float64"] = "float32"
    token_level: bool = False
    chunking: bool = False
    pads: bool | None = None  # False: a run reads each input's own tokens (no padding), so bulk work is not sorted
    pooling_strategy: Label | None = None
    pooling_layer: list[Annotated[int, Field(ge=-1024, le=1024)]] | None = Field(default=None, max_length=64)
    mask_cls_sep: bool | None = None
    normalize: bool | None = None
    do_lower_case: bool | None = None
    dtype: Label | None = None
    dtype_requested: Label | None = None
    dtype_reason: Text1024 | None = None
    max_seq_len: Annotated[int, Field(ge=1, le=1 << 20)] | Label | None = None
    long_inputs: Label | None = None
    chunk_stride: int | None = Field(default=None, ge=0, le=1 << 20)
    lite_max_tokens: int | None = Field(default=None, ge=0, le=1 << 20)
    small_run_dtype: Label | None = None  # the dtype of the runs LiteRT takes, where it differs from dtype's
    layers_run: int | None = Field(default=None, ge=0, le=1024)
    graph_key: Text255 | None = None
    runtime: Text64 | None = None
    model_dir: Text4096 | None = None
    model_class: Text255 | None = None
    family: Label | None = None  # the encoder's family: bert, roberta, distilbert, mpnet, modernbert
    task: _Task | None = None  # what the model computes
    # a late-interaction model (.model.late): every task it answers, its own first; its kind; the
    # width of its token vectors; a ColBERT query's positions and a document's most
    tasks: list[_Task] | None = Field(default=None, min_length=1, max_length=8)
    late: Literal["bge-m3", "colbert"] | None = None
    multivector_dim: int | None = Field(default=None, ge=1, le=1 << 16)
    query_length: int | None = Field(default=None, ge=1, le=1 << 20)
    document_length: int | None = Field(default=None, ge=1, le=1 << 20)
    labels: list[Text255] | None = Field(default=None, max_length=MAX_LABELS)  # a classifier's, in id order
    activation: Literal["identity", "sigmoid", "tanh"] | None = None  # a reranker's, on its logits
    # the int8/uint8 embedding types' ranges (.model.calibration): [min, max], one value a dimension
    calibration_ranges: list[list[float]] | None = Field(default=None, min_length=2, max_length=2)

    @model_validator(mode="after")
    def _ranges_fit(self) -> ModelInfo:
        ranges = self.calibration_ranges
        if ranges is not None and not all(len(row) == self.output_dim for row in ranges):
            raise ValueError("calibration_ranges should hold two rows of output_dim values")
        if ranges is not None and not all(math.isfinite(v) for row in ranges for v in row):
            raise ValueError("calibration_ranges should hold finite numbers")
        if ranges is not None:
            try:  # as a calibration file is read: in float32, where quantizing uses them
                float32_ranges("calibration_ranges", ranges[0], ranges[1])
            except ModelFileError as exc:
                raise ValueError(str(exc)) from None
        return self

    @classmethod
    def declared(cls, description: dict[str, Any]) -> dict[str, Any]:
        """The fields of ``description`` this schema declares: what a worker may send of its
        model (a model class may describe more, for its own use)."""
        return {key: value for key, value in description.items() if key in cls.model_fields}

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
    model_name: ModelName | None = None  # the served model it runs (a local worker says; a remote one's host did)


class Done(_Schema):
    """DONE: a worker finished a job (its credit is free again), with statistics."""

    job: Name
    worker: Name
    seconds: float = Field(default=0.0, ge=0.0, le=1e6)
    tokens: Count = 0
    slots: Count = 0
    sentences: Count | None = None  # inputs the model ran; None: the whole job (an older worker)
    skipped: Count = 0  # inputs not run: every request of the job was past its deadline


class Part(_Schema):
    """The rows of one request a job carries, in the order of the job's rows, and the task
    they ask of a model that answers several (a late-interaction model's)."""

    key: str = Field(max_length=256)
    rows: list[Row]
    # None: embed; a request for several outputs of a late-interaction model: outputs:embed,sparse...
    task: str | None = Field(default=None, pattern=r"^(embed|rerank|classify|sparse|multivector|outputs:[a-z,]{1,40})$")


class ResultHeader(_Schema):
    """A RESULT's header: whose rows these are, the vectors' array header, and which of the
    rows' inputs the model cut (required: a reply to a rerank says of each pair whether it
    was cut, and only the worker, which tokenized it, knows)."""

    parts: list[Part] = Field(min_length=1, max_length=1 << 20)
    dtype: Literal["float16", "float32", "float64"]
    shape: list[Annotated[int, Field(ge=0, lt=_ROWS)]] = Field(min_length=2, max_length=3)
    tokens: list[list[str] | None] | None = None
    lengths: list[Count] | None = None
    windows: list[Count] | None = None
    truncated: list[bool]  # each row's input was cut to the model's length (a pair: either side), or not
    model_version: int | None = Field(default=None, ge=0, le=2**63 - 1)
    # the model's modules end in a Normalize module, which its graph leaves to the sink (graph.serving_graph)
    normalizes: bool | None = None

    @model_validator(mode="after")
    def _rows_agree(self) -> ResultHeader:
        rows = sum(len(part.rows) for part in self.parts)
        if self.shape[0] != rows:
            raise ValueError(f"the array has {self.shape[0]} rows, the parts {rows}")
        for name in ("tokens", "lengths", "windows", "truncated"):
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
    """The model options a head gives its hosts: those of :class:`~...config.ModelConfig` but
    the directories, the device and the calibration file, which are each host's own (a host
    reads the ``calibration.json`` of its model directory, whose files are the head's). Absent
    or ``null``: the default."""

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
    task: Literal["embed", "rerank", "classify", "sparse"] | None = None
    instruction: Text1024 | None = None  # a yes/no reranker's task instruction

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``ModelConfig`` (a ``null`` option is left at its default)."""
        return self.model_dump(exclude_none=True)


class Welcome(_Schema):
    """WELCOME: the head took this host; every worker runs these options."""

    model: WelcomeModel
    model_class: ModelClass | None = None
    tuned: bool = False
    heartbeat_timeout_ms: int = Field(ge=100, le=86_400_000)
    model_name: ModelName | None = None  # the head's name of the model: what its workers' logs and spans say


class Refused(_Schema):
    """REFUSED: the head will not take this host, and says why."""

    error: str = "no reason given"
