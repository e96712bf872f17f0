"""The models one head serves, each with its own queue, prompts and version.

Models are a dimension of the head: each model has its own :class:`..policy.scheduler.Scheduler`
(its clients' queues, under the same fairness and admission rules as every other model's),
its own workers (the registry knows each worker's model) and its own model version, so jobs
never mix models and a flood on one model is never in another's queue. A request names its
model (``"model"`` in its header), or gets the default one.

:class:`ModelPool` is what a version swap of one model sees of the ventilator
(:class:`..versions.interfaces.WorkerPool`): that model's version and queue, and the workers by index.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...config.server import ServerConfig
from ...model.prompts import Prompts
from ...model.tasks import model_task, model_tasks
from ..policy.scheduler import Scheduler
from .control import Control
from .registry import Registry


class VersionsView(Protocol):
    """What the ventilator's status shows of the model versions: read only."""

    def version_status(self) -> dict[str, Any]:
        """``refused_versions`` (each with why and when) and ``swap`` (the latest swap's progress)."""
        ...


@dataclass
class HeadModel:
    """One served model, as the head sees it: its options, fixed once built, and its state:
    its queue, and the model version new requests are pinned to, which a swap changes
    (:meth:`serve`). The version lives here only: the options' ``model_version`` is what was
    asked (``latest`` or a number)."""

    name: str
    config: ServerConfig  # its options, with the directory of the version served at start
    scheduler: Scheduler
    prompts: Prompts = field(default_factory=lambda: Prompts({}, None))
    sha256: str = ""  # of its files: a remote worker that joins for it must have the same
    versions_view: VersionsView | None = None  # its versions' side of the status
    version: int | None = None  # new requests are pinned to it (None: not from a repository)
    model_dir: str = field(init=False)  # the directory of that version

    def __post_init__(self) -> None:
        self.model_dir = self.config.model.model_dir

    def serve(self, version: int | None, model_dir: str) -> None:
        """New requests are pinned to ``version``, whose files are in ``model_dir`` (a swap's
        workers of it are ready)."""
        self.version, self.model_dir = version, model_dir

    @property
    def served_config(self) -> ServerConfig:
        """Its options with the directory of the version now served."""
        return self.config if self.model_dir == self.config.model.model_dir else self.config.in_dir(self.model_dir)

    @property
    def model_version(self) -> str:
        """CONFIG's ``model_version``: the version served, else what was asked (``latest``)."""
        return self.config.serving.model_version if self.version is None else str(self.version)


class Models:
    """The served models by name, in the order given; the default one first unless named."""

    def __init__(
        self, models: Sequence[HeadModel], default: str | None = None, task_defaults: Mapping[str, str] | None = None
    ) -> None:
        if not models:
            raise ValueError("a head serves at least one model")
        self.by_name = {model.name: model for model in models}
        if len(self.by_name) != len(models):
            raise ValueError("two served models have the same name")
        self.default = self.by_name[default] if default is not None else models[0]
        # A request of a task that names no model: its task's default (ServerConfig.routing.tasks)
        self.task_defaults = {task: self.by_name[name] for task, name in (task_defaults or {}).items()}

    @classmethod
    def single(cls, config: ServerConfig, scheduler: Scheduler, name: str = "", **options: Any) -> Models:
        """One model: the whole server's."""
        return cls([HeadModel(name or config.serving.served_model_name or "default", config, scheduler, **options)])

    def __iter__(self) -> Iterator[HeadModel]:
        return iter(self.by_name.values())

    def __len__(self) -> int:
        return len(self.by_name)

    @property
    def names(self) -> list[str]:
        return list(self.by_name)

    def get(self, name: str | None, task: str | None = None) -> HeadModel | None:
        """The model called ``name``; ``None`` if none is. Without a name, the default model of
        ``task`` (a request's task: ``rerank``...), else the default one."""
        if name is not None:
            return self.by_name.get(name)
        return self.task_defaults.get(task, self.default) if task is not None else self.default

    def of_task(self, task: str) -> list[str]:
        """The names of the served models of ``task``, as their files say."""
        return [model.name for model in self if task in model_tasks(model.model_dir, model.config.model.task)]

    def default_names(self) -> dict[str, str]:
        """Each served task's default model, by name (CONFIG's ``default_models``)."""
        return {task: model.name for task, model in self.task_defaults.items()}

    def unknown(self, name: object) -> str:
        """The error for a request that names no served model."""
        served = ", ".join(repr(known) for known in self.by_name)
        return f"this server serves no model {name!r}; it serves {served}"


