"""The local worker processes, each running one served model's version, and what one model's
version swap sees of them (:class:`..versions.interfaces.WorkerProcesses`): that model's workers only.

A served model as the supervisor keeps it is :class:`SupervisedModel`: the head's model
(:class:`..head.models.HeadModel`: its options, queue and the version served) with what only
the supervisor holds beside it, its versions book and swap.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...config.server import ServerConfig
from ...config.telemetry import Telemetry
from ..head.models import HeadModel
from ..protocol.wire import Addresses
from ..versions.book import VersionsBook
from ..versions.plan import Release
from ..versions.swap import VersionSwap
from ..worker.worker import run_worker
from .children import Children, worker_name

if TYPE_CHECKING:
    from ...model.prepare import Preparation

logger = logging.getLogger("bertserve.server")


@dataclass
class SupervisedModel:
    """A served model as the supervisor keeps it: the head's model, its versions book, whether
    it follows the newest version, what preflight found (its options' answers) and its swap."""

    head: HeadModel
    book: VersionsBook
    follow_latest: bool  # --model-version latest: newer versions are swapped in
    info: dict[str, Any]
    swap: VersionSwap | None = None

    @property
    def name(self) -> str:
        return self.head.name

    @property
    def config(self) -> ServerConfig:
        """Its options, with the directory of the version chosen at start."""
        return self.head.config

    @property
    def release(self) -> Release:
        """What its workers run until a swap: its options and the head's version."""
        return Release(self.head.config, self.head.version)


class LocalWorkers:
    """The local worker processes, by index (which runs on across the models), with the release
    (options and version) each runs; started and stopped through the supervisor's children."""

    def __init__(self, children: Children, telemetry: Telemetry) -> None:
        self.children = children
        self.telemetry = telemetry
        self.releases: dict[int, Release] = {}  # running, or waiting to start again
        self.addresses: Addresses | None = None  # set once the supervisor has made them

    def of(self, model: str) -> dict[int, Release]:
        """The workers of served model ``model``, with the release each runs."""
        releases = self.releases.items()
        return {index: release for index, release in releases if release.config.serving.served_model_name == model}

    def next_index(self) -> int:
        return max(self.releases, default=-1) + 1

    def start(self, index: int, release: Release | None = None) -> None:
        """Start worker ``index`` running ``release`` (default: what it ran before)."""
        assert self.addresses is not None
        release = self.releases[index] = release or self.releases[index]
        args = (release.config, index, self.addresses, self.telemetry, release.version)
        self.children.start(worker_name(index), run_worker, args, f"bertserve-worker-{index}")

    def add(self, release: Release) -> int:
        index = self.next_index()
        self.start(index, release)
        return index

    def forget(self, index: int) -> None:
        """Worker ``index`` is gone for good (a swap retired it, or no longer needs it)."""
        del self.releases[index]

    def prepare_for(self, model: SupervisedModel | None) -> Preparation | None:
        """The steps that make what ``model``'s local workers load, if it has any and one is missing."""
        return self.prepare(model.config) if model is not None and model.config.serving.num_worker else None

    def prepare(self, config: ServerConfig, steps: list[str] | None = None) -> Preparation | None:
        """The steps that make what ``config``'s workers load, if any is missing (``steps``
        when the caller has looked already)."""
        from ...model.prepare import BACKGROUND_NICE, STEP_NAMES, Preparation, missing_steps

        if config.serving.model_class:
            return None  # a model class loads itself
        try:
            steps = missing_steps(config.model) if steps is None else steps
        except (ValueError, TypeError, OSError) as exc:  # the workers will fail on it and say why
            logger.warning("cannot tell whether the model's graph is cached: %s", exc)
            return None
        if not steps:
            return None
        names = " and ".join(STEP_NAMES[step] for step in steps)
        logger.info("building the %s of model %s before a worker loads it", names, config.model.model_dir)
        # A worker's share of the cores, and while other workers serve (a swap, a later model),
        # the lowest priority: the serving workers keep theirs.
        nice = BACKGROUND_NICE if self.children.workers() else config.workers.worker_nice
        return Preparation(
            config.model,
            steps,
            cpu_only=config.workers.cpu,
            threads=config.worker_threads(),
            telemetry=self.telemetry,
            nice=nice,
        )


class ModelProcesses:
    """The local workers as one model's version swap sees them (:class:`..versions.interfaces.WorkerProcesses`):
    that model's worker processes only."""

    def __init__(self, workers: LocalWorkers, model: str) -> None:
        self.workers = workers
        self.model = model

    def worker_versions(self) -> dict[int, int | None]:
        return {index: release.version for index, release in self.workers.of(self.model).items()}

    def worker_alive(self, index: int) -> bool:
        return self.workers.children.alive(worker_name(index))

    def retiring_workers(self) -> set[int]:
        children = self.workers.children
        return {index for index in self.workers.of(self.model) if children.retiring(worker_name(index))}

    def add_worker(self, release: Release) -> int:
        return self.workers.add(release)

    def retire_worker(self, index: int) -> None:
        self.workers.children.retire(worker_name(index))

    def kill_worker(self, index: int) -> None:
        self.workers.children.kill(worker_name(index))

    def prepare(self, config: ServerConfig, steps: list[str] | None = None) -> Preparation | None:
        return self.workers.prepare(config, steps)
