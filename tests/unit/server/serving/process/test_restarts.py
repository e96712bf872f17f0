"""The restart rule of child processes (:mod:`bertserve.server.serving.process.restarts`), with made-up
times: backoff, giving up, forgiving a child that stayed up, retired children."""

from __future__ import annotations

from bertserve.server.serving.process.restarts import STABLE_SECONDS, Fate, RestartPolicy, restart_delay


def test_the_delay_doubles_with_each_failure_in_a_row_up_to_a_cap() -> None:
    assert [restart_delay(n) for n in range(1, 9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_a_failed_child_starts_again_once_its_delay_is_over() -> None:
    policy = RestartPolicy(max_restarts=5)
    policy.started("sink", 0.0)
    verdict = policy.exited("sink", 1.0)
    assert (verdict.fate, verdict.failures, verdict.delay) == (Fate.RESTART, 1, 0.5)
    assert policy.waiting("sink") and not policy.due("sink", 1.4)
    assert policy.due("sink", 1.5)
    assert not policy.waiting("sink") and not policy.due("sink", 2.0)  # told once
    policy.started("sink", 1.5)
    verdict = policy.exited("sink", 2.0)
    assert (verdict.fate, verdict.failures, verdict.delay) == (Fate.RESTART, 2, 1.0)
    assert not policy.due("sink", 2.9) and policy.due("sink", 3.0)


def test_the_supervisor_gives_up_after_max_restarts_failures_in_a_row() -> None:
    policy = RestartPolicy(max_restarts=2)
    now = 0.0
    fates = []
    for _ in range(3):
        policy.started("worker 0", now)
        verdict = policy.exited("worker 0", now + 0.1)
        fates.append((verdict.fate, verdict.failures))
        now += 0.1 + verdict.delay
        assert verdict.fate is Fate.GIVE_UP or policy.due("worker 0", now)
    assert fates == [(Fate.RESTART, 1), (Fate.RESTART, 2), (Fate.GIVE_UP, 3)]
    assert not policy.waiting("worker 0")  # nothing starts after giving up


def test_failures_are_counted_per_child() -> None:
    policy = RestartPolicy(max_restarts=1)
    assert policy.exited("worker 0", 0.0).fate is Fate.RESTART
    assert policy.exited("worker 1", 0.0).fate is Fate.RESTART
    assert policy.failures("worker 0") == policy.failures("worker 1") == 1


def test_a_child_up_long_enough_has_its_failures_forgiven() -> None:
    policy = RestartPolicy(max_restarts=2)
    policy.started("http", 0.0)
    policy.exited("http", 1.0)
    assert policy.due("http", 1.5)
    policy.started("http", 1.5)
    policy.exited("http", 2.0)
    assert policy.due("http", 3.0)
    policy.started("http", 3.0)
    policy.forgive(3.0 + STABLE_SECONDS)  # not quite
    assert policy.failures("http") == 2
    policy.forgive(3.0 + STABLE_SECONDS + 0.1)
    assert policy.failures("http") == 0
    verdict = policy.exited("http", 100.0)
    assert (verdict.fate, verdict.failures, verdict.delay) == (Fate.RESTART, 1, 0.5)  # counts as the first


def not_asked() -> bool:
    raise AssertionError("asked whether a retired child is wanted")


def test_a_retired_child_is_not_restarted_and_is_forgotten() -> None:
    policy = RestartPolicy(max_restarts=2)
    policy.started("worker 1", 0.0)
    policy.exited("worker 1", 1.0)
    assert policy.due("worker 1", 2.0)
    policy.started("worker 1", 2.0)
    policy.retire("worker 1")
    verdict = policy.exited("worker 1", 3.0, wanted=not_asked)  # whether it is wanted is not even asked
    assert verdict.fate is Fate.RETIRED
    assert not policy.waiting("worker 1") and not policy.retiring("worker 1") and policy.failures("worker 1") == 0


def test_a_child_no_longer_wanted_is_let_go() -> None:
    policy = RestartPolicy(max_restarts=2)
    policy.started("worker 2", 0.0)
    assert policy.exited("worker 2", 1.0, wanted=lambda: False).fate is Fate.LET_GO
    assert not policy.waiting("worker 2") and policy.failures("worker 2") == 0
    assert policy.exited("worker 2", 2.0, wanted=lambda: True).fate is Fate.RESTART
