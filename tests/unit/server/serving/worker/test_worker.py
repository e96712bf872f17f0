"""The worker loop in this process, with the numpy model and real ZeroMQ sockets."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import zmq
from bertserve.client import protocol as p
from bertserve.server.config.model import ModelConfig
from bertserve.server.model.interface import HashingModel, Model
from bertserve.server.serving.protocol import wire
from bertserve.server.serving.protocol.wire import Addresses
from bertserve.server.serving.worker.worker import Worker
from bertserve.server.testing.config import server_config

pytestmark = pytest.mark.timeout(30)


class BrokenModel(HashingModel):
    def run(self, batch):  # type: ignore[no-untyped-def]
        raise RuntimeError("the model fell over")


class SlowModel(HashingModel):
    """Each model run takes 0.3 s, so a test can send a job while another runs."""

    def run(self, batch):  # type: ignore[no-untyped-def]
        time.sleep(0.3)
        return super().run(batch)


class TimedModel(HashingModel):
    """Each model run takes 1 ms per token slot, and its rows are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[int] = []

    def run(self, batch):  # type: ignore[no-untyped-def]
        self.runs.append(len(batch.lengths))
        time.sleep(0.001 * self.token_slots(batch))
        return super().run(batch)


@dataclass
class Rig:
    jobs: zmq.Socket  # the ventilator's ROUTER
    credits: zmq.Socket  # the ventilator's PULL
    sink: zmq.Socket  # the sink's PULL
    worker: Worker
    identity: bytes

    def send_job(self, job_id: bytes, texts: list[str], parts: list[dict], bulk: bool = False) -> None:
        header = {"parts": parts, "is_tokenized": False, "show_tokens": False, "bulk": bulk}
        self.jobs.send_multipart([self.identity, wire.JOB, job_id, p.dumps(header), p.dumps(texts)])

    def credit(self, kinds: tuple[bytes, ...] = (wire.DONE,)) -> list[bytes]:
        while True:
            assert self.credits.poll(5000), "no credit came back"
            frames = self.credits.recv_multipart()
            if frames[0] in kinds:
                return frames


def rig(tmp_path, model: Model, **options) -> Iterator[Rig]:
    context = zmq.Context()
    addresses = Addresses(f"ipc://{tmp_path}/jobs", f"ipc://{tmp_path}/credits", f"ipc://{tmp_path}/sink")
    jobs, credits, sink = context.socket(zmq.ROUTER), context.socket(zmq.PULL), context.socket(zmq.PULL)
    for socket, address in ((jobs, addresses.jobs), (credits, addresses.credits), (sink, addresses.sink)):
        socket.linger = 0
        socket.bind(address)
    config = server_config("unused", **options)
    worker = Worker(config, 3, addresses, model)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    assert jobs.poll(5000)
    identity, kind, raw = jobs.recv_multipart()
    assert kind == wire.READY and identity == worker.identity
    ready = p.loads(raw)
    assert ready["worker"] == 3 and ready["model"]["output_dim"] == 16
    try:
        yield Rig(jobs, credits, sink, worker, identity)
    finally:
        jobs.send_multipart([identity, wire.STOP])
        thread.join(5)
        worker.close()
        for socket in (jobs, credits, sink):
            socket.close()
        context.term()


@pytest.fixture
def hashing(tmp_path) -> Iterator[Rig]:
    yield from rig(tmp_path, HashingModel())


@pytest.fixture
def broken(tmp_path) -> Iterator[Rig]:
    yield from rig(tmp_path, BrokenModel())


@pytest.fixture
def slow(tmp_path) -> Iterator[Rig]:
    yield from rig(tmp_path, SlowModel())


@pytest.fixture
def timed(tmp_path) -> Iterator[Rig]:
    yield from rig(tmp_path, TimedModel(), bulk_run_ms=150.0)


def results(rig: Rig, count: int) -> dict[bytes, np.ndarray]:
    """The next ``count`` results the sink gets, by job id, in the order they came."""
    found = {}
    for _ in range(count):
        assert rig.sink.poll(5000)
        kind, job_id, raw, buffer = rig.sink.recv_multipart()
        assert kind == wire.RESULT
        found[job_id] = p.array_from_buffer(p.loads(raw), buffer)
    return found


def test_a_small_job_runs_between_two_model_runs_of_a_bulk_job(slow: Rig) -> None:
    bulk = [f"bulk sentence {i}" for i in range(150)]  # three runs of at most 64 rows
    slow.send_job(b"bulk", bulk, [{"key": "b#1", "rows": list(range(150))}], bulk=True)
    time.sleep(0.1)  # the first run has started
    slow.send_job(b"small", ["just one"], [{"key": "s#1", "rows": [0]}])
    order, vectors = [], {}
    for _ in range(2):
        assert slow.sink.poll(5000)
        kind, job_id, raw, buffer = slow.sink.recv_multipart()
        assert kind == wire.RESULT
        order.append(job_id)
        vectors[job_id] = p.array_from_buffer(p.loads(raw), buffer)
    assert order == [b"small", b"bulk"]  # it did not wait for the whole bulk job
    model = HashingModel()
    np.testing.assert_allclose(vectors[b"bulk"], model.run(model.tokenize(bulk)), rtol=1e-6)
    np.testing.assert_allclose(vectors[b"small"], model.run(model.tokenize(["just one"])), rtol=1e-6)
    done = [p.loads(slow.credit()[1]) for _ in range(2)]
    assert [d["job"] for d in done] == ["small", "bulk"] and done[1]["tokens"] > 0