class Workers(Protocol):
    """What :class:`ModelPool` asks of the ventilator: the local workers by index, the RELOADs
    taken, and pinning a model's new requests to a version."""

    control: Control

    def serve_version(self, model: HeadModel, version: int | None, model_dir: str) -> None: ...

    def worker_ready(self, index: int) -> bool: ...

    def worker_draining(self, index: int) -> bool: ...

    def worker_holds_jobs(self, index: int) -> bool: ...

    def drain_worker(self, index: int) -> None: ...

    def stop_worker(self, index: int) -> None: ...


class ModelPool:
    """The ventilator as one model's version swap sees it (:class:`..versions.interfaces.WorkerPool`)."""

    def __init__(self, ventilator: Workers, model: HeadModel) -> None:
        self.ventilator = ventilator
        self.model = model

    @property
    def serving_version(self) -> int | None:
        return self.model.version

    def serve_version(self, version: int | None, model_dir: str) -> None:
        self.ventilator.serve_version(self.model, version, model_dir)

    def queued_versions(self) -> set[int | None]:
        return self.model.scheduler.versions()

    def worker_ready(self, index: int) -> bool:
        return self.ventilator.worker_ready(index)

    def worker_draining(self, index: int) -> bool:
        return self.ventilator.worker_draining(index)

    def worker_holds_jobs(self, index: int) -> bool:
        return self.ventilator.worker_holds_jobs(index)

    def drain_worker(self, index: int) -> None:
        self.ventilator.drain_worker(index)

    def stop_worker(self, index: int) -> None:
        self.ventilator.stop_worker(index)

    def take_reload(self) -> tuple[str, int] | None:
        return self.ventilator.control.take_reload(self.model.name)


# -- what CONFIG and STATUS say of each model ------------------------------------------------


def model_ready(model: HeadModel, registry: Registry) -> bool:
    """Whether a worker serves ``model``."""
    return registry.serving_count(model.name) > 0


def model_summary(model: HeadModel, registry: Registry) -> dict[str, Any]:
    """``model`` as CONFIG lists it among the models served."""
    info = registry.model_info(model.name, model.version)
    return {
        "name": model.name,
        "output_dim": info.get("output_dim"),
        "max_seq_len": info.get("max_seq_len"),
        "dtype": info.get("dtype"),
        "pooling_strategy": info.get("pooling_strategy"),
        "task": info.get("task") or model_task(model.config.model.model_dir, model.config.model.task),
        "tasks": info.get("tasks") or list(model_tasks(model.config.model.model_dir, model.config.model.task)),
        "model_version": model.version,
        "workers": registry.serving_count(model.name),
        "prompts": sorted(model.prompts.texts),
        "ready": model_ready(model, registry),
    }


def model_status(model: HeadModel, registry: Registry, queue: dict[str, Any], *, default: bool) -> dict[str, Any]:
    """``model``'s part of STATUS: its workers, its queue (``queue``: its scheduler's stats) and versions."""
    workers = [w for w in registry.workers.values() if w.model == model.name]
    return {
        "default": default,
        "ready": model_ready(model, registry),
        "workers": len(workers),
        "jobs_in_flight": sum(len(w.jobs) for w in workers),
        "worker_versions": sorted({w.version for w in workers}, key=lambda v: -1 if v is None else v),
        "bulk_planning": model.scheduler.throughput.describe(time.monotonic()),
        **queue,
        **versions_status(model),
    }


def versions_status(model: HeadModel) -> dict[str, Any]:
    """The version ``model`` serves, the versions refused and its swap's progress (nothing for
    a model that is not a repository of versions)."""
    if model.version is None:
        return {}
    view = model.versions_view.version_status() if model.versions_view is not None else {}
    return {"model_version": model.version, "refused_versions": [], "swap": {}, **view}
