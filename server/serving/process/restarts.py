"""When a child process that died starts again: the rule both supervising processes follow,
the head's :class:`.supervisor.BertServer` and a worker machine's :class:`..remote.host.WorkerHost`.

A child that fails is started again after a delay that doubles with each failure in a row
(:func:`restart_delay`); after ``max_restarts`` failures in a row its supervisor gives up. A
child that stayed up :data:`STABLE_SECONDS` has its failures forgiven: its next failure counts
as the first. A child retired on purpose (a version swap told it to stop) is not restarted.

:class:`RestartPolicy` holds no process and reads no clock: the time comes in as ``now``, so
the rule is tested with made-up times. :class:`.children.Children` applies it to processes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

STABLE_SECONDS = 60.0  # a process up this long has its failures forgiven
_FIRST_BACKOFF = 0.5  # seconds before the first restart; doubled for each failure in a row
_MAX_BACKOFF = 30.0


def restart_delay(failures: int) -> float:
    """Seconds to wait before restarting a process that failed ``failures`` times in a row."""
    return min(_MAX_BACKOFF, _FIRST_BACKOFF * 2 ** (failures - 1))


class Fate(enum.Enum):
    """What a child's exit leads to."""

    RESTART = "restart"  # it starts again once its delay is over
    GIVE_UP = "give up"  # it failed more than max_restarts times in a row: the supervisor stops
    RETIRED = "retired"  # it was told to stop: gone for good
    LET_GO = "let go"  # it died, and is not wanted any more: gone for good


@dataclass(frozen=True)
class Exit:
    """A child's exit, judged: its fate, its failures in a row, and the seconds until it
    starts again (for :attr:`Fate.RESTART`)."""

    fate: Fate
    failures: int = 0
    delay: float = 0.0


class RestartPolicy:
    """The failures in a row, the restart times and the start times of children, by name."""

    def __init__(self, max_restarts: int) -> None:
        self.max_restarts = max_restarts
        self._failures: dict[str, int] = {}  # name -> failures in a row
        self._restart_at: dict[str, float] = {}  # name -> when to start it again
        self._started_at: dict[str, float] = {}  # name -> when it was last started
        self._retiring: set[str] = set()  # told to stop: not restarted

    def started(self, name: str, now: float) -> None:
        self._started_at[name] = now

    def exited(self, name: str, now: float, *, wanted: Callable[[], bool] | None = None) -> Exit:
        """``name`` exited. Retired, or not ``wanted()`` (asked only if it was not retired),
        it is forgotten; else its failure is counted and its restart scheduled, backing off,
        unless this is failure ``max_restarts + 1`` in a row."""
        if name in self._retiring or (wanted is not None and not wanted()):
            fate = Fate.RETIRED if name in self._retiring else Fate.LET_GO
            self.forget(name)
            return Exit(fate)
        failures = self._failures[name] = self._failures.get(name, 0) + 1
        if failures > self.max_restarts:
            return Exit(Fate.GIVE_UP, failures)
        delay = restart_delay(failures)
        self._restart_at[name] = now + delay
        return Exit(Fate.RESTART, failures, delay)

    def waiting(self, name: str) -> bool:
        """Whether ``name`` died and waits for its restart."""
        return name in self._restart_at

    def due(self, name: str, now: float) -> bool:
        """Whether the restart of ``name`` is due; once told so, it is no longer waiting."""
        at = self._restart_at.get(name)
        if at is None or now < at:
            return False
        del self._restart_at[name]
        return True

    def forgive(self, now: float) -> None:
        """Children up :data:`STABLE_SECONDS` since their last start: their next failure
        counts as the first."""
        for name, started in self._started_at.items():
            if now - started > STABLE_SECONDS:
                self._failures.pop(name, None)

    def failures(self, name: str) -> int:
        return self._failures.get(name, 0)

    def retire(self, name: str) -> None:
        """``name`` is told to stop: when it exits it is not restarted."""
        self._retiring.add(name)

    def retiring(self, name: str) -> bool:
        return name in self._retiring

    def forget(self, name: str) -> None:
        """``name`` is gone for good (retired, or no longer needed)."""
        for times in (self._failures, self._restart_at, self._started_at):
            times.pop(name, None)
        self._retiring.discard(name)

    def clear(self) -> None:
        for times in (self._failures, self._restart_at, self._started_at):
            times.clear()
        self._retiring.clear()