def test_a_large_merged_job_lets_a_short_job_through_between_its_model_runs(slow: Rig) -> None:
    merged = [f"merged sentence {i}" for i in range(150)]  # not bulk, but three model runs
    slow.send_job(
        b"merged", merged, [{"key": "m#1", "rows": list(range(100))}, {"key": "n#1", "rows": list(range(100, 150))}]
    )
    time.sleep(0.1)
    slow.send_job(b"short", ["just one"], [{"key": "s#1", "rows": [0]}])
    assert list(results(slow, 2)) == [b"short", b"merged"]


def test_while_short_jobs_are_about_a_long_jobs_runs_are_cut_to_the_time_asked(timed: Rig) -> None:
    model = timed.worker.model
    assert isinstance(model, TimedModel)
    bulk = [f"bulk sentence number {i}" for i in range(128)]  # 6 tokens each: two runs of 64 rows, 384 ms each
    timed.send_job(b"alone", bulk, [{"key": "a#1", "rows": list(range(128))}], bulk=True)
    assert list(results(timed, 1)) == [b"alone"]
    assert model.runs == [128]  # no short job has come: its two runs in one call, side by side in the model
    model.runs.clear()
    timed.send_job(b"short", ["just one"], [{"key": "s#1", "rows": [0]}])
    results(timed, 1)
    timed.send_job(b"bulk", bulk, [{"key": "b#1", "rows": list(range(128))}], bulk=True)
    found = results(timed, 1)
    cut = model.runs[1:]
    assert sum(cut) == 128 and 16 < max(cut) <= 26 and len(cut) >= 6  # about 150 ms: 25 or so rows of 6 slots
    np.testing.assert_allclose(found[b"bulk"], HashingModel().run(HashingModel().tokenize(bulk)), rtol=1e-6)


class HalvingModel(TimedModel):
    """Plans any batch of six rows or more as two runs, as the Encoder does on the CPU."""

    def plan(self, batch):  # type: ignore[no-untyped-def]
        half = len(batch.lengths) // 2
        return [np.arange(half), np.arange(half, len(batch.lengths))] if half >= 3 else super().plan(batch)


@pytest.fixture
def halving(tmp_path) -> Iterator[Rig]:
    yield from rig(tmp_path, HalvingModel(), bulk_run_ms=150.0)


def test_a_job_of_one_model_runs_rows_runs_whole_though_short_jobs_are_about(halving: Rig) -> None:
    """A merged job of a few clients' sentences is one call of the model (its two halves side by
    side there), not two runs with other jobs let in between: it is a short job itself."""
    model = halving.worker.model
    assert isinstance(model, HalvingModel)
    halving.send_job(b"short", ["just one"], [{"key": "s#1", "rows": [0]}])
    results(halving, 1)
    merged = [f"client {i} sentence" for i in range(16)]
    halving.send_job(b"merged", merged, [{"key": f"c{i}#1", "rows": [i]} for i in range(16)])
    found = results(halving, 1)
    assert model.runs == [1, 16]
    np.testing.assert_allclose(found[b"merged"], HashingModel().run(HashingModel().tokenize(merged)), rtol=1e-6)


def test_a_job_goes_to_the_sink_and_its_credit_back(hashing: Rig) -> None:
    texts = ["first do it", "then do it right", "x"]
    parts = [{"key": "a#1", "rows": [1, 0]}, {"key": "b#1", "rows": [0]}]
    hashing.send_job(b"42", texts, parts)
    assert hashing.sink.poll(5000)
    kind, job_id, raw, buffer = hashing.sink.recv_multipart()
    header = p.loads(raw)
    assert (kind, job_id, header["parts"]) == (wire.RESULT, b"42", parts)
    vectors = p.array_from_buffer(header, buffer)
    model = HashingModel()
    np.testing.assert_allclose(vectors, model.run(model.tokenize(texts)), rtol=1e-6)
    done = p.loads(hashing.credit()[1])
    assert done["job"] == "42" and done["worker"] == hashing.identity.decode() and done["tokens"] > 0


def test_a_result_says_of_each_row_whether_its_input_was_cut(hashing: Rig) -> None:
    long = " ".join(f"w{i}" for i in range(600))  # past any length the model takes
    texts = [f"a query ||| {long}", "a query ||| a short document", long, "short"]
    parts = [{"key": "r#1", "rows": [1, 0]}, {"key": "e#1", "rows": [1, 0]}]
    hashing.send_job(b"43", texts, parts)
    assert hashing.sink.poll(5000)
    kind, _, raw, _ = hashing.sink.recv_multipart()
    assert kind == wire.RESULT and p.loads(raw)["truncated"] == [True, False, True, False]
    assert p.loads(raw)["truncated"] == HashingModel().tokenize(texts).truncated.tolist()


