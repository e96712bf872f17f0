"""The parts of a model's options (:class:`..model.ModelConfig`), one a concern, each a frozen,
keyword-only dataclass that checks its own fields: where the model's files are
(:class:`ModelSource`), how an input is cut into tokens (:class:`Inputs`), what the model
returns for it (:class:`Output`), and what runs it (:class:`Runtime`).

``None`` in ``max_seq_len``, ``pooling_strategy``, ``pooling_layer`` and ``normalize``
means "what the model directory says": a sentence-transformers directory brings its own
pooling, sequence length and normalization; a plain BERT directory gets bert-as-service's
defaults (REDUCE_MEAN over layer -2, ``max_seq_len`` 25, no normalization).
``max_seq_len="NONE"`` pads each batch to its own longest member instead.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ModelOptionError


class PoolingStrategy(str, enum.Enum):
    NONE = "NONE"
    REDUCE_MEAN = "REDUCE_MEAN"
    REDUCE_MAX = "REDUCE_MAX"
    REDUCE_MEAN_MAX = "REDUCE_MEAN_MAX"
    REDUCE_MEAN_SQRT_LEN = "REDUCE_MEAN_SQRT_LEN"  # the sum over the tokens / sqrt(their count)
    WEIGHTED_MEAN = "WEIGHTED_MEAN"  # the mean weighted by position: the i-th token (from 1) counts i
    CLS_TOKEN = "CLS_TOKEN"
    SEP_TOKEN = "SEP_TOKEN"
    CLS_POOLED = "CLS_POOLED"

    @classmethod
    def parse(cls, value: str | PoolingStrategy) -> PoolingStrategy:
        if isinstance(value, PoolingStrategy):
            return value
        name = str(value).strip().upper().replace("-", "_")
        name = _POOLING_ALIASES.get(name, name)
        try:
            return cls(name)
        except ValueError:
            choices = ", ".join([*cls.__members__, *_POOLING_ALIASES])
            raise ModelOptionError(f"unknown pooling_strategy {value!r}; choose one of {choices}") from None


#: Other names of a strategy, in any case: sentence-transformers' pooling modes and TEI's
#: ``--pooling`` values (``mean``, ``max``, ``cls``, ``last-token``) where one means the same.
_POOLING_ALIASES = {
    "MEAN": "REDUCE_MEAN",
    "MAX": "REDUCE_MAX",
    "CLS": "CLS_TOKEN",
    "FIRST_TOKEN": "CLS_TOKEN",
    "LAST_TOKEN": "SEP_TOKEN",
    "LASTTOKEN": "SEP_TOKEN",
    "MEAN_SQRT_LEN": "REDUCE_MEAN_SQRT_LEN",
    "MEAN_SQRT_LEN_TOKENS": "REDUCE_MEAN_SQRT_LEN",
    "WEIGHTEDMEAN": "WEIGHTED_MEAN",
}

#: Accepted spellings of each dtype, mapped to the canonical short name. ``auto`` is resolved
#: for the model's device by ``model.options.resolve`` (see ``model/hardware.py``).
_DTYPES = {
    "auto": "auto",
    "fp32": "fp32",
    "float32": "fp32",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "int8": "int8",
    "qint8": "int8",
}
DTYPE_CHOICES = "auto, fp32, bf16, fp16 or int8"
_OUTPUT_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16"}

DYNAMIC = "NONE"
"""``max_seq_len`` value that pads each batch to its own longest member."""


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """Where the model's files are and which of them are read. A model given by its Hub id
    (``--model-id ORG/NAME@REVISION``) is fetched once, by the CLI, before any process starts:
    ``model_dir`` is then its directory in the Hub cache, and ``model_id``, ``model_revision``
    and ``model_commit`` say which model and commit it is. A model kept in object storage
    (``--model-dir s3://...``) is synced by the CLI into a local cache: ``model_dir`` is then
    the cache's copy, and ``model_url`` the URL."""

    model_dir: str
    model_id: str | None = None  # ORG/NAME on the Hugging Face Hub, whose snapshot in the Hub cache model_dir is
    model_revision: str | None = None  # the revision of model_id asked for: a branch, tag or commit
    model_commit: str | None = None  # the commit model_revision resolved to: the version of the model served
    model_url: str | None = None  # the store URL (s3://...) whose copy in the local cache model_dir is
    tuned_model_dir: str | None = None
    ckpt_name: str = "bert_model.ckpt"
    config_name: str = "bert_config.json"
    vocab_name: str | None = None
    calibration: str | None = None  # int8/uint8 embedding ranges (.calibration); None: the model dir's own

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_dir", os.fspath(self.model_dir))
        if self.tuned_model_dir is not None:
            object.__setattr__(self, "tuned_model_dir", os.fspath(self.tuned_model_dir))


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """How an input is made tokens: its length, its case, what happens to a longer one, and the
    instruction a yes/no reranker puts before it."""

    max_seq_len: int | str | None = None
    do_lower_case: bool | None = None
    long_inputs: str = "truncate"
    chunk_stride: int = 0
    instruction: str | None = None  # a yes/no reranker's (Qwen3-Reranker's) task instruction; None: its default

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_seq_len", _parse_max_seq_len(self.max_seq_len))
        object.__setattr__(self, "long_inputs", parse_long_inputs(self.long_inputs))
        if isinstance(self.chunk_stride, bool) or not isinstance(self.chunk_stride, int) or self.chunk_stride < 0:
            raise ModelOptionError(f"chunk_stride must be 0 or more tokens, not {self.chunk_stride!r}")
        if self.instruction is not None and (not isinstance(self.instruction, str) or not self.instruction.strip()):
            raise ModelOptionError(f"instruction must be some text, not {self.instruction!r}")


@dataclass(frozen=True, kw_only=True)
class Output:
    """What the model returns for an input: its task, how its tokens are pooled, and the
    vector's normalization and dtype."""

    task: str | None = None  # embed, rerank, classify, sparse; None (auto): what the model is
    pooling_strategy: PoolingStrategy | None = None
    pooling_layer: tuple[int, ...] | None = None
    mask_cls_sep: bool = False
    normalize: bool | None = None
    output_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.pooling_strategy is not None:
            object.__setattr__(self, "pooling_strategy", PoolingStrategy.parse(self.pooling_strategy))
        if self.pooling_layer is not None:
            object.__setattr__(self, "pooling_layer", _parse_layers(self.pooling_layer))
        output_dtype = _OUTPUT_DTYPES.get(str(self.output_dtype).lower())
        if output_dtype is None:
            raise ModelOptionError(f"unknown output_dtype {self.output_dtype!r}; choose float32 or float16")
        object.__setattr__(self, "output_dtype", output_dtype)
        object.__setattr__(self, "task", parse_task(self.task))


@dataclass(frozen=True, kw_only=True)
class Runtime:
    """What runs the model: its dtype and device, the graph's cache and XLA, and the batches."""

    dtype: str = "auto"  # chosen for the device and CPU when the options are resolved
    device: str | None = None
    xla: bool = False
    graph_dir: str | None = None
    batch_size: int = 64
    lite_max_tokens: int = 64

    def __post_init__(self) -> None:
        dtype = _DTYPES.get(str(self.dtype).lower())
        if dtype is None:
            raise ModelOptionError(f"unknown dtype {self.dtype!r}; choose {DTYPE_CHOICES}")
        object.__setattr__(self, "dtype", dtype)
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ModelOptionError(f"batch_size must be a positive integer, not {self.batch_size!r}")
        if not isinstance(self.lite_max_tokens, int) or self.lite_max_tokens < 0:
            raise ModelOptionError(f"lite_max_tokens must be 0 or more, not {self.lite_max_tokens!r}")


TASKS = ("embed", "rerank", "classify", "sparse")
"""What a model computes (see :mod:`..model.tasks`): sentence vectors, a cross-encoder's
relevance scores, a classifier's label scores, or SPLADE's sparse vectors."""


def parse_task(value: object) -> str | None:
    """A task named by the user, checked; None (or ``auto``) leaves it to the model."""
    if value is None:
        return None
    lowered = str(value).strip().lower()
    if lowered in ("", "auto"):
        return None
    if lowered not in TASKS:
        raise ModelOptionError(f"task must be one of {', '.join(TASKS)} (or auto: what the model is), not {value!r}")
    return lowered


LONG_INPUTS = ("truncate", "chunk")
"""What happens to an input longer than ``max_seq_len``: cut to fit, or encoded in windows."""


def parse_long_inputs(value: object) -> str:
    lowered = str(value).strip().lower()
    if lowered not in LONG_INPUTS:
        raise ModelOptionError(f"long_inputs must be truncate or chunk, not {value!r}")
    return lowered


def _parse_max_seq_len(value: object) -> int | str | None:
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().upper() == DYNAMIC:
            return DYNAMIC
        try:
            value = int(value)
        except ValueError:
            raise ModelOptionError(f"max_seq_len must be an integer or NONE, not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 3:
        raise ModelOptionError(f"max_seq_len must be an integer >= 3 or NONE, not {value!r}")
    return value


def _parse_layers(value: object) -> tuple[int, ...]:
    if isinstance(value, (int, str)):
        value = [value]
    if not isinstance(value, Sequence) or not value:
        raise ModelOptionError(f"pooling_layer must be a layer index or a list of them, not {value!r}")
    layers = []
    for item in value:
        try:
            layers.append(int(item))
        except (TypeError, ValueError):
            raise ModelOptionError(f"pooling_layer entries must be integers, not {item!r}") from None
    return tuple(layers)
