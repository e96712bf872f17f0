"""The narrow interfaces between the head's parts, so that none of them sets another's fields.

The head has four parts, each the one owner of its state:

- the ventilator (:mod:`.ventilator`) owns the sockets, the requests admitted and, through
  :mod:`.registry`, which worker holds which job;
- the control answers (:mod:`.control`) own the counters and flags clients' commands change
  (a TERMINATE asked for, the RELOADs taken);
- the supervisor (:mod:`.supervisor`) owns the child processes, through :mod:`.children`;
- the version swap (:mod:`.swap`) owns which model version each worker runs, the swap's
  progress and the versions refused.

Each part sees the others only through the :class:`typing.Protocol` below.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..config import ServerConfig


class WorkerPool(Protocol):
    """What the version swap asks of the ventilator about the workers and the queue."""

    @property
    def serving_version(self) -> int | None:
        """The model version new requests are pinned to."""
        ...

    def serve_version(self, config: ServerConfig) -> None:
        """Pin new requests to ``config``'s version (its workers are ready)."""
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


class VersionsView(Protocol):
    """What the ventilator's status shows of the model versions: read only."""

    def version_status(self) -> dict[str, Any]:
        """``refused_versions`` (each with why and when) and ``swap`` (the latest swap's progress)."""
        ...