def test_the_worker_sends_heartbeats_from_its_own_thread(hashing: Rig) -> None:
    kind, identity = hashing.credit((wire.HEARTBEAT,))
    assert (kind, identity) == (wire.HEARTBEAT, hashing.identity)


def test_a_malformed_message_is_dropped_and_the_worker_carries_on(hashing: Rig) -> None:
    hashing.jobs.send_multipart([hashing.identity, b"NONSENSE", b"x"])
    hashing.jobs.send_multipart([hashing.identity, wire.JOB, b"1", b"{not json", b"[]"])
    hashing.send_job(b"2", ["still here"], [{"key": "k#1", "rows": [0]}])
    seen = []
    for _ in range(2):
        assert hashing.sink.poll(5000)
        seen.append(hashing.sink.recv_multipart()[:2])
    assert [wire.JOB_ERROR, b"1"] in seen and [wire.RESULT, b"2"] in seen


def test_a_model_failure_becomes_an_error_for_the_job_and_the_credit_returns(broken: Rig) -> None:
    broken.send_job(b"7", ["anything"], [{"key": "k#1", "rows": [0]}])
    assert broken.sink.poll(5000)
    kind, _job_id, raw = broken.sink.recv_multipart()
    info = p.loads(raw)
    assert kind == wire.JOB_ERROR and "the model fell over" in info["error"] and info["kind"] == "worker"
    assert p.loads(broken.credit()[1])["job"] == "7"


def test_the_heap_is_trimmed_when_a_bulk_burst_ends_and_not_after_small_jobs(hashing: Rig, monkeypatch) -> None:
    from bertserve.server.serving.worker import worker as worker_module

    trims: list[float] = []
    monkeypatch.setattr(worker_module, "trim_heap", lambda: trims.append(time.monotonic()) or True)
    hashing.send_job(b"small", ["one"], [{"key": "s#1", "rows": [0]}])
    hashing.credit()
    assert trims == []
    hashing.send_job(
        b"bulk", [f"sentence {i}" for i in range(100)], [{"key": "b#1", "rows": list(range(100))}], bulk=True
    )
    hashing.credit()
    deadline = time.monotonic() + 5
    while not trims and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(trims) == 1


def test_trim_heap_returns_free_memory_where_the_c_library_can() -> None:
    import platform

    from bertserve.server.memory import trim_heap

    assert trim_heap() is (platform.libc_ver()[0] == "glibc")  # elsewhere a no-op that says so


def test_the_hashing_model_cuts_either_end_and_refuses_what_it_cannot_do() -> None:
    """A request's truncation_direction reaches a model class as the Model protocol says:
    the numpy model keeps the last words when asked to cut on the left, and refuses an
    option it does not take by name, as any model class should (not with a TypeError)."""
    model = HashingModel(ModelConfig.of(model_dir="", max_seq_len=5))
    words = ["one", "two", "three", "four", "five", "six"]
    right = model.tokenize([" ".join(words)], keep_tokens=True)
    left = model.tokenize([" ".join(words)], keep_tokens=True, truncation_direction="left")
    assert right.tokens == [["[CLS]", "one", "two", "three", "[SEP]"]]
    assert left.tokens == [["[CLS]", "four", "five", "six", "[SEP]"]]
    assert right.truncated.tolist() == left.truncated.tolist() == [True]
    assert not np.array_equal(model.run(right), model.run(left))
    with pytest.raises(ValueError, match="long_inputs=chunk is not available"):
        model.tokenize(["a"], chunk=True)
    with pytest.raises(ValueError, match="truncation_direction must be"):
        model.tokenize(["a"], truncation_direction="middle")


@pytest.mark.parametrize("adapter", [1, 0, -1, "1", True, 10**30, None])
def test_an_adapter_the_model_does_not_have_fails_only_its_job(hashing: Rig, adapter: object) -> None:
    """A job header naming a LoRA adapter (a peer's, or a head's mistake) for a model that has
    none, or none of that number: that job's requests get an error, the credit returns, and the
    next job runs."""
    header = {"parts": [{"key": "k#1", "rows": [0]}], "is_tokenized": False, "show_tokens": False, "adapter": adapter}
    hashing.jobs.send_multipart([hashing.identity, wire.JOB, b"8", p.dumps(header), p.dumps(["some text"])])
    assert hashing.sink.poll(5000)
    kind, job_id, raw = hashing.sink.recv_multipart()[:3]
    assert (kind, job_id) == (wire.JOB_ERROR, b"8") and "adapter" in p.loads(raw)["error"]
    assert p.loads(hashing.credit()[1])["job"] == "8"
    hashing.send_job(b"9", ["still here"], [{"key": "k#2", "rows": [0]}])
    assert hashing.sink.poll(5000) and hashing.sink.recv_multipart()[:2] == [wire.RESULT, b"9"]
