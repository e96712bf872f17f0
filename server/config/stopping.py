"""The stop budget: the longest a stop takes, from the signal to the exit, and each stage's share.

A process manager gives a stopping program a grace period, then kills it: Docker 10 s by
default (``docker stop -t``, ``docker run --stop-timeout``), Compose ``stop_grace_period``,
Kubernetes ``terminationGracePeriodSeconds`` (which a ``preStop`` hook's time counts against),
systemd ``TimeoutStopSec``. A server killed there tells nobody anything: its callers see a
connection closed without a response. So ``--stop-timeout`` is the whole stop, and its default
fits Docker's grace with room to spare.

The stages share it (:meth:`StopBudget.plan`): what is in flight gets most of it to finish
(the drain); then what is left fails with a ``shutdown`` error to each caller, a worker still
in a model run is killed (nobody wants its answer any more), the sink publishes the failures,
the front ends send them, and every child has exited by :attr:`StopPlan.end`, a little before
the budget's end.
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass

from ..errors import ConfigError

STOP_TIMEOUT_SECONDS = 8.0
"""Default budget: inside Docker's default grace of 10 s, with 2 s for the runtime and the exit."""
MAX_STOP_TIMEOUT_SECONDS = 3600.0
TAIL_SECONDS = (1.0, 3.0)
"""After the drain: at least this long (or half the budget, if less) to fail what is left and
stop the children, and at most the second (a quarter of the budget in between)."""
FRONT_END_STOP_SIGNAL = signal.SIGUSR1
"""What a supervisor sends its HTTP front end to stop it: the front end leaves SIGTERM to its
supervisor while that lives, as every child does (a signal to the process group reaches it too)."""
EXIT_MARGIN_SECONDS = 0.25
"""Left at the end, for the process to exit once its children have."""


@dataclass(frozen=True)
class StopPlan:
    """A stop's deadlines on the monotonic clock, from the moment it began."""

    began: float
    drain_until: float  # what is in flight gets until then to finish; what is left then fails
    workers_until: float  # a worker still running then is killed
    sink_until: float  # the sink has published the failures by then
    end: float  # every child has exited (the rest are killed), and the process exits

    def left(self, deadline: float, now: float) -> float:
        """Seconds from ``now`` to ``deadline``, never below zero."""
        return max(0.0, deadline - now)


@dataclass(frozen=True)
class StopBudget:
    """``--stop-timeout``: the whole stop, in seconds."""

    seconds: float = STOP_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        seconds = self.seconds
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            raise ConfigError(f"stop_timeout must be a number of seconds, not {seconds!r}")
        if not 0 < seconds <= MAX_STOP_TIMEOUT_SECONDS:
            raise ConfigError(
                f"stop_timeout must be more than 0 and at most {MAX_STOP_TIMEOUT_SECONDS:.0f} seconds, "
                f"not {seconds:g}: it is the whole stop, from the signal to the exit"
            )

    @property
    def tail(self) -> float:
        """What follows the drain: failing what is left and stopping every child."""
        low, high = TAIL_SECONDS
        return min(max(0.25 * self.seconds, min(low, 0.5 * self.seconds)), high)

    @property
    def drain(self) -> float:
        return self.seconds - self.tail

    def plan(self, began: float) -> StopPlan:
        """The deadlines of a stop that began at ``began`` (``time.monotonic()``)."""
        drained = began + self.drain
        tail = self.tail
        end = began + self.seconds - min(EXIT_MARGIN_SECONDS, 0.1 * self.seconds)
        return StopPlan(
            began=began,
            drain_until=drained,
            workers_until=drained + 0.25 * tail,
            sink_until=drained + 0.5 * tail,
            end=end,
        )
