"""The version swap's plan (:mod:`bertserve.server.serving.versions.plan`), on made-up workers and
times: a roll one worker at a time, a rollback, the last old worker kept for queued work, the
load timeout, and old workers that die during a swap."""

from __future__ import annotations

import dataclasses

from bertserve.server.serving.versions.plan import (
    LOAD_TIMEOUT_S,
    Death,
    DrainWorker,
    Finish,
    KillWorker,
    Release,
    RetireWorker,
    Roll,
    Seen,
    ServeTarget,
    StartWorker,
    Step,
    SwapState,
    Worker,
    on_death,
    plan,
)
from bertserve.server.testing.config import server_config


def config(version: int, num_worker: int = 2) -> Release:
    return Release(server_config(f"/models/{version}", model_version=str(version), num_worker=num_worker), version)


class World:
    """The local workers as the swap would see them, with the steps carried out as the swap
    and the supervisor would: a started worker gets the next index and loads, and so on."""

    def __init__(self, versions: list[int], serving: int) -> None:
        self.workers = {index: Worker(version, ready=True) for index, version in enumerate(versions)}
        self.serving: int | None = serving
        self.queued: set[int | None] = set()
        self.most = len(self.workers)  # the most workers at once

    def seen(self, now: float = 0.0) -> Seen:
        return Seen(now, self.serving, dict(self.workers), frozenset(self.queued))

    def change(self, index: int, **fields: bool) -> None:
        self.workers[index] = dataclasses.replace(self.workers[index], **fields)

    def turn(self, roll: Roll, now: float = 0.0) -> tuple[Roll, list[Step]]:
        roll, steps = plan(roll, self.seen(now))
        for step in steps:
            if isinstance(step, StartWorker):
                index = max(self.workers, default=-1) + 1
                self.workers[index] = Worker(step.target.version)
                roll = roll.started(index, now)
            elif isinstance(step, ServeTarget):
                self.serving = step.target.version
            elif isinstance(step, DrainWorker):
                self.change(step.index, draining=True)
            elif isinstance(step, RetireWorker):
                self.change(step.index, retiring=True)
        self.most = max(self.most, len(self.workers))
        return roll, steps


def test_a_roll_replaces_the_workers_one_at_a_time() -> None:
    v1, v2 = config(1), config(2)
    world = World([1, 1], serving=1)
    roll = Roll(target=v2, previous=v1)
    assert roll.state is SwapState.ROLLING
    roll, steps = world.turn(roll)
    assert steps == [StartWorker(v2)] and dict(roll.loading) == {2: 0.0}
    roll, steps = world.turn(roll)
    assert steps == []  # worker 2 is loading
    world.change(2, ready=True)
    roll, steps = world.turn(roll)
    assert steps == [ServeTarget(v2), DrainWorker(0, 1)] and not roll.loading
    world.change(0, holds_jobs=True)
    assert world.turn(roll)[1] == []  # worker 0 finishes its jobs
    world.change(0, holds_jobs=False)
    roll, steps = world.turn(roll)
    assert steps == [RetireWorker(0)]
    assert world.turn(roll)[1] == []  # nothing starts while a worker is leaving
    del world.workers[0]  # it exited
    roll, steps = world.turn(roll)
    assert steps == [StartWorker(v2)] and 3 in roll.loading
    assert world.turn(roll)[1] == []
    world.change(3, ready=True)
    roll, steps = world.turn(roll)
    assert steps == [DrainWorker(1, 1)]
    roll, steps = world.turn(roll)
    assert steps == [RetireWorker(1)]
    del world.workers[1]
    roll, steps = world.turn(roll)
    assert steps == [Finish(rolled_back=False)]
    assert world.most == 3 and world.serving == 2  # never more than one worker beyond num_worker
    assert {w.version for w in world.workers.values()} == {2}


def test_a_new_worker_that_dies_before_it_is_ready_rolls_the_swap_back() -> None:
    v1, v2 = config(1, num_worker=1), config(2, num_worker=1)
    world = World([1], serving=1)
    roll, steps = world.turn(Roll(target=v2, previous=v1))
    assert steps == [StartWorker(v2)]
    roll, death = on_death(roll, world.seen(), 1)
    assert death is Death.ROLL_BACK
    assert roll.target == v1 and roll.back and roll.state is SwapState.ROLLING_BACK and not roll.loading
    del world.workers[1]
    roll, steps = world.turn(roll)
    assert steps == [Finish(rolled_back=True)] and world.serving == 1


