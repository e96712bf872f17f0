"""The scheduler on its own: admission, cutting, merging and turns, with a fake clock."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from bertserve.server.serving.policy.jobs import Busy, Job, TooLarge
from bertserve.server.serving.policy.scheduler import Scheduler
from bertserve.server.testing.config import server_config


def make(**options) -> Scheduler:
    defaults = {
        "max_batch_size": 8,
        "max_batch_tokens": 10_000,
        "max_latency_ms": 10.0,
        "max_request_size": 100,
        "max_client_queued_sentences": 100,
        "max_queued_sentences": 1000,
    }
    config = server_config("unused", **{**defaults, **options})
    return Scheduler(
        config.batching, config.limits, lambda texts, is_tokenized, chunk: np.asarray([len(t.split()) for t in texts])
    )


def texts(n: int, prefix: str = "t") -> list[str]:
    return [f"{prefix}{i} " + "w " * (i % 5) for i in range(n)]


def take(s: Scheduler, key: str, client: bytes, inputs: list, *, now: float, deadline: float = math.inf, **kw) -> None:
    """As the head takes a request: its room and its slowdown checked once (raising Busy or
    TooLarge), then queued."""
    s.check_room(client, len(inputs))
    slot = s.check_slowdown(client, len(inputs), now, deadline)
    s.queue(key, client, inputs, now=now, deadline=deadline, slot=slot, **kw)


def admit(s: Scheduler, client: bytes, n: int, now: float = 0.0, key: str | None = None) -> str:
    key = key or f"{client.hex()}#{now}#{n}#{len(s.clients)}#{s.queued}"
    take(s, key, client, texts(n, client.decode()), is_tokenized=False, show_tokens=False, now=now)
    return key


def drain(s: Scheduler, now: float = 100.0) -> list[Job]:
    jobs = []
    while (job := s.next_job(now)) is not None:
        jobs.append(job)
    return jobs


def test_a_small_request_waits_for_company_then_goes_at_its_deadline() -> None:
    s = make()
    admit(s, b"a", 2, now=0.0)
    assert s.next_job(0.005) is None
    assert s.wake_in(0.005) == pytest.approx(0.005)
    admit(s, b"b", 3, now=0.006)
    job = s.next_job(0.0101)
    assert job is not None and job.size == 5 and [p.client for p in job.pieces] == [b"a", b"b"]
    assert s.empty and s.queued == 0


def test_an_idle_worker_takes_a_lone_small_request_at_once() -> None:
    s = make()
    admit(s, b"a", 1, now=0.0)
    job = s.next_job(0.0, idle=True)
    assert job is not None and job.size == 1 and s.empty


def test_what_gathers_while_the_workers_are_busy_goes_as_one_job_to_the_next_idle_worker() -> None:
    s = make(max_batch_size=64)
    for i, client in enumerate((b"a", b"b", b"c", b"d")):
        admit(s, client, 1 + i, now=0.001 * i)  # no worker had a credit meanwhile
    job = s.next_job(0.0035, idle=True)  # well before max_latency_ms
    assert job is not None and job.size == 10 and [p.client for p in job.pieces] == [b"a", b"b", b"c", b"d"]
    assert s.empty


def test_small_requests_go_at_once_when_they_fill_a_job() -> None:
    s = make()
    for client in (b"a", b"b", b"c"):
        admit(s, client, 3, now=0.0)
    job = s.next_job(0.0)
    assert job is not None and job.size == 6  # 9 do not fit in 8: a share of 8 // 3 = 2 each
    assert s.queued == 3 and s.small_rows == 3


def test_one_client_alone_fills_whole_jobs_splitting_a_request_that_does_not_fit() -> None:
    s = make()
    for i in range(3):
        admit(s, b"a", 3, now=0.0, key=f"a{i}")
    job = s.next_job(0.0)
    assert job is not None and job.size == 8 and job.keys == ["a0", "a1", "a2"]
    assert job.pieces[2].rows.tolist() == [0, 1]
    rest = s.next_job(1.0)
    assert rest is not None and rest.keys == ["a2"] and rest.pieces[0].rows.tolist() == [2]
    assert rest.pieces[0].texts == texts(3, "a")[2:]


def test_a_light_client_shares_a_job_with_a_heavy_one_in_equal_parts() -> None:
    s = make(max_batch_size=64, max_client_queued_sentences=1000)
    for i in range(10):
        admit(s, b"heavy", 60, now=0.0, key=f"h{i}")
    first = s.next_job(0.0)
    assert first is not None and first.size == 64  # alone, it fills the job
    admit(s, b"light", 5, now=0.0, key="light")
    job = s.next_job(0.0)
    # light's whole demand, and at least a quarter of an equal split (64 // 8) from heavy
    assert job is not None and sorted((p.key, len(p.rows)) for p in job.pieces) == [("h1", 8), ("light", 5)]


def test_without_merging_each_request_is_its_own_job_and_goes_at_once() -> None:
    s = make(merge_requests=False)
    admit(s, b"a", 2)
    admit(s, b"b", 2)
    jobs = drain(s, now=0.0)
    assert [[p.client for p in j.pieces] for j in jobs] == [[b"a"], [b"b"]]


def test_bulk_requests_are_sorted_by_length_and_cut_by_rows_and_padded_tokens() -> None:
    s = make(max_batch_tokens=24)
    key = admit(s, b"a", 20)
    jobs = drain(s)
    rows = np.concatenate([p.rows for j in jobs for p in j.pieces])
    assert sorted(rows.tolist()) == list(range(20)) and all(j.keys == [key] for j in jobs)
    for job in jobs:
        lengths = [len(t.split()) for t in job.texts]
        assert lengths == sorted(lengths)
        assert job.size <= 8 and (job.size == 1 or job.size * max(lengths) <= 24)
    assert all(j.bulk for j in jobs)


def test_a_bulk_request_is_cut_at_its_first_turn_not_on_arrival() -> None:
    counted: list[int] = []

    def count_tokens(texts, is_tokenized, chunk):
        counted.append(len(texts))
        return np.asarray([len(t.split()) for t in texts])

    made = make()
    s = Scheduler(made.batching, made.limits, count_tokens)
    take(s, "bulk", b"a", texts(20), is_tokenized=False, show_tokens=False, now=0.0)
    take(s, "next", b"b", texts(20), is_tokenized=False, show_tokens=False, now=0.0)
    assert counted == [] and s.queued == 40 and s.bulk_count == 2
    first = s.next_job(0.0)
    assert first is not None and first.keys == ["bulk"] and counted == [20]
    s.remove({"bulk"})  # cut, partly dispatched: the rest leaves the queue
    assert s.queued == 20 and s.bulk_count == 1 and list(s.clients) == [b"b"]
    assert {key for job in drain(s) for key in job.keys} == {"next"} and counted == [20, 20]
    assert s.empty and s.queued == 0 and s.bulk_count == 0


def test_a_model_that_pads_nothing_has_its_bulk_requests_cut_in_order_uncounted() -> None:
    counted: list[int] = []

    def count_tokens(texts, is_tokenized, chunk):
        counted.append(len(texts))
        return np.asarray([len(t.split()) for t in texts])

    made = make(max_batch_tokens=4)  # a bound on padded tokens: nothing to bound where nothing pads
    s = Scheduler(made.batching, made.limits, count_tokens, pads=False)
    inputs = texts(20)
    take(s, "bulk", b"a", inputs, is_tokenized=False, show_tokens=False, now=0.0)
    jobs = drain(s)
    assert [job.size for job in jobs] == [8, 8, 4] and counted == []  # max_batch_size rows each, nothing tokenized
    assert [text for job in jobs for text in job.texts] == inputs  # in order: sorting saves no padding
    assert [row for job in jobs for row in job.pieces[0].rows.tolist()] == list(range(20))


def test_small_requests_are_merged_out_of_turn_for_an_overtaking_slot() -> None:
    s = make(max_client_queued_sentences=1000)
    admit(s, b"bulk", 40, key="bulk")
    admit(s, b"a", 2, key="a")
    admit(s, b"b", 3, key="b")
    job = s.next_small_job(8)  # the bulk client's turn is first, but it cannot overtake
    assert job is not None and job.keys == ["a", "b"] and not job.bulk and job.header(0.0)["bulk"] is False
    assert s.next_small_job(8) is None
    for client in (b"c", b"d", b"e"):
        admit(s, client, 3, key=client.decode())
    capped = s.next_small_job(4)  # at most one model run's rows: the bulk job keeps its worker
    assert capped is not None and capped.size == 3 and s.small_rows == 6  # one each: equal shares of a job of 4
    rest = s.next_job(0.0)  # the small requests left go first, in a turn of their own
    assert rest is not None and sorted(rest.keys) == ["c", "d", "e"] and not s.small_count
    first = s.next_job(0.0)
    assert first is not None and first.keys == ["bulk"] and first.header(0.0)["bulk"] is True


def test_a_clients_small_request_overtakes_its_own_queued_bulk_work() -> None:
    s = make(max_client_queued_sentences=1000)
    for i in range(5):
        admit(s, b"a", 40, key=f"bulk{i}")  # 25 bulk jobs of client a
    first = s.next_job(0.0)
    assert first is not None and first.keys == ["bulk0"]
    admit(s, b"a", 2, key="small")
    job = s.next_job(0.0)
    assert job is not None and job.keys == ["small"] and not job.bulk  # not after a's 24 other bulk jobs


def test_small_jobs_go_first_until_bulk_work_has_had_less_than_a_quarter_of_the_time() -> None:
    s = make(max_client_queued_sentences=1000, max_queued_sentences=100_000)
    admit(s, b"bulk", 80, key="bulk")  # ten jobs
    bulk_jobs, n = 0, 0
    for step in range(60):
        for client in (b"a", b"b", b"c"):  # more small work arrives than is taken
            admit(s, client, 5, now=float(step), key=f"{client.decode()}{n}")
            n += 1
        job = s.next_job(float(step))
        assert job is not None
        s.throughput.job_done(job.size, 1.0, bulk=job.bulk, now=float(step))  # each job takes a second
        bulk_jobs += job.bulk
        if bulk_jobs == 10:
            break
    assert bulk_jobs == 10 and 30 <= step <= 45  # one job in four or so while small work floods


def test_clients_take_turns_one_job_each() -> None:
    s = make()
    for _ in range(3):
        admit(s, b"a", 16)  # six bulk jobs of client a
    admit(s, b"b", 16)
    admit(s, b"c", 16)
    order = [j.pieces[0].client for j in drain(s)]
    assert order[:6] == [b"a", b"b", b"c", b"a", b"b", b"c"]
    assert order[6:] == [b"a"] * 4


def test_a_small_request_waits_behind_at_most_one_job_per_active_client() -> None:
    s = make(max_client_queued_sentences=1000)
    for _ in range(20):
        admit(s, b"flood", 16)
    first = s.next_job(0.0)
    assert first is not None and first.pieces[0].client == b"flood"
    admit(s, b"small", 1, now=0.0)
    order = [j.pieces[0].client for j in drain(s, now=0.0)]
    assert order.index(b"small") <= 1


def test_merged_jobs_take_small_requests_of_every_client_in_turn_order() -> None:
    s = make()
    for i in range(6):
        admit(s, b"a", 2, now=0.0, key=f"a{i}")
    admit(s, b"b", 2, now=0.0, key="b0")
    job = s.next_job(1.0)
    assert job is not None and job.keys == ["a0", "b0"]  # b is not starved by a's backlog


def test_a_short_request_goes_whole_in_the_next_job_however_many_clients_wait() -> None:
    s = make(max_batch_size=256, max_client_queued_sentences=1000, max_queued_sentences=100_000)  # jobs of 64 rows
    for i in range(20):
        admit(s, f"m{i}".encode(), 40, now=0.0, key=f"medium{i}")
    admit(s, b"tiny", 4, now=0.0, key="tiny")  # last in the turns, and an equal share is 3 rows
    job = s.next_job(1.0)
    assert job is not None and job.size == 64
    assert [len(piece.rows) for piece in job.pieces if piece.key == "tiny"] == [4]  # whole: answered by this job
    assert all(len(piece.rows) <= 3 for piece in job.pieces if piece.key != "tiny")  # the others share the rest


def busy_small_lane() -> Scheduler:
    """Merged jobs of 16 rows while others wait: runs of 64 rows, 40 sentences/s, 250 ms."""
    s = make(max_batch_size=256, max_request_size=200, max_client_queued_sentences=200, bulk_run_ms=250.0)
    s.batching = replace(s.batching, model_batch_size=64)
    s.throughput.per_worker, s.throughput.workers = 40.0, 2
    return s


def test_a_short_request_goes_whole_into_a_shrunk_job_beside_longer_ones() -> None:
    s = busy_small_lane()
    admit(s, b"m1", 100, now=0.0, key="m1")
    admit(s, b"m2", 100, now=0.0, key="m2")
    admit(s, b"s1", 8, now=0.0, key="s1")  # an equal share would be 5 rows: 8 is short, so whole
    job = s.next_job(0.0, idle=True)
    assert job is not None and job.size == 16
    assert [len(piece.rows) for piece in job.pieces if piece.key == "s1"] == [8]
    assert {piece.key for piece in job.pieces} == {"s1", "m1", "m2"}


def test_short_requests_leave_the_client_whose_turn_it_is_its_share() -> None:
    s = busy_small_lane()
    admit(s, b"m1", 100, now=0.0, key="m1")  # first in the turns
    for i in range(5):
        admit(s, f"s{i}".encode(), 4, now=0.0, key=f"s{i}")  # 20 rows of short requests: more than a job
    job = s.next_job(0.0, idle=True)
    assert job is not None and job.size <= 16
    assert sum(len(piece.rows) for piece in job.pieces if piece.key == "m1") >= 2  # an equal share of 16 in 6
    assert all(len(piece.rows) == 4 for piece in job.pieces if piece.key.startswith("s"))
    assert sum(1 for piece in job.pieces if piece.key.startswith("s")) == 3  # the others are not split
    served = [piece.key for job in drain(s, now=1.0) for piece in job.pieces]
    assert "m1" in served and {"s3", "s4"} <= set(served[:4])  # the next job answers the other two


def test_a_clients_short_request_goes_before_its_own_longer_small_ones() -> None:
    s = make(max_batch_size=256, max_request_size=200, max_client_queued_sentences=1000)  # runs of 64: short is 8
    for i in range(3):
        admit(s, b"a", 100, now=0.0, key=f"a-long{i}")
    admit(s, b"a", 8, now=0.1, key="a-short")  # behind 300 of a's small sentences in arrival order
    admit(s, b"a", 2, now=0.2, key="a-shorter")
    job = s.next_job(0.2, idle=True)
    assert job is not None and job.keys[:2] == ["a-short", "a-shorter"]  # the next job answers both
    assert s.clients[b"a"].shorts == 0
    admit(s, b"a", 3, now=0.3, key="a-late")  # short again: before the rest of a-long0
    rows = [(piece.key, len(piece.rows)) for job in drain(s, now=1.0) for piece in job.pieces]
    assert rows[0] == ("a-late", 3) and rows[1][0] == "a-long0"
    assert job.size == 64 and sum(n for key, n in rows if key.startswith("a-long")) == 300 - 54  # each row once
    assert s.empty


def test_a_removed_short_request_leaves_the_others_in_their_order() -> None:
    s = make(max_batch_size=256, max_request_size=200, max_client_queued_sentences=1000)
    admit(s, b"a", 50, now=0.0, key="long")
    admit(s, b"a", 4, now=0.1, key="s1")
    admit(s, b"a", 4, now=0.2, key="s2")
    s.remove({"s1"})
    assert [piece.key for piece in s.clients[b"a"].small] == ["s2", "long"] and s.clients[b"a"].shorts == 1
    assert s.wake_in(0.0) == pytest.approx(0.010)  # the longest-waiting piece is not at the head: "long" is
    admit(s, b"a", 5, now=0.3, key="s3")
    assert [piece.key for piece in s.clients[b"a"].small] == ["s2", "s3", "long"]


def test_inputs_of_different_kinds_never_share_a_job() -> None:
    s = make()
    take(s, "k1", b"a", ["plain text"], is_tokenized=False, show_tokens=False, now=0)
    take(s, "k2", b"b", [["pre", "tokenized"]], is_tokenized=True, show_tokens=False, now=0)
    jobs = drain(s)
    assert [j.keys for j in jobs] == [["k1"], ["k2"]]


def test_a_late_models_tasks_read_alike_share_a_job_and_its_other_readings_do_not() -> None:
    s = make()
    for key, task in (("dense", "embed"), ("terms", "sparse"), ("tokens", "multivector")):
        take(s, key, key.encode(), [f"a text for {key}"], is_tokenized=False, show_tokens=False, now=0, task=task)
    take(s, "query", b"q", ["a query"], is_tokenized=False, show_tokens=False, now=0, task="multivector", reads="query")
    take(s, "pairs", b"p", ["q ||| d"], is_tokenized=False, show_tokens=False, now=0, task="rerank", reads="pairs")
    jobs = drain(s)
    assert [j.keys for j in jobs] == [["dense", "terms", "tokens"], ["query"], ["pairs"]]
    header = jobs[0].header(0.0)
    assert [part.get("task", "embed") for part in header["parts"]] == ["embed", "sparse", "multivector"]
    assert "reads" not in header and jobs[1].header(0.0)["reads"] == "query" and jobs[2].header(0.0)["reads"] == "pairs"


def test_admission_refuses_whole_requests_over_the_bounds() -> None:
    s = make(max_client_queued_sentences=30, max_queued_sentences=50, max_request_size=30)
    admit(s, b"a", 20)
    with pytest.raises(Busy, match="this client already has 20 inputs queued"):
        admit(s, b"a", 11)
    admit(s, b"b", 29)
    with pytest.raises(Busy, match="49 inputs are queued"):
        admit(s, b"c", 2)
    assert s.queued == 49 and s.busy_rejections == 2
    with pytest.raises(TooLarge):
        admit(s, b"d", 31)
    drain(s)
    admit(s, b"a", 30)  # room again once dispatched


def test_a_retried_job_goes_first_split_into_one_job_per_request() -> None:
    s = make()
    admit(s, b"a", 2, key="ka")
    admit(s, b"b", 2, key="kb")
    merged = s.next_job(1.0)
    assert merged is not None and merged.keys == ["ka", "kb"]
    admit(s, b"c", 16, key="kc")
    merged.failures = 1
    s.retry(merged)
    assert s.queued == 20
    retried = [s.next_job(1.0), s.next_job(1.0)]
    assert [j.keys for j in retried if j] == [["ka"], ["kb"]] and all(j and j.failures == 1 for j in retried)
    assert s.next_job(1.0).keys == ["kc"]  # type: ignore[union-attr]


def test_remove_forgets_queued_work_of_failed_requests() -> None:
    s = make()
    admit(s, b"a", 20, key="bulk")
    admit(s, b"a", 2, key="small")
    admit(s, b"b", 2, key="other")
    s.remove({"bulk", "small"})
    assert s.queued == 2 and list(s.clients) == [b"b"]
    assert [j.keys for j in drain(s)] == [["other"]]
    assert s.empty and s.small_count == 0 and s.bulk_count == 0


def test_drain_keys_empties_everything() -> None:
    s = make()
    admit(s, b"a", 20, key="bulk")
    admit(s, b"b", 1, key="small")
    assert s.drain_keys() == {"bulk", "small"}
    assert s.empty and s.queued == 0 and s.next_job(9.0) is None


@pytest.mark.parametrize("seed", range(20))
def test_every_admitted_row_runs_exactly_once_whatever_the_order_of_events(seed: int) -> None:
    rng = np.random.default_rng(seed)
    s = make(
        max_batch_size=int(rng.integers(1, 10)),
        max_client_queued_sentences=300,
        max_queued_sentences=900,
        max_request_size=300,
        merge_requests=bool(rng.integers(0, 2)),
    )
    admitted: dict[str, int] = {}
    ran: dict[str, list[int]] = {}
    held: list[Job] = []
    failed: set[str] = set()
    now = 0.0
    for step in range(300):
        now += float(rng.uniform(0, 0.01))
        action = rng.integers(0, 5)
        if action == 0:
            client = bytes([97 + int(rng.integers(0, 5))])
            n = int(rng.integers(1, 30))
            key = f"{client.decode()}#{step}"
            try:
                take(s, key, client, texts(n), is_tokenized=bool(rng.integers(0, 2)), show_tokens=False, now=now)
                admitted[key] = n
            except Busy:
                pass
        elif action == 1 and (job := s.next_job(now, idle=bool(rng.integers(0, 2)))) is not None:
            held.append(job)
        elif action == 2 and held:  # a worker finished a job
            for piece in held.pop(int(rng.integers(0, len(held)))).pieces:
                ran.setdefault(piece.key, []).extend(piece.rows.tolist())
        elif action == 3 and held:  # a worker died holding a job
            s.retry(held.pop(int(rng.integers(0, len(held)))))
        elif action == 4 and admitted:  # a request failed (timed out): its queued work goes
            key = list(admitted)[int(rng.integers(0, len(admitted)))]
            s.remove({key})
            del admitted[key]
            failed.add(key)
        assert s.queued == sum(q.sentences for q in s.clients.values()) + sum(j.size for j in s.retries)
        assert s.small_rows >= 0 and s.small_count >= 0 and s.bulk_count >= 0
    held.extend(drain(s, now + 1))
    for job in held:
        for piece in job.pieces:
            ran.setdefault(piece.key, []).extend(piece.rows.tolist())
    ran = {key: rows for key, rows in ran.items() if key not in failed}  # in flight when it failed: ignored
    assert {key: sorted(rows) for key, rows in ran.items()} == {key: list(range(n)) for key, n in admitted.items()}
    assert s.empty and s.queued == 0 and s.small_rows == 0 and s.small_count == 0 and s.bulk_count == 0


def test_requests_pinned_to_different_model_versions_never_share_a_job() -> None:
    s = make(merge_requests=True)
    for client, version in ((b"a", 1), (b"b", 2), (b"c", 1)):
        take(
            s,
            client.decode(),
            client,
            texts(2, client.decode()),
            is_tokenized=False,
            show_tokens=False,
            now=0.0,
            version=version,
        )
    assert s.versions() == {1, 2}
    jobs = drain(s)
    assert sorted((job.version, sorted(job.keys)) for job in jobs) == [(1, ["a", "c"]), (2, ["b"])]
    assert s.versions() == set()
    s.put_back(jobs[0])  # taken but not sent: first next time, and counted as queued again
    assert s.queued == jobs[0].size and s.versions() == {jobs[0].version} and s.next_job(0.0) is jobs[0]


# -- deadlines, truncation side and bulk admission -------------------------------------------


def measured(s: Scheduler, per_second: float) -> Scheduler:
    """``s`` with workers measured at ``per_second`` sentences/s of bulk work, all told."""
    s.throughput.per_worker, s.throughput.workers = per_second, 1
    return s


def bulk_options(**options) -> dict:
    return {"max_batch_size": 8, "max_client_queued_sentences": 1000, "max_request_size": 1000, **options}


def test_a_bulk_request_that_would_take_past_its_slowdown_is_refused_at_once() -> None:
    s = measured(make(**bulk_options(bulk_slowdown=4.0)), 10.0)  # 40 sentences: 4 s on an idle server
    for client in (b"a", b"b", b"c", b"d"):
        admit(s, client, 40)  # the fourth shares the turns with three: 16 s, at its bound
    with pytest.raises(Busy, match=r"would make a bulk request taken before it late"):
        admit(s, b"e", 40)  # the turns are shared evenly: each of the four would take 20 s
    admit(s, b"a", 40)  # behind its own first: 8 s on an idle server, 20 s here, within 32
    admit(s, b"e", 4)  # small requests are not bounded by it: they overtake
    assert s.busy_rejections == 1
    relaxed = measured(make(**bulk_options(bulk_slowdown=0)), 10.0)
    for client in (b"a", b"b", b"c", b"d", b"e", b"f"):
        admit(relaxed, client, 40)
    held = measured(make(**bulk_options(bulk_slowdown=4.0)), 10.0)
    held.throughput.held = 40  # jobs the workers hold run first: 4 s of them
    admit(held, b"a", 40)  # 8 s, within 16
    admit(held, b"b", 40)  # 12 s
    admit(held, b"c", 40)  # 16 s: at the bound
    with pytest.raises(Busy, match=r"late"):
        admit(held, b"d", 40)  # fits on an idle head, not behind what the workers hold
    unmeasured = make(**bulk_options(bulk_slowdown=4.0))  # nothing is known of the workers' speed yet
    for client in (b"a", b"b", b"c", b"d", b"e", b"f"):
        admit(unmeasured, client, 40)


def test_bulk_admission_learns_from_bulk_requests_that_came_later_than_projected() -> None:
    s = measured(make(**bulk_options(bulk_slowdown=4.0)), 10.0)  # 40 sentences: 4 s on an idle server
    admit(s, b"a", 40, now=0.0, key="first")  # projected 4 s
    drain(s, now=0.0)
    s.throughput.finished("first", 12.0)  # it took three times that: the lag rises to 2
    assert s.throughput.lag == pytest.approx(2.0)
    admit(s, b"a", 40, now=20.0)  # 8 s at the rate halved, within 16
    admit(s, b"b", 40, now=20.0)  # sharing the turns: 16 s, at the bound
    with pytest.raises(Busy, match=r"about 5 inputs/s left for it"):
        admit(s, b"c", 40, now=20.0)  # 24 s: refused, where four were admitted before the lag was known
    small = make(**bulk_options(bulk_slowdown=4.0))
    take(small, "tiny", b"a", texts(4), is_tokenized=False, show_tokens=False, now=0.0)
    assert not small.throughput._expected  # only bulk requests are projected


def test_a_bulk_request_that_would_make_an_earlier_one_late_is_refused() -> None:
    s = measured(make(**bulk_options(bulk_slowdown=2.0)), 10.0)
    admit(s, b"a", 100, key="a")  # due at 20 s; shares the turns with b: done at 20 s
    admit(s, b"b", 100, key="b")
    with pytest.raises(Busy, match=r"would make a bulk request taken before it late"):
        admit(s, b"c", 100)
    admit(s, b"a", 100)  # behind its own: 20 s on an idle server, 30 s here, within 40
    s.remove({"b"})
    admit(s, b"c", 100)  # room again


def test_a_bulk_request_that_cannot_finish_before_its_deadline_is_refused_at_once() -> None:
    s = measured(make(**bulk_options()), 10.0)
    with pytest.raises(Busy, match=r"could not finish before its deadline"):
        take(s, "k", b"a", texts(40), is_tokenized=False, show_tokens=False, now=0.0, deadline=2.0)
    take(s, "k", b"a", texts(40), is_tokenized=False, show_tokens=False, now=0.0, deadline=5.0)  # 4 s


def test_bulk_requests_are_planned_with_the_time_small_work_leaves_them() -> None:
    s = measured(make(**bulk_options(bulk_slowdown=4.0, max_queued_sentences=100_000)), 10.0)
    for second in range(10):
        s.throughput.job_done(4, 0.5, bulk=False, now=second + 0.5)  # small jobs take half the workers' time
        s.throughput.job_done(5, 0.5, bulk=True, now=second + 0.5)
    assert s.throughput.bulk_rate(9.5) == pytest.approx(5.0)
    admit(s, b"a", 10, now=9.5)  # 1 s idle, 2 s at half the speed: within 4
    admit(s, b"b", 10, now=9.5)  # sharing the turns with it: 4 s, at the bound
    with pytest.raises(Busy):
        admit(s, b"c", 10, now=9.5)  # three sharing: 6 s
    lone = measured(make(**bulk_options(bulk_slowdown=1.5, max_queued_sentences=100_000)), 10.0)
    lone.throughput = s.throughput
    with pytest.raises(Busy, match=r"more than --bulk-slowdown 1.5 times the 4.0 s it takes an idle server"):
        admit(lone, b"d", 40, now=9.5)  # alone it would take 8 s at half the speed


def test_jobs_carry_the_truncation_side_and_the_time_left_and_never_mix_sides() -> None:
    s = make()
    take(s, "l", b"a", texts(2), is_tokenized=False, show_tokens=False, now=0.0, deadline=5.0, truncation="left")
    take(s, "r", b"b", texts(2), is_tokenized=False, show_tokens=False, now=0.0, deadline=9.0)
    first, second = s.next_job(1.0, idle=True), s.next_job(1.0, idle=True)
    assert first is not None and second is not None
    assert first.keys == ["l"] and second.keys == ["r"]
    assert first.header(1.0)["truncation_direction"] == "left" and first.header(1.0)["expires_in_s"] == 4.0
    assert "truncation_direction" not in second.header(1.0)
    no_deadline = replace(second.pieces[0], deadline=float("inf"))
    assert "expires_in_s" not in Job("x", [no_deadline], False).header(0.0)


def test_a_merged_job_drops_only_the_pieces_past_their_deadline() -> None:
    s = make()
    take(s, "old", b"a", texts(3), is_tokenized=False, show_tokens=False, now=0.0, deadline=1.0)
    take(s, "new", b"b", texts(2), is_tokenized=False, show_tokens=False, now=0.0, deadline=3.0)
    job = s.next_job(2.0, idle=True)
    assert job is not None and job.keys == ["old", "new"] and job.deadline == 3.0
    assert job.drop_expired(2.0) == 3 and job.keys == ["new"] and job.size == 2
    assert job.drop_expired(3.0) == 2 and not job.pieces


def test_while_others_wait_a_merged_job_holds_what_runs_in_about_bulk_run_ms() -> None:
    # batch_size 64; a worker does 40 sentences a second, so 250 ms is 10 rows: at least a quarter run, 16
    s = make(max_batch_size=256, max_request_size=200, max_client_queued_sentences=200, bulk_run_ms=250.0)
    s.batching = replace(s.batching, model_batch_size=64)
    admit(s, b"m1", 100, now=0.0)
    alone = s.next_job(0.0, idle=True)  # nothing else waits: a whole model run
    assert alone is not None and alone.size == 64
    admit(s, b"m2", 100, now=0.0)
    unmeasured = s.next_job(0.0, idle=True)  # the speed is not known yet: a whole run too
    assert unmeasured is not None and unmeasured.size == 64
    s.throughput.per_worker, s.throughput.workers = 40.0, 2  # m1 has 4 rows left and m2 68
    sizes = [job.size for job in drain(s)]
    assert sizes == [4 + 4, 64], sizes  # shares of 16 rows while both wait, then m2 alone: a run
    admit(s, b"m1", 100, now=1.0)
    admit(s, b"m2", 100, now=1.0)
    sizes = [job.size for job in drain(s)]
    assert sizes[:12] == [16] * 12 and sum(sizes) == 200, sizes
    s.throughput.per_worker = 1000.0  # a fast worker: 250 ms is more than a run, so a run it is
    admit(s, b"m1", 100, now=2.0)
    admit(s, b"m2", 100, now=2.0)
    assert (job := s.next_job(2.0, idle=True)) is not None and job.size == 64


def test_a_few_sentences_wait_for_a_short_job_not_a_whole_run_of_larger_requests() -> None:
    s = make(max_batch_size=256, max_request_size=200, max_client_queued_sentences=200, bulk_run_ms=250.0)
    s.batching = replace(s.batching, model_batch_size=64)
    s.throughput.per_worker, s.throughput.workers = 40.0, 2
    for client in (b"m1", b"m2", b"m3"):
        admit(s, client, 100, now=0.0)
    assert (running := s.next_job(0.0, idle=True)) is not None and 12 <= running.size <= 16
    admit(s, b"tiny", 3, now=0.01)
    job = s.next_job(0.01, idle=True)
    assert job is not None and job.pieces[0].client == b"tiny" and len(job.pieces[0].rows) == 3
    assert job.size <= 16


def test_a_busy_workers_next_job_waits_until_that_worker_is_about_to_be_free() -> None:
    """Not max_latency_ms: it could not start sooner, and what comes meanwhile rides along."""
    s = make(max_batch_size=64)
    admit(s, b"a", 1, now=0.0)
    assert s.next_job(0.02, free_at=0.05) is None  # past max_latency_ms, but the worker is busy till then
    admit(s, b"b", 2, now=0.03)
    job = s.next_job(0.05, free_at=0.05)
    assert job is not None and job.size == 3
    admit(s, b"c", 1, now=0.06)
    assert s.next_job(0.061, idle=True, free_at=1.0) is not None  # an idle worker takes it at once


def test_a_busy_workers_next_job_goes_early_once_a_model_run_has_gathered_or_bulk_waits() -> None:
    s = make()  # a model run: 8 rows
    for i in range(8):
        admit(s, bytes([97 + i]), 1, now=0.0)
    job = s.next_job(0.001, free_at=1.0)
    assert job is not None and job.size == 8  # a full model run: nothing more to wait for
    admit(s, b"a", 1, now=0.002)
    admit(s, b"z", 8, now=0.002)  # bulk work is queued
    first = s.next_job(0.003, free_at=1.0)
    assert first is not None
