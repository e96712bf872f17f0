"""The narrow interfaces between the head's parts, so that none of them sets another's fields.

The head has four parts, each the one owner of its state:

- the ventilator (:mod:`..head.ventilator`) owns the sockets, the requests admitted and, through
  :mod:`..head.registry`, which worker holds which job;
- the control answers (:mod:`..head.control`) own the counters and flags clients' commands change
  (a TERMINATE asked for, the RELOADs taken);
- the supervisor (:mod:`..process.supervisor`) owns the child processes, through :mod:`..process.children`,
  and so which model version each worker runs;
- the version swap (:mod:`.swap`) owns the version the workers converge on; the book of
  versions (:mod:`.book`) owns the swap's progress, the versions refused and the
  tokenizer of the version served.

Each part sees the others only through the :class:`typing.Protocol` below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ...config.server import ServerConfig

if TYPE_CHECKING:
    from ...model.prepare import Preparation
    from .plan import Release


class WorkerPool(Protocol):
    """What the version swap asks of the ventilator about the workers and the queue."""

    @property
    def serving_version(self) -> int | None:
        """The model version new requests are pinned to."""
        ...

    def serve_version(self, version: int | None, model_dir: str) -> None:
        """Pin new requests to ``version``, whose files are in ``model_dir`` (its workers are ready)."""
        ...

    def queued_versions(self) -> set[int | None]:
        """The versions that queued work is pinned to."""
        ...

    def worker_ready(self, index: int) -> bool:
        """Whether local worker ``index`` has registered (it loaded its model)."""
        ...

    def worker_draining(self, index: int) -> bool:
        """Whether local worker ``index`` is told to take nothing new."""
        ...

    def worker_holds_jobs(self, index: int) -> bool:
        """Whether local worker ``index`` holds a job now."""
        ...

    def drain_worker(self, index: int) -> None:
        """Local worker ``index`` gets nothing new, and finishes what it holds."""
        ...

    def stop_worker(self, index: int) -> None:
        """Tell local worker ``index`` (drained, holding nothing) to exit."""
        ...

    def take_reload(self) -> tuple[str, int] | None:
        """The version the latest RELOAD asked for (``latest`` or a number) and its count,
        once: ``None`` when no RELOAD came since the last call."""
        ...


class WorkerProcesses(Protocol):
    """What the version swap asks of the supervisor about the local worker processes."""

    def worker_versions(self) -> dict[int, int | None]:
        """Each local worker process (running, or waiting to start again) and the model
        version it runs."""
        ...

    def worker_alive(self, index: int) -> bool:
        """Whether the process of worker ``index`` runs."""
        ...

    def retiring_workers(self) -> set[int]:
        """The workers told to stop for a swap that have not exited yet."""
        ...

    def add_worker(self, release: Release) -> int:
        """Start one more worker, running ``release``; returns its index."""
        ...

    def retire_worker(self, index: int) -> None:
        """Worker ``index`` is told to stop: when it exits it is not started again."""
        ...

    def kill_worker(self, index: int) -> None:
        """Kill worker ``index`` if it runs (it did not load in time)."""
        ...

    def prepare(self, config: ServerConfig, steps: list[str]) -> Preparation | None:
        """Start building the ``steps`` ``config``'s workers load, in a process of its own
        (``None``: nothing to build)."""
        ...
