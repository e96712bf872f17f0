"""A model's options (:class:`ModelConfig`): its parts, one a concern (:mod:`.model_parts`),
each checked when built.

Every option also goes by its flat name, the ``bertserve start`` flag with ``-`` written ``_``
(``model.dtype``, ``model.max_seq_len``): :meth:`ModelConfig.of` builds the options from those
names, as ``--model`` specs, the command line, a head's WELCOME and the tests give them,
:meth:`ModelConfig.replace` changes them, and :meth:`ModelConfig.flat` lists them.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, get_type_hints

from .model_parts import (
    DTYPE_CHOICES,
    DYNAMIC,
    LONG_INPUTS,
    TASKS,
    Inputs,
    ModelSource,
    Output,
    PoolingStrategy,
    Runtime,
    parse_long_inputs,
    parse_task,
)

__all__ = [
    "DTYPE_CHOICES",
    "DYNAMIC",
    "FIELDS",
    "HUB_FIELDS",
    "LONG_INPUTS",
    "SOURCE_FIELDS",
    "TASKS",
    "Inputs",
    "ModelConfig",
    "ModelSource",
    "Output",
    "PoolingStrategy",
    "Runtime",
    "parse_long_inputs",
    "parse_task",
]

_PARTS: dict[str, Any] = {"source": ModelSource, "inputs": Inputs, "output": Output, "runtime": Runtime}
"""Each part of a model's options, by its field of :class:`ModelConfig`: the class that builds it."""

FIELDS = (
    "model_dir",
    "model_id",
    "model_revision",
    "model_commit",
    "model_url",
    "tuned_model_dir",
    "ckpt_name",
    "config_name",
    "vocab_name",
    "max_seq_len",
    "pooling_strategy",
    "pooling_layer",
    "mask_cls_sep",
    "normalize",
    "do_lower_case",
    "dtype",
    "output_dtype",
    "xla",
    "graph_dir",
    "batch_size",
    "lite_max_tokens",
    "device",
    "long_inputs",
    "chunk_stride",
    "task",
    "calibration",
    "instruction",
)
"""The options' flat names, in the order CONFIG lists them."""

_PART_OF = {name: part for part, kind in _PARTS.items() for name in (f.name for f in dataclasses.fields(kind))}

HUB_FIELDS = ("model_id", "model_revision", "model_commit")
"""The fields that say which model of the Hub ``model_dir`` holds: not options of a model, and
not a remote worker's business (its files are checked by their sha256)."""
SOURCE_FIELDS = (*HUB_FIELDS, "model_url")
"""The fields that say where ``model_dir``'s files came from: the Hub's, and a store's URL."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Everything that decides which model is loaded and which graph is built, one part a
    concern: where its files are (:class:`.model_parts.ModelSource`), how an input is made
    tokens (:class:`.model_parts.Inputs`), what it returns (:class:`.model_parts.Output`) and
    what runs it (:class:`.model_parts.Runtime`). Each option is also a read-only property of
    its flat name, forwarded to its part."""

    source: ModelSource
    inputs: Inputs = dataclasses.field(default_factory=Inputs)
    output: Output = dataclasses.field(default_factory=Output)
    runtime: Runtime = dataclasses.field(default_factory=Runtime)

    @classmethod
    def of(cls, **options: Any) -> ModelConfig:
        """The options named by their flat names (``model_dir`` among them), each in its part.
        Raises ``TypeError`` for a name that is no option, and what the parts raise for a value
        they refuse."""
        return cls(**{part: kind(**_take(options, part)) for part, kind in _PARTS.items()})

    def replace(self, **changes: Any) -> ModelConfig:
        """These options with those ``changes``, named by their flat names."""
        parts = {
            part: dataclasses.replace(getattr(self, part), **own) for part in _PARTS if (own := _take(changes, part))
        }
        return dataclasses.replace(self, **parts)

    def flat(self) -> dict[str, Any]:
        """The options by their flat names, in :data:`FIELDS`' order, as ``dataclasses.asdict``
        gives them."""
        values = {key: value for part in _PARTS for key, value in dataclasses.asdict(getattr(self, part)).items()}
        return {name: values[name] for name in FIELDS}

    @property
    def dynamic_length(self) -> bool:
        return self.max_seq_len == DYNAMIC

    @property
    def model_dir(self) -> str:
        return self.source.model_dir

    @property
    def model_id(self) -> str | None:
        return self.source.model_id

    @property
    def model_revision(self) -> str | None:
        return self.source.model_revision

    @property
    def model_commit(self) -> str | None:
        return self.source.model_commit

    @property
    def model_url(self) -> str | None:
        return self.source.model_url

    @property
    def tuned_model_dir(self) -> str | None:
        return self.source.tuned_model_dir

    @property
    def ckpt_name(self) -> str:
        return self.source.ckpt_name

    @property
    def config_name(self) -> str:
        return self.source.config_name

    @property
    def vocab_name(self) -> str | None:
        return self.source.vocab_name

    @property
    def calibration(self) -> str | None:
        return self.source.calibration

    @property
    def max_seq_len(self) -> int | str | None:
        return self.inputs.max_seq_len

    @property
    def do_lower_case(self) -> bool | None:
        return self.inputs.do_lower_case

    @property
    def long_inputs(self) -> str:
        return self.inputs.long_inputs

    @property
    def chunk_stride(self) -> int:
        return self.inputs.chunk_stride

    @property
    def instruction(self) -> str | None:
        return self.inputs.instruction

    @property
    def task(self) -> str | None:
        return self.output.task

    @property
    def pooling_strategy(self) -> PoolingStrategy | None:
        return self.output.pooling_strategy

    @property
    def pooling_layer(self) -> tuple[int, ...] | None:
        return self.output.pooling_layer

    @property
    def mask_cls_sep(self) -> bool:
        return self.output.mask_cls_sep

    @property
    def normalize(self) -> bool | None:
        return self.output.normalize

    @property
    def output_dtype(self) -> str:
        return self.output.output_dtype

    @property
    def dtype(self) -> str:
        return self.runtime.dtype

    @property
    def device(self) -> str | None:
        return self.runtime.device

    @property
    def xla(self) -> bool:
        return self.runtime.xla

    @property
    def graph_dir(self) -> str | None:
        return self.runtime.graph_dir

    @property
    def batch_size(self) -> int:
        return self.runtime.batch_size

    @property
    def lite_max_tokens(self) -> int:
        return self.runtime.lite_max_tokens


def _take(options: dict[str, Any], part: str) -> dict[str, Any]:
    """The options of ``part`` in ``options``; raises ``TypeError`` for one that is no option."""
    unknown = [name for name in options if name not in _PART_OF]
    if unknown:
        raise TypeError(f"ModelConfig takes no option {unknown[0]!r}")
    return {name: value for name, value in options.items() if _PART_OF[name] == part}


@functools.cache
def option_types() -> dict[str, Any]:
    """Each option's type, by its flat name, in :data:`FIELDS`' order."""
    types = {name: kind for part in _PARTS.values() for name, kind in get_type_hints(part).items()}
    return {name: types[name] for name in FIELDS}
