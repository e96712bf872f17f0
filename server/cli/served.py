"""The models ``bertserve start`` serves, resolved from the command line into
``ServerConfig.models`` (:class:`..config.served.ModelServing`, one each), with which one a
request of each task gets unless it names one.

``--models-dir`` is a model repository laid out as Triton's and TF Serving's are::

    models/fast/      config.json  model.safetensors  vocab.txt ...
    models/minilm/1/  ...          (numbered versions, as --model-dir takes them)
    models/minilm/2/  ...

each subfolder served, in sorted order, as if ``--model NAME=models/NAME`` had been given
(hidden folders and plain files are left out). A ``--model`` whose directory is a Hub id is
fetched first (:func:`..model.hub_specs.fetch_hub_models`). A model at a store URL
(``s3://bucket/minilm``) is synced into its local cache (:func:`sync_store`) before anything
reads its files.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from bertserve.client.protocol import TASKS

from ..config.served import ModelServing, Routing, serve_spec
from ..config.specs import ModelSpec, check_default, check_model_name, parse_model_spec
from ..errors import ConfigError, ModelFileError
from ..model.model_dir import detect_layout
from ..model.repository import choose, is_repository, versions
from ..model.store import ModelStore
from ..model.store_files import is_store_url
from ..model.tasks import TASK_NAMES, model_tasks, served_with

logger = logging.getLogger("bertserve.server")


def resolve_models(flags: ModelServing, routing: Routing) -> tuple[tuple[ModelServing, ...], Routing]:
    """Every model served, in the order given (``--models-dir``: sorted by name), and
    ``routing`` with each task's default model; the one model of ``--model-dir`` (``flags``
    itself) alone. With several models, ``routing`` keeps the flags every model started
    from, with the default model's directory, as CONFIG shows them. Raises
    :class:`ConfigError` naming the model whose option is unknown or malformed, a
    ``--default-model`` that is not served, and a ``TASK=NAME`` of another task's model."""
    if not routing.several:
        models: tuple[ModelServing, ...] = (flags,)
        check_default(routing.default_model, [flags.name])
    else:
        specs = _specs(routing, flags.model.config_name)
        check_default(routing.default_model, [spec.name for spec in specs])
        models = tuple(serve_spec(flags, spec) for spec in specs)
        default = next(model for model in models if model.name == (routing.default_model or models[0].name))
        defaults = flags.replace(model=flags.model.replace(model_dir=default.model.model_dir))
        routing = dataclasses.replace(routing, model_defaults=defaults)
    models = tuple(sync_store(model) for model in models)
    return models, dataclasses.replace(routing, tasks=tuple(task_defaults(models, routing).items()))


def sync_store(model: ModelServing) -> ModelServing:
    """``model`` as served from its local cache when its directory is a store URL: the
    version asked for (or the newest that can be had) synced and checked first
    (:meth:`..model.store.ModelStore.start`); a store out of reach leaves the cache to serve
    what it holds. Raises :class:`..model.store_files.StoreError` naming the URL and the cause
    when nothing can be served."""
    url = model.model.model_dir
    if not is_store_url(url):
        return model
    store = ModelStore(
        url, model.model_cache, keep_versions=model.keep_versions, max_bytes_per_s=model.sync_max_bytes_per_s
    )
    local, rejected = store.start(model.model_version)
    for refusal in rejected:
        logger.error("refused version %d of %s: %s", refusal.number, store.url, refusal.reason)
    return model.replace(model=model.model.replace(model_dir=local, model_url=store.url.url))


def synced_version_dir(model: ModelServing) -> str:
    """For a command that reads one version of a store model (``embed``, a worker host): the
    model synced (:func:`sync_store`), and the directory of the version it asks for (or the
    newest) in the cache, checked against its manifest."""
    local = sync_store(model).model.model_dir
    if not is_repository(local):
        return local
    return choose(local, model.model_version, model.model, require_manifest=True, settle_s=0.0)[0].path


def task_defaults(models: tuple[ModelServing, ...], routing: Routing) -> dict[str, str]:
    """The model a request of each served task gets unless it names one (by the request's
    task: ``/rerank`` asks for ``rerank``): ``--default-model TASK=NAME``, else the default
    model if it has that task, else the first model served with it. Raises
    :class:`ConfigError` for a ``TASK=NAME`` whose task is not one, whose model is not
    served, or whose model has another task."""
    answered = {model.name: model_tasks(model.model.model_dir, model.model.task) for model in models}
    tasks = {name: own[0] for name, own in answered.items()}
    chosen: dict[str, str] = {}
    for item in routing.task_defaults:
        task, _, name = item.partition("=")
        task, name = task.strip().lower(), name.strip()
        if task not in TASKS:
            raise ConfigError(
                f"--default-model {item}: {task!r} is not a task; say TASK=NAME, TASK one of {', '.join(TASKS)}"
            )
        check_default(name, list(tasks))
        if task not in answered[name]:
            raise ConfigError(
                f"--default-model {item}: the model {name!r} is {TASK_NAMES[tasks[name]]} (task {tasks[name]}), "
                f"not of task {task}; {served_with(task, [n for n, own in tasks.items() if own == task])}"
            )
        chosen[task] = name
    default = routing.default_model or models[0].name
    for name, task in [(default, tasks[default]), *tasks.items()]:  # a task's own models first
        chosen.setdefault(task, name)
    for name, own in [(default, answered[default]), *answered.items()]:  # then those that answer it too
        for task in own:
            chosen.setdefault(task, name)
    return chosen


def _specs(routing: Routing, config_name: str) -> list[ModelSpec]:
    if routing.models_dir is not None:
        return _folder_specs(routing.models_dir, config_name)
    return [parse_model_spec(spec) for spec in routing.models]


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
