"""The models one server serves, each with a name and a config of its own.

A server serves the one model of ``--model-dir``, the models named one by one with
``--model NAME=DIR[,key=value,...]``, or every model of ``--models-dir``. A
:class:`ServedModel` carries the whole server's config with that model's options in it, so
a role given one model's config needs to know nothing of the others.

A model's options start from the flags: ``--dtype int8`` is every model's dtype unless its
``--model`` says ``dtype=...``, and ``--num-worker`` every model's worker count likewise. The
keys a ``--model`` takes are the model options (``pooling_strategy``, ``dtype``,
``max_seq_len``, ``batch_size``, ``normalize``, ...) and :data:`SERVER_OPTIONS`. A value is
written as its flag takes it; booleans are ``true``/``false`` (``1``/``0``, ``yes``/``no``);
several pooling layers are joined with ``+`` (``pooling_layer=-1+-2``); an empty value gives
an option that may be left out (``None``) the meaning of leaving it out, whatever its flag
says (``normalize=``: what the model says).

``--models-dir`` is a model repository laid out as Triton's and TF Serving's are::

    models/fast/      config.json  model.safetensors  vocab.txt ...
    models/minilm/1/  ...          (numbered versions, as --model-dir takes them)
    models/minilm/2/  ...

each subfolder served, in sorted order, as if ``--model NAME=models/NAME`` had been given
(hidden folders and plain files are left out).

A ``--model`` whose directory is a Hub id (``bge=BAAI/bge-small-en-v1.5@main``) is fetched by
:func:`fetch_hub_models`, once, in the process that reads the command line: its spec is
written again with the model's directory in the Hub cache and :data:`.model.HUB_FIELDS`, so
every process after it reads a directory.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, get_args, get_origin, get_type_hints

from bertserve.client.protocol import TASKS

from ..errors import ConfigError, ModelFileError
from ..model.default import DEFAULT_MODEL_NAME, DEFAULT_MODEL_PACKAGE
from ..model.hub import HubModel, fetch_model, is_model_id
from ..model.model_dir import detect_layout
from ..model.repository import is_repository, versions
from ..model.tasks import TASK_NAMES, model_task, served_with
from .model import HUB_FIELDS, ModelConfig
from .server import ServerConfig
from .specs import ModelSpec, check_default, check_model_name, parse_model_spec

SERVER_OPTIONS = (
    "num_worker",
    "model_version",
    "default_prompt_name",
    "poll_interval_s",
    "require_manifest",
    "model_class",
)
"""The server's options a ``--model`` may set for its own model, beside the model options."""


@dataclass(frozen=True)
class ServedModel:
    """One model of the server: the name requests pick it by, and the server's config with
    this model's options in it (``served_model_name`` is ``name``; ``models``,
    ``models_dir``, ``default_model`` and ``model_defaults`` are left out)."""

    name: str
    config: ServerConfig


def served_models(config: ServerConfig) -> list[ServedModel]:
    """Every model ``config`` serves, in the order given (``--models-dir``: sorted by name);
    the one model of ``--model-dir`` alone, named as the HTTP API has always named it.
    Raises :class:`ConfigError` naming the model whose option is unknown or malformed, and
    a ``--default-model`` that is not served."""
    specs = _specs(config)
    if not specs:
        name = directory_name(config) if config.served_model_name is None else config.served_model_name
        check_default(config.default_model, [name])
        one = dataclasses.replace(config, served_model_name=name, default_model=None, task_defaults=())
        return [ServedModel(name, one)]
    check_default(config.default_model, [spec.name for spec in specs])
    flags = config.model_defaults or config.model
    return [_served(config, flags, spec) for spec in specs]


def default_model_name(config: ServerConfig) -> str:
    """The model a request gets unless it names one: ``--default-model``, else the first served."""
    served = served_models(config)  # checks --default-model too
    return config.default_model or served[0].name


