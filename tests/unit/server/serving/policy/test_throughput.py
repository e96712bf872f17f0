"""The workers' measured speed, the small traffic's share, and the projection of bulk finish times."""

from __future__ import annotations

import pytest
from bertserve.server.serving.policy.throughput import LAG_LIMITS, QueuedBulk, Throughput, bulk_seconds, late_bulk


def test_capacity_is_measured_on_bulk_jobs_only_and_smoothed() -> None:
    t = Throughput(workers=2)
    assert t.capacity() is None and t.bulk_rate(0.0) is None  # nothing measured yet
    t.job_done(4, 1.0, bulk=False, now=0.0)  # small jobs run below the model's best speed: not counted
    assert t.capacity() is None
    t.job_done(100, 1.0, bulk=True, now=0.0)
    assert t.capacity() == 200.0
    t.job_done(50, 1.0, bulk=True, now=0.0)  # one slow job moves it a fifth of the way
    assert t.capacity() == pytest.approx(2 * (0.8 * 100 + 0.2 * 50))
    t.job_done(0, 0.0, bulk=True, now=0.0)  # a job skipped past its deadline says nothing of the speed
    assert t.capacity() == pytest.approx(180.0)
    t.workers = 0
    assert t.capacity() is None


def test_small_works_share_of_the_time_is_counted_over_ten_seconds_and_bulk_keeps_a_quarter() -> None:
    t = Throughput(per_worker=100.0, workers=1)
    assert t.small_share(0.0) == 0.0 and not t.bulk_due(0.0) and t.bulk_rate(0.0) == 100.0
    for second in range(10):
        t.job_done(3, 0.4, bulk=False, now=second + 0.5)  # small jobs: 40% of the busy time
        t.job_done(60, 0.6, bulk=True, now=second + 0.5)  # at the speed measured: 100/s
    assert t.small_share(9.9) == pytest.approx(0.4) and t.bulk_rate(9.9) == pytest.approx(60.0)
    assert not t.bulk_due(9.9)
    for _ in range(30):
        t.job_done(3, 0.5, bulk=False, now=10.0)  # a burst of small work
    assert t.bulk_due(10.5) and t.bulk_rate(10.5) == pytest.approx(25.0)  # bulk goes next; it keeps a quarter
    assert t.small_share(30.0) == 0.0 and t.bulk_rate(30.0) == 100.0  # it went quiet
    assert len(t._busy) <= 10


def test_the_new_request_and_only_those_it_delays_are_checked() -> None:
    lanes = {b"a": [QueuedBulk(b"a", 10, due=3.0)], b"b": [QueuedBulk(b"b", 50, due=100.0)]}
    small = QueuedBulk(b"c", 10, due=100.0)
    # a: 10 of its own + 10 of b's + 10 of c's = 30 at 10/s: 3 s, on time
    assert late_bulk(lanes, small, extra=0, rate=10.0, now=0.0) is None
    assert late_bulk(lanes, small, extra=1, rate=10.0, now=0.0) is lanes[b"a"][0]  # a retried job runs first
    tight = QueuedBulk(b"c", 10, due=2.0)
    assert late_bulk(lanes, tight, extra=0, rate=10.0, now=0.0) is tight
    behind_a = QueuedBulk(b"a", 40, due=100.0)  # a's own next request: a's first is not delayed by it
    assert late_bulk(lanes, behind_a, extra=0, rate=10.0, now=0.0) is None
    lanes[b"a"][0] = QueuedBulk(b"a", 10, due=1.0)  # already late, whatever comes
    big = QueuedBulk(b"d", 60, due=100.0)
    assert late_bulk(lanes, big, extra=0, rate=10.0, now=0.0) is lanes[b"a"][0]  # it would be later still
    assert late_bulk({b"a": lanes[b"a"]}, behind_a, extra=0, rate=10.0, now=0.0) is None  # it is not delayed