def test_a_rollback_after_the_flip_serves_the_old_version_again() -> None:
    v1, v2 = config(1), config(2)
    world = World([1, 1], serving=1)
    roll, _ = world.turn(Roll(target=v2, previous=v1))
    world.change(2, ready=True)
    roll, _ = world.turn(roll)  # version 2 served, worker 0 drains
    roll, _ = world.turn(roll)  # worker 0 retired
    del world.workers[0]
    roll, steps = world.turn(roll)
    assert steps == [StartWorker(v2)]
    roll, death = on_death(roll, world.seen(), 3)  # it cannot load version 2
    del world.workers[3]
    assert death is Death.ROLL_BACK and roll.target == v1
    world.queued = {2}  # work pinned to version 2 is still queued
    roll, steps = world.turn(roll)
    assert steps == [ServeTarget(v1), StartWorker(v1)] and world.serving == 1
    world.change(3, ready=True)
    assert world.turn(roll)[1] == []  # worker 2 stays: the last of version 2, with work queued for it
    world.queued = set()
    roll, steps = world.turn(roll)
    assert steps == [DrainWorker(2, 2)]
    roll, _ = world.turn(roll)
    del world.workers[2]
    roll, steps = world.turn(roll)
    assert steps == [Finish(rolled_back=True)]
    assert sorted(w.version for w in world.workers.values()) == [1, 1]


def test_the_last_old_worker_stays_while_work_pinned_to_its_version_is_queued() -> None:
    v1, v2 = config(1, num_worker=1), config(2, num_worker=1)
    world = World([1], serving=1)
    roll, _ = world.turn(Roll(target=v2, previous=v1))
    world.queued = {1}
    world.change(1, ready=True)
    roll, steps = world.turn(roll)
    assert steps == [ServeTarget(v2)]  # worker 0 is not drained
    assert world.turn(roll)[1] == []
    world.queued = {2}
    roll, steps = world.turn(roll)
    assert steps == [DrainWorker(0, 1)]


def test_with_two_old_workers_one_drains_even_with_work_queued_for_their_version() -> None:
    v1, v2 = config(1), config(2)
    world = World([1, 1], serving=1)
    world.queued = {1}
    roll, _ = world.turn(Roll(target=v2, previous=v1))
    world.change(2, ready=True)
    assert world.turn(roll)[1] == [ServeTarget(v2), DrainWorker(0, 1)]


def test_a_new_worker_not_ready_in_time_is_killed() -> None:
    v1, v2 = config(1, num_worker=1), config(2, num_worker=1)
    world = World([1], serving=1)
    roll, _ = world.turn(Roll(target=v2, previous=v1), now=100.0)
    assert world.turn(roll, now=100.0 + LOAD_TIMEOUT_S)[1] == []
    roll, steps = world.turn(roll, now=100.1 + LOAD_TIMEOUT_S)
    assert steps == [KillWorker(1)]
    world.change(1, alive=False)  # killed, its death not seen yet: not killed again
    assert world.turn(roll, now=101.0 + LOAD_TIMEOUT_S)[1] == []
    roll, death = on_death(roll, world.seen(), 1)
    assert death is Death.ROLL_BACK


def test_an_old_worker_that_dies_during_a_swap_is_replaced_only_when_needed() -> None:
    v1, v2 = config(1, num_worker=3), config(2, num_worker=3)
    world = World([1, 1, 1], serving=1)
    roll, _ = world.turn(Roll(target=v2, previous=v1))
    world.change(3, ready=True)
    roll, _ = world.turn(roll)
    assert on_death(roll, world.seen(), 0)[1] is Death.LET_GO  # others of version 1 are left
    world.change(1, retiring=True)
    world.change(2, retiring=True)
    assert on_death(roll, world.seen(), 0)[1] is Death.LET_GO  # the last, but nothing needs version 1
    world.queued = {1}
    assert on_death(roll, world.seen(), 0)[1] is Death.RESTART  # work pinned to version 1 is queued
    world.queued = set()
    world.change(0, holds_jobs=True)
    assert on_death(roll, world.seen(), 0)[1] is Death.RESTART  # its jobs go back to the queue
    assert on_death(roll, world.seen(), 3)[1] is Death.RESTART  # a ready worker of the target


def test_a_worker_of_the_old_version_that_dies_while_rolling_back_is_restarted() -> None:
    v1 = config(1, num_worker=1)
    world = World([], serving=2)
    world.workers[1] = Worker(2, ready=True)  # version 2 was served, and failed on its next worker
    roll = Roll(target=v1, previous=v1, back=True)
    roll, steps = world.turn(roll)
    assert steps == [StartWorker(v1)]  # version 2 is served until a worker of version 1 is ready
    roll, death = on_death(roll, world.seen(), 2)  # version 1 cannot load either
    assert death is Death.RESTART and roll.back and not roll.loading  # the usual restarts and limits
