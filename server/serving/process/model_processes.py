"""Each served model as the supervisor keeps it, and what one model's version swap sees of
the worker processes (:class:`.interfaces.WorkerProcesses`): that model's workers only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ...config.server import ServerConfig
from ..versions.book import VersionsBook
from ..versions.swap import VersionSwap
from .children import Children, worker_name

if TYPE_CHECKING:
    from ...model.prepare import Preparation


class Supervisor(Protocol):
    """What :class:`ModelProcesses` asks of the supervisor: its children and local workers."""

    children: Children

    def workers_of(self, model: str) -> dict[int, ServerConfig]: ...

    def worker_alive(self, index: int) -> bool: ...

    def add_worker(self, config: ServerConfig) -> int: ...

    def retire_worker(self, index: int) -> None: ...

    def kill_worker(self, index: int) -> None: ...

    def prepare(self, config: ServerConfig, steps: list[str] | None = None) -> Preparation | None: ...


@dataclass
class ServedModelState:
    """A served model as the supervisor keeps it: its config (the version chosen), versions,
    swap, and what preflight found (its options' answers, the sha256 of its files)."""

    name: str
    config: ServerConfig
    book: VersionsBook
    follow_latest: bool  # --model-version latest: newer versions are swapped in
    info: dict[str, Any]
    sha256: str
    swap: VersionSwap | None = None


class ModelProcesses:
    """The supervisor as one model's version swap sees it (:class:`.interfaces.WorkerProcesses`):
    that model's worker processes only."""

    def __init__(self, supervisor: Supervisor, model: str) -> None:
        self.supervisor = supervisor
        self.model = model

    def worker_versions(self) -> dict[int, int | None]:
        return {index: config.version_number for index, config in self.supervisor.workers_of(self.model).items()}

    def worker_alive(self, index: int) -> bool:
        return self.supervisor.worker_alive(index)

    def retiring_workers(self) -> set[int]:
        children = self.supervisor.children
        return {index for index in self.supervisor.workers_of(self.model) if children.retiring(worker_name(index))}

    def add_worker(self, config: ServerConfig) -> int:
        return self.supervisor.add_worker(config)

    def retire_worker(self, index: int) -> None:
        self.supervisor.retire_worker(index)

    def kill_worker(self, index: int) -> None:
        self.supervisor.kill_worker(index)

    def prepare(self, config: ServerConfig, steps: list[str] | None = None) -> Preparation | None:
        return self.supervisor.prepare(config, steps)
