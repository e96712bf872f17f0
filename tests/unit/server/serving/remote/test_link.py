"""The head's worker link in this process: the test plays a remote host over real tcp on
loopback (and a client and the sink over ipc) against a real ventilator."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import zmq
from bertserve.client import protocol as p
from bertserve.server.config.model import ModelConfig
from bertserve.server.config.workers import Workers
from bertserve.server.serving.protocol import link as link_schema, link_bodies as bodies, wire
from bertserve.server.serving.remote.config import HostConfig
from bertserve.server.testing.config import server_config
from bertserve.server.testing.launcher import free_port
from rigs import Rig, ventilator_rig

pytestmark = pytest.mark.timeout(30)

SHA = "ab" * 32


@dataclass
class Head(Rig):
    """A rig whose ventilator takes remote workers on ``worker_port``."""

    worker_port: int = 0

    def host(self, name: bytes = b"h-1") -> zmq.Socket:
        dealer = self.context.socket(zmq.DEALER)
        dealer.identity = name
        dealer.linger = 0
        dealer.connect(f"tcp://127.0.0.1:{self.worker_port}")
        self.sockets.append(dealer)
        return dealer

    def hello(self, dealer: zmq.Socket, **changes: object) -> list[bytes]:
        hello = {"link": wire.LINK_VERSION, "version": "0", "hostname": "far", "model_sha256": SHA, "workers": 1}
        dealer.send_multipart([wire.HELLO, p.dumps({**hello, **changes})])
        return self.answer(dealer)

    def answer(self, dealer: zmq.Socket, skip: tuple[bytes, ...] = (wire.HEARTBEAT,)) -> list[bytes]:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            self.pump(1)
            while dealer.poll(0):
                frames = dealer.recv_multipart()
                if frames[0] not in skip:
                    return frames
        raise AssertionError("the head did not answer")

    def join(self, dealer: zmq.Socket, worker: bytes = b"w0-7", credits: int = 1) -> None:
        assert self.hello(dealer)[0] == wire.WELCOME
        ready = {"worker": 0, "pid": 7, "credits": credits, "device": "gpu"}
        dealer.send_multipart([wire.READY, worker, p.dumps(ready)])
        for _ in range(100):
            self.pump(1)
            if any(w.name == worker for w in self.ventilator.registry.workers.values()):
                return
        raise AssertionError("the remote worker never registered")


@pytest.fixture
def head(tmp_path) -> Iterator[Head]:
    worker_port = free_port()
    model = ModelConfig.of(model_dir="/head/model", max_seq_len=40, pooling_layer=(-1, -2), dtype="bf16")
    config = server_config(model=model, num_worker=0, worker_port=worker_port, max_batch_size=4, max_latency_ms=0)
    with ventilator_rig(tmp_path, config, Head, model_sha256=SHA) as rig:
        rig.worker_port = worker_port
        yield rig


def test_welcome_carries_the_heads_model_options_and_the_host_keeps_its_own_files(head: Head) -> None:
    kind, raw = head.hello(head.host())
    assert kind == wire.WELCOME
    host = HostConfig(
        server="head", worker_port=1, model_dir="/here/model", graph_dir="/here/cache", workers=Workers(num_worker=3)
    )
    welcome = link_schema.from_head([wire.WELCOME, raw])
    assert isinstance(welcome, bodies.Welcome)
    config = host.server_config(welcome)
    assert config.model == head.ventilator.config.model.replace(model_dir="/here/model", graph_dir="/here/cache")
    assert config.serving.num_worker == 3 and config.model.dtype == "bf16" and config.model.pooling_layer == (-1, -2)


def test_other_model_files_or_another_link_version_are_refused_with_the_reason(head: Head) -> None:
    kind, raw = head.hello(head.host(b"h-a"), model_sha256="cd" * 32)
    assert kind == wire.REFUSED and "model files" in p.loads(raw)["error"]
    kind, raw = head.hello(head.host(b"h-b"), link=wire.LINK_VERSION + 1)
    assert kind == wire.REFUSED and "link version" in p.loads(raw)["error"]
    assert not head.ventilator.link.hosts  # type: ignore[union-attr]


def test_a_host_the_head_does_not_know_is_told_to_join_again(head: Head) -> None:
    dealer = head.host()
    dealer.send_multipart([wire.HEARTBEAT])
    assert head.answer(dealer) == [wire.BYE]


def test_a_stranger_is_read_for_nothing_but_a_small_hello(head: Head, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[object] = []
    original = link_schema.from_host
    monkeypatch.setattr(link_schema, "from_host", lambda *args, **kw: parsed.append(args) or original(*args, **kw))
    dealer = head.host()
    dealer.send_multipart([wire.RESULT, b"w0-7", b"1", b'{"parts":' + b" " * (1 << 20) + b"[]}", b""])
    assert head.answer(dealer) == [wire.BYE] and parsed == []  # answered unread
    hello = {"link": wire.LINK_VERSION, "model_sha256": SHA, "hostname": "x" * 200, "pad": "y" * 5000}
    dealer.send_multipart([wire.HELLO, p.dumps(hello)])
    head.pump()
    assert not head.ventilator.link.hosts  # type: ignore[union-attr]
    kind, _ = head.hello(dealer, hostname="small")
    assert kind == wire.WELCOME


def test_a_remote_workers_model_description_is_allow_listed_and_leaves_with_it(head: Head) -> None:
    dealer = head.host()
    assert head.hello(dealer)[0] == wire.WELCOME
    ready = {"worker": 0, "pid": 7, "credits": 1}
    dealer.send_multipart([wire.READY, b"w0-1", p.dumps({**ready, "model": {"output_dim": 3, "protocol": 99}})])
    dealer.send_multipart([wire.READY, b"w0-2", p.dumps({**ready, "model": {"output_dim": 5}})])
    for _ in range(100):
        head.pump(1)
        if head.ventilator.registry.workers:
            break
    assert [w.name for w in head.ventilator.registry.workers.values()] == [b"w0-2"]
    config = head.ventilator.describe()
    assert config["output_dim"] == 5 and config["protocol"] == p.PROTOCOL_VERSION
    dealer.send_multipart([wire.BYE])
    head.pump()
    assert head.ventilator.describe().get("output_dim") is None  # it left with its worker


def test_jobs_go_to_the_remote_worker_and_its_result_to_the_sink(head: Head) -> None:
    dealer = head.host()
    head.join(dealer)
    (worker,) = head.ventilator.registry.workers.values()
    assert worker.host == b"h-1" and worker.device == "gpu" and worker.hostname == "far"
    head.request(b"c1", 1, ["one", "two"])
    kind, name, job_id, header, payload = head.answer(dealer)
    assert (kind, name, p.loads(payload)) == (wire.JOB, b"w0-7", ["one", "two"])
    head.sink_messages()  # the registration
    result_header = p.dumps({**result_of(header), "extra": "dropped"})
    dealer.send_multipart([wire.RESULT, b"w0-7", job_id, result_header, b"\0" * 16])
    dealer.send_multipart([wire.DONE, p.dumps({"job": job_id.decode(), "worker": "w0-7"})])
    (result,) = head.sink_messages()
    assert result == [wire.RESULT, job_id, p.dumps(result_of(header)), b"\0" * 16]
    assert head.ventilator.idle and worker.jobs_done == 1


def result_of(job_header: bytes, dim: int = 2) -> dict:
    """The header of a float32 result of ``dim`` values a row for the job of ``job_header``."""
    parts = p.loads(job_header)["parts"]
    rows = sum(len(part["rows"]) for part in parts)
    return {"parts": parts, "dtype": "float32", "shape": [rows, dim], "truncated": [False] * rows}


def test_a_result_header_past_what_its_job_needs_breaks_its_worker_unread(head: Head) -> None:
    dealer = head.host()
    head.join(dealer)
    head.request(b"c1", 1, ["one"])
    _, _, job_id, header, _ = head.answer(dealer)
    head.sink_messages()
    swollen = p.dumps({**result_of(header), "pad": "x" * (64 << 10)})
    dealer.send_multipart([wire.RESULT, b"w0-7", job_id, swollen, b"\0" * 8])
    assert head.answer(dealer)[:2] == [wire.FORGET, b"w0-7"]
    assert not head.ventilator.registry.workers and head.sink_messages() == []


def test_a_late_result_of_a_job_that_went_elsewhere_is_dropped(head: Head) -> None:
    dealer = head.host()
    head.join(dealer)
    head.request(b"c1", 1, ["one"])
    _, _, job_id, header, _ = head.answer(dealer)
    head.sink_messages()
    dealer.send_multipart([wire.GONE, b"w0-7", b"it died"])  # its job goes back to the queue
    head.pump()
    assert not head.ventilator.registry.workers and len(head.ventilator.scheduler.retries) == 1
    dealer.send_multipart([wire.RESULT, b"w0-7", job_id, header, b"late"])
    assert head.sink_messages() == []


def test_a_draining_host_gets_nothing_new_and_what_it_hands_back_runs_elsewhere(head: Head) -> None:
    leaving, staying = head.host(b"h-1"), head.host(b"h-2")
    head.join(leaving, b"w0-1")
    head.request(b"c1", 1, ["one"])
    _, _, job_id, _, _ = head.answer(leaving)
    leaving.send_multipart([wire.DRAIN])
    head.join(staying, b"w0-2")
    head.request(b"c2", 1, ["two"])
    assert p.loads(head.answer(staying)[4]) == ["two"]  # not to the draining host, though it had room
    staying.send_multipart([wire.DONE, p.dumps({"job": "x", "worker": "w0-2"})])  # a stray DONE: ignored
    leaving.send_multipart([wire.BYE])
    head.pump()
    assert [w.name for w in head.ventilator.registry.workers.values()] == [b"w0-2"]
    (job,) = head.ventilator.scheduler.retries
    assert job.job_id == job_id.decode() and job.failures == 0  # handed back: not held against it


def test_a_silent_host_is_forgotten_and_its_jobs_count_an_attempt(head: Head) -> None:
    dealer = head.host()
    head.join(dealer)
    head.request(b"c1", 1, ["one"])
    head.answer(dealer)
    head.ventilator.link.tick(time.monotonic() + 60)  # type: ignore[union-attr]
    assert not head.ventilator.registry.workers and not head.ventilator.link.hosts  # type: ignore[union-attr]
    (job,) = head.ventilator.scheduler.retries
    assert job.failures == 1


def test_a_malformed_ready_is_dropped_and_credits_past_the_cap_are_clamped(
    head: Head, caplog: pytest.LogCaptureFixture
) -> None:
    dealer = head.host()
    assert head.hello(dealer, workers=2)[0] == wire.WELCOME
    dealer.send_multipart([wire.READY, b"w0-7", b'{"worker":0,"pid":7,"credits":1e999}'])
    head.pump()
    assert not head.ventilator.registry.workers and "credits" in caplog.text
    head.join(dealer, b"w0-7", credits=1_000_000)
    (worker,) = head.ventilator.registry.workers.values()
    assert worker.credits == 8 and "asked for 1000000 credits" in caplog.text
    assert "Traceback" not in caplog.text


def test_a_host_registers_no_more_workers_than_its_hello_named(head: Head) -> None:
    dealer = head.host()
    head.join(dealer, b"w0-1")  # HELLO named 1 worker
    dealer.send_multipart([wire.READY, b"w0-2", p.dumps({"worker": 1, "pid": 8, "credits": 1})])
    dealer.send_multipart([wire.READY, b"w0-1", p.dumps({"worker": 0, "pid": 7, "credits": 1})])  # itself again: fine
    head.pump()
    assert [w.name for w in head.ventilator.registry.workers.values()] == [b"w0-1"]


def held_job(head: Head, dealer: zmq.Socket) -> tuple[bytes, bytes]:
    head.request(b"c1", 1, ["one", "two"])
    kind, _, job_id, header, _ = head.answer(dealer)
    assert kind == wire.JOB
    head.sink_messages()  # the registration
    return job_id, header


@pytest.mark.parametrize(
    "bad",
    [
        lambda job_id, header: [
            wire.RESULT,
            b"w0-7",
            job_id,
            p.dumps({**result_of(header), "parts": [{"key": "someone-else#1@0", "rows": [0, 1]}]}),
            b"\0" * 16,
        ],
        lambda job_id, header: [
            wire.RESULT,
            b"w0-7",
            job_id,
            p.dumps({**result_of(header), "shape": [1, 2], "parts": [{**p.loads(header)["parts"][0], "rows": [0]}]}),
            b"\0" * 8,
        ],
        lambda job_id, header: [wire.RESULT, b"w0-7", job_id, p.dumps(result_of(header)), b"\0" * 15],
        lambda job_id, header: [wire.DONE, p.dumps({"job": job_id.decode(), "worker": "w0-7"})],
    ],
    ids=["other-requests", "other-rows", "short-buffer", "done-before-result"],
)
def test_a_worker_that_answers_its_job_wrongly_is_replaced_and_the_job_runs_again(head: Head, bad) -> None:
    dealer = head.host()
    head.join(dealer)
    job_id, header = held_job(head, dealer)
    dealer.send_multipart(bad(job_id, header))
    kind, name, reason = head.answer(dealer)
    assert (kind, name) == (wire.FORGET, b"w0-7") and reason
    assert head.sink_messages() == [] and not head.ventilator.registry.workers
    (job,) = head.ventilator.scheduler.retries
    assert job.job_id == job_id.decode() and job.failures == 1


def test_a_job_error_fails_the_jobs_own_requests_with_a_known_kind(head: Head) -> None:
    dealer = head.host()
    head.join(dealer)
    job_id, header = held_job(head, dealer)
    error = {"parts": [{"key": "someone-else#1@0", "rows": [0]}], "error": "boom " * 1000, "kind": "evil\nlabel"}
    dealer.send_multipart([wire.JOB_ERROR, b"w0-7", job_id, p.dumps(error)])
    dealer.send_multipart([wire.DONE, p.dumps({"job": job_id.decode(), "worker": "w0-7"})])
    (message,) = head.sink_messages()
    sent = p.loads(message[2])
    assert message[:2] == [wire.JOB_ERROR, job_id] and sent["parts"] == p.loads(header)["parts"]
    assert sent["kind"] == "worker" and len(sent["error"]) <= 503
    assert head.ventilator.registry.workers  # an error is an answer: the worker stays


def test_welcome_carries_the_task_and_leaves_the_calibration_file_to_the_host() -> None:
    from bertserve.server.config.model import ModelConfig
    from bertserve.server.serving.head.handshake import welcome_options

    model = ModelConfig.of(model_dir="/head/model", task="rerank", calibration="/head/ranges.json")
    options = welcome_options(server_config(model=model))
    assert options["model"]["task"] == "rerank" and "calibration" not in options["model"]
    welcome = bodies.Welcome(**options)
    host = HostConfig(server="head", worker_port=1, model_dir="/here/model", graph_dir="/here/cache")
    config = host.server_config(welcome)
    assert (config.model.task, config.model.calibration) == ("rerank", None)
    with pytest.raises(ValueError):
        bodies.WelcomeModel(task="translate")
