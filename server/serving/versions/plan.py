"""The version swap's plan: from what is seen of the workers to the next steps.

A pure function of its inputs: no sockets, no processes, no clock of its own (``now`` comes
with what is seen), so each rule is tested with made-up workers and times. :mod:`.swap` looks
for versions, takes the snapshot, and carries the steps out. The rules (:mod:`.swap` tells
the story):

- one worker at a time, and never more than one beyond ``--num-worker``: a worker of the
  target version starts only while no new worker is loading and no old one is leaving;
- new requests go to the target version once one of its workers is ready;
- one old worker at a time drains (it gets nothing new), and is retired once it holds
  nothing; the last one of a version stays while work pinned to that version is queued;
- a new worker not ready after :data:`LOAD_TIMEOUT_S` is killed, and a new worker that dies
  before it is ready rolls the swap back: the target becomes the version served before;
- an old worker that dies during a swap is started again only while work pinned to its
  version is queued or was held by it, and no other worker of its version is left.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...config.server import ServerConfig

LOAD_TIMEOUT_S = 600.0  # a new-version worker not ready by then has failed to load


class SwapState(str, enum.Enum):
    """The ``state`` of the status's ``swap``: where the latest look or swap is."""

    IDLE = "idle"  # no RELOAD yet, nothing found by polling yet
    CHECKING = "checking"  # a RELOAD's look at the repository is running
    PREPARING = "preparing"  # the found version's graph is being built
    ROLLING = "rolling"
    ROLLING_BACK = "rolling_back"
    DONE = "done"
    ROLLED_BACK = "rolled_back"
    REFUSED = "refused"
    UNCHANGED = "unchanged"


FINAL_STATES = frozenset({SwapState.UNCHANGED, SwapState.REFUSED, SwapState.DONE, SwapState.ROLLED_BACK})


@dataclass(frozen=True)
class Worker:
    """What is seen of one local worker process."""

    version: int | None  # the model version it runs
    alive: bool = True
    retiring: bool = False  # told to stop; it is not started again
    ready: bool = False  # registered: it has loaded its model
    draining: bool = False  # gets nothing new
    holds_jobs: bool = False


@dataclass(frozen=True)
class Seen:
    """A snapshot: the local workers by index, the version new requests are pinned to, and
    the versions queued work is pinned to."""

    now: float
    serving: int | None
    workers: Mapping[int, Worker]
    queued: frozenset[int | None] = frozenset()


@dataclass(frozen=True)
class Release:
    """A version of a model as its workers run it: its options (their model directory the
    version's; their ``model_version`` what was asked) and its number (None: a model
    directory, not a version of a repository)."""

    config: ServerConfig
    version: int | None


@dataclass(frozen=True)
class Roll:
    """A swap under way: the release the workers converge on, the one served when it began,
    whether it is rolling back, and the new workers not ready yet (index -> started)."""

    target: Release
    previous: Release
    back: bool = False
    loading: Mapping[int, float] = field(default_factory=dict)

    @property
    def state(self) -> SwapState:
        return SwapState.ROLLING_BACK if self.back else SwapState.ROLLING

    def started(self, index: int, now: float) -> Roll:
        """Worker ``index`` of the target version started at ``now``."""
        return dataclasses.replace(self, loading={**self.loading, index: now})

    def _without(self, indexes: set[int]) -> Roll:
        return dataclasses.replace(self, loading={i: t for i, t in self.loading.items() if i not in indexes})


@dataclass(frozen=True)
class StartWorker:
    target: Release


@dataclass(frozen=True)
class ServeTarget:
    target: Release


@dataclass(frozen=True)
class DrainWorker:
    index: int
    version: int | None


@dataclass(frozen=True)
class RetireWorker:
    index: int  # drained, holding nothing


@dataclass(frozen=True)
class KillWorker:
    index: int  # not ready after LOAD_TIMEOUT_S


@dataclass(frozen=True)
class Finish:
    rolled_back: bool


Step = StartWorker | ServeTarget | DrainWorker | RetireWorker | KillWorker | Finish


class Death(enum.Enum):
    """What a worker's death during a swap leads to."""

    RESTART = "restart"  # started again, with the usual restarts and limits
    LET_GO = "let go"  # not started again: the swap no longer needs it
    ROLL_BACK = "roll back"  # a new worker died before it was ready: not started again, the swap rolls back


def plan(roll: Roll, seen: Seen) -> tuple[Roll, list[Step]]:
    """The steps of this turn towards ``--num-worker`` workers of the target version: kills
    of workers that did not load in time, serving the target, retiring drained workers, then
    at most one of starting a worker, draining one, or finishing."""
    target = roll.target.version
    workers = seen.workers
    fresh = [i for i, w in workers.items() if w.version == target]
    stale = sorted(i for i, w in workers.items() if w.version != target)
    ready = [i for i in fresh if workers[i].ready]
    roll = roll._without(set(ready))
    steps: list[Step] = [
        KillWorker(i)
        for i, started in roll.loading.items()
        if seen.now - started > LOAD_TIMEOUT_S and i in workers and workers[i].alive
    ]
    if ready and seen.serving != target:
        steps.append(ServeTarget(roll.target))
    leaving = {i for i in stale if workers[i].retiring}
    for i in stale:
        if not workers[i].retiring and workers[i].ready and workers[i].draining and not workers[i].holds_jobs:
            steps.append(RetireWorker(i))
            leaving.add(i)
    if leaving or len(ready) < len(fresh):
        return roll, steps  # one at a time: a worker is leaving, or a new one is loading
    if len(fresh) < roll.target.config.serving.num_worker and len(workers) <= roll.target.config.serving.num_worker:
        steps.append(StartWorker(roll.target))
    elif stale and not any(workers[i].draining for i in stale):
        steps.extend(_drain_one(stale, seen))
    elif not stale:
        steps.append(Finish(rolled_back=roll.back))
    return roll, steps


def _drain_one(stale: list[int], seen: Seen) -> list[Step]:
    """The first old worker that may go: the last ready one of a version stays while work
    pinned to that version is queued."""
    workers = seen.workers
    for index in stale:
        version = workers[index].version
        if not workers[index].ready:
            continue  # not registered (yet): nothing to drain
        others = [i for i in stale if i != index and workers[i].version == version and workers[i].ready]
        if version in seen.queued and not others:
            continue
        return [DrainWorker(index, version)]
    return []


def on_death(roll: Roll, seen: Seen, index: int) -> tuple[Roll, Death]:
    """Worker ``index`` died during a swap (``seen`` still shows it): whether it starts again."""
    target = roll.target.version
    worker = seen.workers[index]
    if index in roll.loading and worker.version == target:
        roll = roll._without({index})
        if roll.back:
            return roll, Death.RESTART  # the version served until now fails too: the usual restarts and limits
        return dataclasses.replace(roll, target=roll.previous, back=True), Death.ROLL_BACK
    if worker.version == target:
        return roll, Death.RESTART
    others = [i for i, w in seen.workers.items() if i != index and not w.retiring and w.version == worker.version]
    needed = (worker.holds_jobs or worker.version in seen.queued) and not others  # held jobs are handed on
    return roll, Death.RESTART if needed else Death.LET_GO
