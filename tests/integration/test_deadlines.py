"""Deadlines: work whose caller has given up is never run.

The server serves :class:`faulty_model.RecordingModel` (50 ms a model run, no TensorFlow),
which writes down when each model run started and which texts it held, so what ran after a
deadline is read from outside the server. The workers' sentence counters must agree.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from bertserve.client import BertClient, ServerError, ServerTimeoutError, protocol as p
from bertserve.server.testing.launcher import RunningServer, start_server
from faulty_model import RECORD_FILE_ENV, pythonpath_env, sentences, word_id

RECORDING = "faulty_model:RecordingModel"
ROWS = 64  # the server's --max-batch-size: a request of ROWS is one job, and one model run
BULK_RUNS = 20 * int(os.environ.get("DEADLINE_BULK_SECONDS", "10"))  # seconds of bulk work at 50 ms a run
# A run may start this long after the client's clock said the deadline passed: the worker's
# check and the run's start are two steps, and a loaded 2-core machine can pause a process
# between them (the server's deadline also counts from arrival, a little after the send).
LATE_S = 0.5


def _worker_sentences(status: dict) -> tuple[int, int]:
    """The inputs the workers ran, and those they held but skipped past their deadline."""
    workers = status["workers"]
    return sum(w["sentences"] for w in workers), sum(w.get("skipped_sentences", 0) for w in workers)


def _runs(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


@pytest.fixture
def recording_server(tiny_google: str, tmp_path: Path) -> tuple[RunningServer, Path]:
    record = tmp_path / "runs.jsonl"
    server = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        RECORDING,
        "--max-batch-size",
        str(ROWS),
        "--bulk-slowdown",
        "0",
        env=pythonpath_env(**{RECORD_FILE_ENV: str(record)}),
    )
    yield server, record
    server.stop()


def test_requests_past_their_deadline_never_reach_the_model(recording_server: tuple[RunningServer, Path]) -> None:
    """200 requests of 1 s timeout, queued behind 10 s of bulk work (``DEADLINE_BULK_SECONDS``
    sets it): none of their texts runs after its deadline, and the workers' counters hold the
    bulk and the ones that ran only."""
    server, record = recording_server
    bulk = sentences(ROWS * BULK_RUNS, seed=1)
    bulk_timeout_ms = max(120_000, 6 * 50 * BULK_RUNS)  # six times what it takes on an idle server
    with BertClient(port=server.port, port_out=server.port_out, timeout=bulk_timeout_ms) as owner:
        owner.encode(bulk, blocking=False)
        while not record.exists():  # the bulk work is running
            time.sleep(0.02)
        outcomes: dict[str, str] = {}
        deadlines: dict[int, float] = {}  # marker word id -> the client's deadline
        lock = threading.Lock()

        def caller(index: int) -> None:
            with BertClient(port=server.port, port_out=server.port_out, timeout=1000) as client:
                sent: dict[int, str] = {}
                for k in range(10):
                    marker = f"deadline{index}x{k}"
                    texts = [f"{marker} {text}" for text in sentences(ROWS, seed=1000 + 10 * index + k)]
                    with lock:
                        deadlines[word_id(marker)] = time.monotonic() + 1.0
                    sent[client.encode(texts, blocking=False)] = marker
                while True:
                    try:
                        for result in client.fetch():
                            with lock:
                                outcomes[sent[result.id]] = "ok"
                        return
                    except ServerTimeoutError:
                        return  # the rest were given up: they are past their deadline
                    except ServerError as exc:
                        assert exc.kind == p.EXPIRED, exc
                        with lock:
                            outcomes[sent[exc.request_id]] = "expired"

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        answered = sum(1 for outcome in outcomes.values() if outcome == "ok")
        assert answered < 100, "the bulk work did not hold the short requests back: nothing was tested"
        results = list(owner.fetch())  # the bulk request completes
        assert results[0].embedding.shape == (len(bulk), 16)
        status = owner.server_status
    ran, skipped = _worker_sentences(status)
    runs = _runs(record)
    started = {first for run in runs for first in run["firsts"] if first in deadlines}  # short requests run
    print(
        f"answered {answered} of 200, {len(started)} ran; the workers ran {ran} inputs, dropped "
        f"{status['expired_sentences_dropped']} and skipped {skipped}; {len(runs)} model runs"
    )
    assert ran == len(bulk) + ROWS * len(started), "the workers' counters disagree with the runs recorded"
    assert answered <= len(started)
    assert status["expired_sentences_dropped"] + skipped == ROWS * (200 - len(started))
    assert status["requests_expired"] >= 200 - len(started) - 20  # a client's own timeout may come first
    late = [
        (first, run["started"] - deadlines[first])
        for run in runs
        for first in set(run["firsts"])
        if first in deadlines and run["started"] > deadlines[first] + LATE_S
    ]
    assert not late, f"model runs started after their requests' deadline: {late[:5]}"
