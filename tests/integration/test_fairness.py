"""Fairness, end to end: one client's flood of bulk requests does not make another client's
request wait for the flood. Clients take turns, one mini-job each, so a small request
waits about one job, not the whole queue.

The assertions are about order, not about timing thresholds: the other client's request is
answered while the flood still has queued jobs. The times are compared loosely and shown.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer
from faulty_model import sentences, wait_for

FLOOD_REQUESTS = 30
FLOOD_SIZE = 256  # 16 jobs of --max-batch-size 16 each


def _flood(client: BertClient, seed: int) -> list[list[str]]:
    batches = [sentences(FLOOD_SIZE, seed=seed + i) for i in range(FLOOD_REQUESTS)]
    for batch in batches:
        client.encode(batch, blocking=False)
    return batches


@pytest.mark.timeout(180)
def test_a_small_request_is_answered_while_a_flood_is_still_queued(tiny_server: RunningServer) -> None:
    kwargs = {**tiny_server.client_kwargs, "timeout": 120_000}
    texts = ["a small request from a second client", "and its second sentence"]
    with BertClient(**kwargs) as flooder, BertClient(**kwargs) as other:
        idle = []
        for _ in range(5):
            started = time.perf_counter()
            alone = other.encode(texts)
            idle.append(time.perf_counter() - started)
        flood_started = time.perf_counter()
        batches = _flood(flooder, seed=0)
        wait_for(lambda: other.server_status["queued_bulk_requests"] > 0, 10, "the flood being queued")
        waits, queued_after = [], []
        for _ in range(3):
            started = time.perf_counter()
            during = other.encode(texts)
            waits.append(time.perf_counter() - started)
            queued_after.append(other.server_status["queued_bulk_requests"])
            np.testing.assert_allclose(during, alone, atol=1e-5)
        flooded = flooder.fetch_all()
        flood_seconds = time.perf_counter() - flood_started
    assert [len(v) for v in flooded] == [len(b) for b in batches]
    report = (
        f"idle {statistics.median(idle) * 1000:.0f} ms, during the flood {[round(w * 1000) for w in waits]} ms, "
        f"flood {flood_seconds:.2f} s for {FLOOD_REQUESTS * FLOOD_SIZE} sentences; bulk jobs still queued after "
        f"each small request: {queued_after}"
    )
    assert all(queued > 0 for queued in queued_after), report  # answered before the flood was
    assert max(waits) < flood_seconds / 4, report


@pytest.mark.timeout(180)
def test_a_second_bulk_client_takes_turns_with_the_first(tiny_server: RunningServer) -> None:
    kwargs = {**tiny_server.client_kwargs, "timeout": 120_000}
    with BertClient(**kwargs) as first, BertClient(**kwargs) as second:
        _flood(first, seed=100)
        wait_for(lambda: second.server_status["queued_bulk_requests"] > 0, 10, "the flood being queued")
        started = time.perf_counter()
        mine = sentences(FLOOD_SIZE, seed=999)
        got = second.encode(mine)  # 16 jobs, each taking a turn with the flood's
        waited = time.perf_counter() - started
        status = second.server_status
        first.fetch_all()
        np.testing.assert_allclose(got, second.encode(mine), atol=1e-5)  # the same, without a flood
    assert status["queued_bulk_requests"] > 0, f"the flood was over before a request queued behind it ({waited:.2f} s)"
