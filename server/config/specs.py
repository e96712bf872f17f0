"""The syntax of ``--model NAME=DIR[,key=value,...]`` and of model names.

``DIR`` may also be a model's Hugging Face Hub id, ``ORG/NAME[@REVISION]``, when no such
directory exists (:func:`..model.hub.is_model_id`): the CLI fetches it and writes the spec
again with its directory in the Hub cache (:func:`..model.hub_specs.fetch_hub_models`).

A name is what requests and the HTTP API use to pick a model, so it must be safe in a URL
path and a log line: a letter or digit, then up to 127 letters, digits and ``._:/-``
(``minilm``, ``bge-small-en:v1.5``, ``org/model``). Only the syntax is checked here, when
the config is built; which keys a model takes and what their values mean is
:mod:`.served`' business, as it needs the configs themselves.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
MODEL_NAME_RULE = "a letter or digit, then up to 127 letters, digits and . _ : / -"


@dataclass(frozen=True)
class ModelSpec:
    """One ``--model``: its name, its directory, and its own options as written
    (``key=value``, keys with ``_``, values unparsed)."""

    name: str
    model_dir: str
    options: tuple[tuple[str, str], ...] = ()

    def written(self) -> str:
        """The spec as ``--model`` takes it: ``NAME=DIR[,key=value,...]``."""
        return ",".join([f"{self.name}={self.model_dir}", *(f"{key}={value}" for key, value in self.options)])


def parse_model_spec(spec: str) -> ModelSpec:
    """``NAME=DIR[,key=value,...]``: a directory cannot hold a comma, since commas separate
    the options; a key may be written with ``-`` or ``_`` (``pooling-strategy``)."""
    head, *items = str(spec).split(",")
    name, equals, model_dir = (part.strip() for part in head.partition("="))
    if not equals or not name or not model_dir:
        raise ConfigError(f"--model takes NAME=DIR[,key=value,...], not {spec!r}")
    check_model_name(name, "--model")
    options: dict[str, str] = {}
    for item in items:
        key, equals, value = (part.strip() for part in item.partition("="))
        key = key.replace("-", "_")
        if not equals or not key:
            raise ConfigError(f"--model {name}: expected key=value after the directory, not {item.strip()!r}")
        if key in options:
            raise ConfigError(f"--model {name}: {key} is given twice")
        options[key] = value
    return ModelSpec(name, model_dir, tuple(options.items()))


def check_model_name(name: str, where: str) -> None:
    if not MODEL_NAME.fullmatch(name):
        raise ConfigError(f"{where}: {name!r} is not a model name ({MODEL_NAME_RULE})")


def check_default(default: str | None, names: Sequence[str]) -> None:
    """That ``--default-model``, when given, is one of the models served."""
    if default is not None and default not in names:
        raise ConfigError(f"--default-model {default} names no model served (served: {', '.join(names)})")


def check_models(
    specs: Sequence[str], models_dir: str | None, default: str | None, *, named: bool
) -> tuple[ModelSpec, ...]:
    """The ``--model`` specs parsed, once checked against each other and the flags beside
    them (``named``: ``--served-model-name`` or ``--model-alias`` given). What needs the
    file system (the folders of ``--models-dir``) is checked by :mod:`.served`."""
    if specs and models_dir is not None:
        raise ConfigError(
            "--model and --models-dir cannot be given together: serve the models of a folder, or those named one by one"
        )
    if named and (specs or models_dir is not None):
        raise ConfigError(
            "--served-model-name and --model-alias name the one model of --model-dir; with --model "
            "or --models-dir each model goes by its NAME"
        )
    parsed = tuple(parse_model_spec(spec) for spec in specs)
    names = [spec.name for spec in parsed]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"--model names {', '.join(twice)} more than once: each model needs a name of its own")
    if specs:
        check_default(default, names)
    return parsed