def test_a_bulk_requests_finish_is_projected_as_late_bulk_counts_it() -> None:
    lanes = {b"a": [QueuedBulk(b"a", 10, due=9.0), QueuedBulk(b"a", 30, due=9.0)], b"b": [QueuedBulk(b"b", 5, due=9.0)]}
    # c's 20 run beside 20 of a's 40 and all 5 of b's: 45 sentences, plus 5 of a retry, at 10/s
    assert bulk_seconds(lanes, QueuedBulk(b"c", 20, due=9.0), extra=5, rate=10.0) == pytest.approx(5.0)
    # a's own: behind its 40, beside b's 5
    assert bulk_seconds(lanes, QueuedBulk(b"a", 20, due=9.0), extra=0, rate=10.0) == pytest.approx(6.5)


def test_bulk_work_is_planned_at_the_rate_divided_by_how_late_bulk_requests_came() -> None:
    t = Throughput(per_worker=100.0, workers=1)
    t.expect("early", 10.0, now=0.0)
    t.finished("early", now=5.0)  # twice as fast as projected: the lag falls slowly
    assert 0.9 < t.lag < 1.0 and t.bulk_rate(0.0) == pytest.approx(100.0 / t.lag)
    t.lag = 1.0
    t.expect("late", 10.0, now=0.0)
    t.finished("late", now=20.0)  # twice the projection: the lag rises half the way at once
    assert t.lag == pytest.approx(1.5) and t.bulk_rate(0.0) == pytest.approx(100.0 / 1.5)
    t.expect("next", 15.0, now=30.0)  # projected at the rate divided by 1.5: 10 s as if the lag were 1
    t.finished("next", now=45.0)  # done when planned: the lag stays
    assert t.lag == pytest.approx(1.5)
    t.finished("never expected", now=50.0)  # a small request, or one already counted: nothing learnt
    t.finished("next", now=50.0)
    assert t.lag == pytest.approx(1.5)
    for i in range(20):  # a request that never ends on time cannot stop bulk work: the lag is bounded
        t.expect(f"hopeless{i}", 1.0, now=0.0)
        t.finished(f"hopeless{i}", now=1000.0)
    assert t.lag == pytest.approx(LAG_LIMITS[1], rel=1e-3)


def test_projections_of_requests_that_end_otherwise_are_forgotten_oldest_first() -> None:
    t = Throughput(per_worker=100.0, workers=1)
    for i in range(5000):  # cancelled or failed: never finished
        t.expect(f"gone{i}", 1.0, now=0.0)
    assert len(t._expected) <= 1024
    t.expect("kept", 1.0, now=0.0)
    t.finished("gone0", now=100.0)  # forgotten: nothing learnt from it
    assert t.lag == 1.0
    t.finished("kept", now=3.0)
    assert t.lag == pytest.approx(2.0)


def test_status_shows_what_bulk_admission_plans_with() -> None:
    t = Throughput()
    assert t.describe(0.0) == {
        "capacity_sentences_per_s": None,
        "small_share": 0.0,
        "small_load": 0.0,
        "bulk_lag": 1.0,
        "bulk_sentences_per_s": None,
    }
    t.per_worker, t.workers, t.lag = 50.0, 2, 2.0
    for second in range(10):
        t.job_done(4, 1.0, bulk=False, now=second + 0.5)  # half of the two workers' time
        t.job_done(50, 1.0, bulk=True, now=second + 0.5)
    assert t.describe(9.9) == {
        "capacity_sentences_per_s": 100.0,
        "small_share": 0.5,
        "small_load": 0.5,
        "bulk_lag": 2.0,
        "bulk_sentences_per_s": 25.0,
    }


def test_bulk_work_is_planned_with_the_time_small_work_leaves_idle_time_included() -> None:
    t = Throughput(per_worker=100.0, workers=1)
    for second in range(10):
        t.job_done(3, 0.4, bulk=False, now=second + 0.5)  # small jobs only, 40% of the worker's time
    assert t.small_share(9.9) == 1.0 and t.bulk_due(9.9)  # bulk work that waits goes next
    assert t.small_load(9.9) == pytest.approx(0.4) and t.bulk_rate(9.9) == pytest.approx(60.0)  # the 60% left
    for second in range(10, 20):
        t.job_done(3, 0.95, bulk=False, now=second + 0.5)  # nearly all of it: bulk keeps its least share
    assert t.bulk_rate(19.9) == pytest.approx(25.0)
    t.workers = 0
    assert t.small_load(19.9) == 0.0