def task_defaults(config: ServerConfig) -> dict[str, str]:
    """The model a request of each served task gets unless it names one (by the request's
    task: ``/rerank`` asks for ``rerank``): ``--default-model TASK=NAME``, else the default
    model if it has that task, else the first model served with it. Raises
    :class:`ConfigError` for a ``TASK=NAME`` whose task is not one, whose model is not
    served, or whose model has another task."""
    served = served_models(config)
    tasks = {entry.name: model_task(entry.config.model.model_dir, entry.config.model.task) for entry in served}
    chosen: dict[str, str] = {}
    for item in config.task_defaults:
        task, _, name = item.partition("=")
        task, name = task.strip().lower(), name.strip()
        if task not in TASKS:
            raise ConfigError(
                f"--default-model {item}: {task!r} is not a task; say TASK=NAME, TASK one of {', '.join(TASKS)}"
            )
        check_default(name, list(tasks))
        if tasks[name] != task:
            raise ConfigError(
                f"--default-model {item}: the model {name!r} is {TASK_NAMES[tasks[name]]} (task {tasks[name]}), "
                f"not of task {task}; {served_with(task, [n for n, own in tasks.items() if own == task])}"
            )
        chosen[task] = name
    default = config.default_model or served[0].name
    for name, task in [(default, tasks[default]), *tasks.items()]:
        chosen.setdefault(task, name)
    return chosen


def with_default_model(config: ServerConfig) -> ServerConfig:
    """``config``, whose ``model`` holds the model flags, with several models: its ``model``
    the default model's options, so that code reading ``config.model`` reads the default
    model's, and the flags kept in ``model_defaults`` (with the default model's directory),
    from which every model's options start. With one model, ``config`` itself."""
    if not config.models and config.models_dir is None:
        return config
    served = served_models(config)
    name = config.default_model or served[0].name
    model = next(entry.config.model for entry in served if entry.name == name)
    flags = (config.model_defaults or config.model).replace(model_dir=model.model_dir)
    return dataclasses.replace(config, model=model, model_defaults=flags)


def directory_name(config: ServerConfig) -> str:
    """The name the model of ``--model-dir`` goes by unless ``--served-model-name`` says:
    its directory's (a directory called ``model`` goes by its parent's), its repository's for
    a version of one, its Hub id (``BAAI/bge-small-en-v1.5``) for a model of the Hub, and
    all-MiniLM-L6-v2 for the model installed as the default."""
    if config.model.model_id is not None:
        return config.model.model_id
    path = os.path.normpath(config.model.model_dir)
    version = os.path.basename(path)
    if version.isdigit() and int(version) == config.version_number:  # a version of a repository
        path = os.path.dirname(path)
    base = os.path.basename(path)
    parent = os.path.basename(os.path.dirname(path))
    name = base if base != "model" or not parent else parent
    return DEFAULT_MODEL_NAME if name == DEFAULT_MODEL_PACKAGE else name


def hub_fields(model: HubModel) -> dict[str, str]:
    """The model config's fields of a model fetched from the Hub: its directory, id, revision and commit."""
    return {
        "model_dir": model.directory,
        "model_id": model.repo_id,
        "model_revision": model.revision,
        "model_commit": model.commit,
    }


def fetch_hub_models(specs: Sequence[str]) -> tuple[str, ...]:
    """The ``--model`` specs, each whose directory is a Hub id fetched into the Hub cache and
    written again with its directory there and what it is (:data:`.model.HUB_FIELDS`); the
    others as given. Raises :class:`..errors.HubError` naming the model that cannot be had."""
    written = []
    for text in specs:
        spec = parse_model_spec(text)
        if not is_model_id(spec.model_dir):
            written.append(text)
            continue
        given = [key for key, _ in spec.options if key in HUB_FIELDS]
        if given:
            raise ConfigError(f"--model {spec.name}: {given[0]} is what the Hub says, not an option")
        try:
            fields = hub_fields(fetch_model(spec.model_dir))
        except ModelFileError as exc:
            taken = f"no directory {spec.model_dir} exists, so it was taken for a Hub id, and "
            raise type(exc)(f"--model {spec.name}: {taken}{exc}") from exc
        if "," in fields["model_dir"]:
            raise ConfigError(
                f"--model {spec.name}: the Hub cache {fields['model_dir']} has a comma in its path, which --model "
                "cannot hold; set HF_HOME to a path without one"
            )
        options = (*((key, value) for key, value in fields.items() if key != "model_dir"), *spec.options)
        written.append(ModelSpec(spec.name, fields["model_dir"], options).written())
    return tuple(written)


