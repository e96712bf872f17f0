"""The worker registry: credits, jobs held, heartbeats and deadlines, with a fake clock."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from bertserve.server.serving.head.registry import MAX_CREDITS, Registry
from bertserve.server.serving.policy.jobs import Job, Piece
from bertserve.server.serving.protocol.link_bodies import Done, Ready


def job(job_id: str, key: str = "k", size: int = 2, bulk: bool = False) -> Job:
    piece = Piece(key, b"c", np.arange(size), ["t"] * size, False, False, 0.0)
    return Job(job_id, [piece], bulk=bulk)


def registry() -> Registry:
    r = Registry(job_timeout_s=5.0, heartbeat_timeout_s=3.0)
    r.add(b"w0-1", Ready.model_validate({"worker": 0, "pid": 1, "credits": 2, "model": {"output_dim": 4}}), now=0.0)
    r.add(b"w1-2", Ready(worker=1, pid=2, credits=1), now=0.0)
    return r


def done(job_id: str, worker: str, **stats: Any) -> Done:
    return Done(job=job_id, worker=worker, **stats)


def warmed() -> Registry:
    """:func:`registry` with each worker past its first small job, which took 9.9 s (its
    first runs' one-off costs) and is not learned from."""
    r = registry()
    for identity, worker in r.workers.items():
        r.assign(worker, job("warm"), now=-20.0)
        r.done(identity, done("warm", identity.decode(), seconds=9.9), now=-10.0)
        assert worker.short_seconds is None
    return r


def test_the_worker_with_most_free_credits_gets_the_next_job() -> None:
    r = registry()
    first = r.pick()
    assert first is not None and first.identity == b"w0-1"
    r.assign(first, job("1"), now=0.0)
    second = r.pick()
    assert second is not None and second.identity == b"w1-2"  # equal free credits: fewer jobs wins
    r.assign(second, job("2"), now=0.0)
    third = r.pick()
    assert third is not None and third.identity == b"w0-1"
    r.assign(third, job("3"), now=0.0)
    assert r.pick() is None and r.in_flight == 3
    assert r.model_info("", None) == {"output_dim": 4} and r.model_info("other", None) == {}


def test_a_short_job_may_overtake_only_on_a_worker_that_holds_only_long_work() -> None:
    r = registry()
    assert r.pick_overtake(4) is None  # idle workers take short jobs on their credits
    r.assign(r.workers[b"w0-1"], job("b1", bulk=True), now=0.0)
    r.assign(r.workers[b"w0-1"], job("b2", bulk=True), now=0.0)
    r.assign(r.workers[b"w1-2"], job("s1"), now=0.0)
    chosen = r.pick_overtake(4)
    assert chosen is not None and chosen.identity == b"w0-1"
    r.assign(chosen, job("s2"), now=0.0)  # beyond its credits
    assert chosen.free == -1 and r.pick() is None and r.pick_overtake(4) is None
    r.done(b"w0-1", done("s2", "w0-1"), now=1.0)
    assert r.pick_overtake(4) is chosen


def test_a_merged_job_of_several_model_runs_may_be_overtaken_too() -> None:
    r = registry()
    r.assign(r.workers[b"w1-2"], job("merged", size=9), now=0.0)  # not bulk, but more than one run of 4
    r.assign(r.workers[b"w0-1"], job("short", size=4), now=0.0)
    chosen = r.pick_overtake(4)
    assert chosen is not None and chosen.identity == b"w1-2"
    assert r.pick_overtake(9) is None  # one run of 9: nothing to slip in between


def test_done_counts_only_for_the_worker_that_holds_the_job() -> None:
    r = registry()
    worker = r.pick()
    assert worker is not None
    r.assign(worker, job("1", size=3), now=0.0)
    assert r.done(b"w1-2", done("1", "w1-2"), now=1.0) is None  # not that worker's job
    assert r.done(b"w9-9", done("1", "w9-9"), now=1.0) is None  # a worker the registry forgot
    finished = r.done(worker.identity, done("1", "w0-1", seconds=0.5, tokens=30, slots=40), now=1.0)
    assert finished is not None and finished.job_id == "1"
    assert r.done(worker.identity, done("1", "w0-1"), now=1.0) is None  # delivered twice: counted once
    stats = r.stats(now=2.0)
    w0 = stats["workers"][0]
    assert (w0["jobs_done"], w0["sentences"], w0["tokens"], w0["token_slots"]) == (1, 3, 30, 40)
    assert stats["padding_fraction"] == 0.25


def test_remove_hands_back_the_jobs_oldest_first() -> None:
    r = registry()
    worker = r.workers[b"w0-1"]
    r.assign(worker, job("late"), now=2.0)
    r.assign(worker, job("early"), now=1.0)
    assert [j.job_id for j in r.remove(b"w0-1")] == ["early", "late"]
    assert r.remove(b"w0-1") == [] and len(r) == 1


def test_silent_workers_and_overdue_jobs_are_reported() -> None:
    r = registry()
    r.assign(r.workers[b"w1-2"], job("1"), now=0.0)
    r.heartbeat(b"w1-2", now=2.9)
    assert r.unresponsive(now=2.9) == []
    found = {w.identity: why for w, why in r.unresponsive(now=3.5)}
    assert list(found) == [b"w0-1"] and "no heartbeat" in found[b"w0-1"]
    r.heartbeat(b"w0-1", now=5.5)
    r.heartbeat(b"w1-2", now=5.5)
    found = {w.identity: why for w, why in r.unresponsive(now=5.5)}
    assert list(found) == [b"w1-2"] and "a job has run for 5.5 s" in found[b"w1-2"]
    assert r.in_flight_keys() == {"k"}


def test_a_job_that_loses_two_workers_is_not_to_be_retried() -> None:
    r = registry()
    held = job("1")
    r.assign(r.workers[b"w0-1"], held, now=0.0)
    assert r.lose(b"w0-1") == ([held], []) and held.failures == 1
    r.assign(r.workers[b"w1-2"], held, now=1.0)
    assert r.lose(b"w1-2") == ([], [held]) and held.failures == 2
    assert r.lose(b"w1-2") == ([], []) and len(r) == 0


def test_a_worker_gets_at_most_the_credit_cap_whatever_it_asks() -> None:
    r = Registry(job_timeout_s=5.0, heartbeat_timeout_s=3.0)
    greedy = r.add(b"h/w0-1", Ready(worker=0, pid=1, credits=2**31 - 1), now=0.0, host=b"h")
    assert greedy.credits == MAX_CREDITS == 8
    for i in range(MAX_CREDITS):
        assert r.pick() is greedy
        r.assign(greedy, job(str(i)), now=0.0)
    assert r.pick() is None  # every job beyond the cap waits for another worker
    roomy = Registry(job_timeout_s=5.0, heartbeat_timeout_s=3.0, max_credits=12)
    assert roomy.add(b"w0-1", Ready(worker=0, pid=1, credits=12), now=0.0).credits == 12


def test_a_result_is_answered_once_and_forgotten_with_its_job() -> None:
    r = registry()
    r.assign(r.workers[b"w0-1"], job("1"), now=0.0)
    assert r.held(b"w0-1", "1") is not None and r.held(b"w1-2", "1") is None and r.held(b"w9", "1") is None
    assert not r.answered(b"w0-1", "1")
    assert r.answer(b"w0-1", "1") and not r.answer(b"w0-1", "1")
    r.done(b"w0-1", done("1", "w0-1"), now=1.0)
    assert not r.answered(b"w0-1", "1")


def test_a_workers_word_on_its_model_leaves_with_it_and_a_local_workers_comes_first() -> None:
    def ready(**model: Any) -> Ready:
        return Ready.model_validate({"worker": 0, "pid": 1, "credits": 1, "model": model})

    r = Registry(job_timeout_s=5.0, heartbeat_timeout_s=3.0)
    r.add(b"h-1/w0-1", ready(output_dim=99), now=0.0, host=b"h-1")
    r.add(b"h-2/w0-1", ready(output_dim=98), now=1.0, host=b"h-2")
    assert r.model_info("", None) == {"output_dim": 99}  # the remote worker that joined first
    r.remove(b"h-1/w0-1")
    assert r.model_info("", None) == {"output_dim": 98}
    r.add(b"w0-3", ready(output_dim=16), now=2.0)
    assert r.model_info("", None) == {"output_dim": 16}  # the head's own worker speaks over any remote one
    r.remove(b"h-2/w0-1")
    r.remove(b"w0-3")
    assert r.model_info("", None) == {"output_dim": 16}  # kept across a local worker's restart
    r2 = Registry(job_timeout_s=5.0, heartbeat_timeout_s=3.0)
    r2.add(b"h-1/w0-1", ready(output_dim=99), now=0.0, host=b"h-1")
    r2.lose(b"h-1/w0-1")
    assert r2.model_info("", None) == {}  # gone with the only worker that said it


def test_a_busy_worker_is_sent_its_next_small_job_a_hand_off_before_its_job_in_hand_ends() -> None:
    r = warmed()
    w0 = r.workers[b"w0-1"]
    r.assign(w0, job("1"), now=0.0)
    assert r.free_at(w0) is None  # no small job run yet: the scheduler's max_latency_ms decides
    r.done(b"w0-1", done("1", "w0-1", seconds=0.100), now=0.11)
    assert r.free_at(w0) is None  # holds nothing: it takes its next job at once
    r.assign(w0, job("2"), now=0.12)
    assert r.free_at(w0) == pytest.approx(0.12 + 0.100 - 0.015)  # 15% of a job ahead
    assert r.next_free_at("", 0.0) == pytest.approx(0.205) and r.next_free_at("other", 0.0) is None
    r.done(b"w0-1", done("2", "w0-1", seconds=0.200), now=0.33)
    assert w0.short_seconds == pytest.approx(0.7 * 0.100 + 0.3 * 0.200)  # smoothed
    r.assign(w0, job("3"), now=0.30)  # sent before the last ended: it starts when that one did
    assert r.free_at(w0) == pytest.approx(0.33 + 0.13 - 0.15 * 0.13)
    r.assign(w0, job("4"), now=0.31)
    assert r.next_free_at("", 0.0) == r.free_at(w0)  # both credits taken: a job may still go ahead of them
    r.assign(w0, job("5"), now=0.32)
    assert r.next_free_at("", 0.0) is None  # and one has
    r.done(b"w0-1", done("5", "w0-1", seconds=0.001), now=0.33)
    r.done(b"w0-1", done("3", "w0-1", seconds=0.001), now=0.34)
    assert r.free_at(w0) == pytest.approx(0.34 + w0.short_seconds - max(0.002, 0.15 * w0.short_seconds))


def test_a_worker_holding_bulk_work_has_no_time_to_wait_for() -> None:
    r = warmed()
    w0 = r.workers[b"w0-1"]
    r.assign(w0, job("1"), now=0.0)
    r.done(b"w0-1", done("1", "w0-1", seconds=0.05), now=0.05)
    r.assign(w0, job("b", size=100, bulk=True), now=0.06)
    assert r.free_at(w0) is None
    r.done(b"w0-1", done("b", "w0-1", seconds=2.0), now=2.1)
    assert w0.short_seconds == pytest.approx(0.05)  # a bulk job's time is not a small job's


def test_a_worker_about_to_finish_its_small_jobs_is_picked_for_one_job_beyond_its_credits() -> None:
    r = warmed()
    w1 = r.workers[b"w1-2"]  # one credit
    r.assign(w1, job("1"), now=0.0)
    r.done(b"w1-2", done("1", "w1-2", seconds=0.100), now=0.1)
    r.assign(w1, job("2"), now=0.1)
    assert r.pick_ahead(0.15) is None  # it should still be busy till 0.185
    assert r.pick_ahead(0.19) is w1 and r.pick_ahead(0.19, model="other") is None
    r.assign(w1, job("3"), now=0.19)  # beyond its credit
    assert r.pick_ahead(0.5) is None and r.next_free_at("", 0.0) is None  # one job ahead at most
    r.done(b"w1-2", done("2", "w1-2", seconds=0.1), now=0.2)
    r.assign(r.workers[b"w0-1"], job("b", bulk=True), now=0.2)
    r.assign(r.workers[b"w0-1"], job("c"), now=0.2)
    assert r.pick_ahead(0.3) is w1  # w0 holds bulk work: it is never ahead


def test_a_worker_late_on_its_small_job_gets_nothing_ahead_of_its_credit() -> None:
    """Past its time by more than half a job, it may be stopped or stuck: the next job waits
    for its credit, and the head does not wake for it."""
    r = warmed()
    w1 = r.workers[b"w1-2"]
    r.assign(w1, job("1"), now=0.0)
    r.done(b"w1-2", done("1", "w1-2", seconds=0.100), now=0.1)
    r.assign(w1, job("2"), now=0.1)  # should be free at 0.2: sent ahead from 0.185
    assert r.pick_ahead(0.24) is w1 and r.next_free_at("", 0.24) == pytest.approx(0.185)
    assert r.pick_ahead(0.26) is None and r.next_free_at("", 0.26) is None