def share_cores(models: list[ServedModel]) -> list[ServedModel]:
    """``models`` with the cores shared out among all their local workers, unless
    ``--threads-per-worker`` says how many each takes: each model's workers would otherwise
    take the machine's cores as if they were alone on it."""
    workers = sum(model.config.num_worker for model in models)
    if len(models) < 2 or workers < 1 or models[0].config.threads_per_worker is not None:
        return models
    threads = max(1, (os.cpu_count() or 1) // workers)
    return [ServedModel(m.name, dataclasses.replace(m.config, threads_per_worker=threads)) for m in models]


@functools.cache
def option_types() -> dict[str, Any]:
    """The keys a ``--model`` takes, each with the type of the field it sets."""
    server = get_type_hints(ServerConfig)
    types = {key: kind for key, kind in get_type_hints(ModelConfig).items() if key not in ("model_dir", *HUB_FIELDS)}
    return {**types, **{key: server[key] for key in SERVER_OPTIONS}}


def _served(config: ServerConfig, flags: ModelConfig, spec: ModelSpec) -> ServedModel:
    types = option_types()
    hub = {key: text for key, text in spec.options if key in HUB_FIELDS}  # written by fetch_hub_models
    unknown = [key for key, _ in spec.options if key not in types and key not in hub]
    if unknown:
        raise ConfigError(f"--model {spec.name}: unknown option {unknown[0]!r}; a model takes {', '.join(types)}")
    values = {key: _value(spec.name, key, text, types[key]) for key, text in spec.options if key not in hub}
    own = {key: value for key, value in values.items() if key in SERVER_OPTIONS}
    try:
        model = flags.replace(model_dir=spec.model_dir, **hub, **{k: v for k, v in values.items() if k not in own})
        served = dataclasses.replace(
            config,
            model=model,
            served_model_name=spec.name,
            models=(),
            models_dir=None,
            default_model=None,
            task_defaults=(),
            model_defaults=None,
            **own,
        )
    except ConfigError as exc:  # ModelOptionError too
        raise type(exc)(f"--model {spec.name}: {exc}") from None
    return ServedModel(spec.name, served)


def _value(name: str, key: str, text: str, kind: Any) -> Any:
    """``text`` as the value of the field ``key`` of type ``kind``; the configs check the rest."""
    kinds = set(get_args(kind)) or {kind}
    if not text and type(None) in kinds:
        return None
    try:
        if bool in kinds:
            return _boolean(text)
        if kinds == {int}:
            return int(text)
        if float in kinds:
            return float(text)
    except ValueError:
        what = "true or false" if bool in kinds else "an integer" if int in kinds else "a number"
        raise ConfigError(f"--model {name}: {key} must be {what}, not {text!r}") from None
    if any(get_origin(each) is tuple for each in kinds):
        return tuple(text.split("+"))  # pooling_layer=-1+-2
    return text


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _specs(config: ServerConfig) -> list[ModelSpec]:
    if config.models_dir is not None:
        return _folder_specs(config.models_dir, config.model.config_name)
    return [parse_model_spec(spec) for spec in config.models]


def _folder_specs(models_dir: str, config_name: str) -> list[ModelSpec]:
    """A model for each subfolder of ``models_dir``; refuses a folder that is one model's
    directory, or one model's numbered versions, rather than serve its parts as models."""
    if not os.path.isdir(models_dir):
        raise ConfigError(f"--models-dir {models_dir} is not a directory")
    names = sorted(
        name
        for name in os.listdir(models_dir)
        if not name.startswith(".") and os.path.isdir(os.path.join(models_dir, name))
    )
    if is_repository(models_dir) and len(versions(models_dir)) == len(names):
        raise ConfigError(
            f"--models-dir {models_dir} holds the numbered versions of one model: serve it with "
            "--model-dir, or move it into a folder of its own inside --models-dir"
        )
    if _is_model_dir(models_dir, config_name):
        raise ConfigError(
            f"--models-dir {models_dir} is a model directory itself: serve it with --model-dir, or "
            "move it into a folder of its own inside --models-dir"
        )
    if not names:
        raise ConfigError(f"--models-dir {models_dir} holds no model: it needs a subfolder for each, named by it")
    for name in names:
        check_model_name(name, f"--models-dir {models_dir}")
    return [ModelSpec(name, os.path.join(models_dir, name)) for name in names]


def _is_model_dir(path: str, config_name: str) -> bool:
    try:
        detect_layout(path, config_name)
    except ModelFileError:
        return False
    return True
