"""The sink in this process, over real ZeroMQ sockets: reassembly, duplicates, errors, subscriptions."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import zmq
from bertserve.client import protocol as p
from bertserve.server.serving.protocol import sink as messages, wire
from bertserve.server.serving.sink.pending import Pending
from bertserve.server.serving.sink.sink import Sink
from bertserve.server.testing.config import server_config
from bertserve.server.testing.launcher import free_port

pytestmark = pytest.mark.timeout(30)


@dataclass
class Harness:
    sink: Sink
    push: zmq.Socket
    context: zmq.Context
    port_out: int

    def send(self, *frames: bytes) -> None:
        self.push.send_multipart(list(frames))

    def register(self, key: str, client: bytes, request_id: int, count: int, **extra: object) -> None:
        now = time.monotonic()
        info = {"key": key, "client": client.hex(), "request_id": request_id, "count": count, "show_tokens": False}
        self.send(wire.REGISTER, p.dumps({"admitted": now, "deadline": now + 60, **info, **extra}))

    def result(
        self,
        parts: list[tuple[str, list[int]]],
        vectors: np.ndarray,
        lengths: list[int] | None = None,
        truncated: list[bool] | None = None,
    ) -> None:
        header = {"parts": [{"key": k, "rows": r} for k, r in parts], **p.array_header(vectors), "tokens": None}
        header["truncated"] = truncated if truncated is not None else [False] * len(vectors)
        if lengths is not None:
            header["lengths"] = lengths
        self.send(wire.RESULT, b"job", p.dumps(header), np.ascontiguousarray(vectors).tobytes())

    def subscriber(self, topic: bytes) -> zmq.Socket:
        sub = self.context.socket(zmq.SUB)
        sub.linger = 0
        sub.setsockopt(zmq.SUBSCRIBE, topic)
        sub.connect(f"tcp://127.0.0.1:{self.port_out}")
        return sub


@pytest.fixture
def harness(tmp_path) -> Iterator[Harness]:
    port_out = free_port()
    config = server_config("unused", port=free_port(), port_out=port_out, request_timeout_ms=60_000)
    context = zmq.Context()
    address = f"ipc://{tmp_path}/sink"
    sink = Sink(config, address, context)
    thread = threading.Thread(target=sink.run, daemon=True)
    thread.start()
    push = context.socket(zmq.PUSH)
    push.linger = 0
    push.connect(address)
    harness = Harness(sink, push, context, port_out)
    try:
        yield harness
    finally:
        harness.send(wire.STOP)
        thread.join(5)
        push.close()
        sink.close()
        context.destroy(linger=0)


def receive(sub: zmq.Socket, timeout_ms: int = 3000) -> p.Reply | None:
    if not sub.poll(timeout_ms):
        return None
    return p.decode_reply(sub.recv_multipart())


def subscribed(harness: Harness, client: bytes) -> zmq.Socket:
    """A subscriber that the sink has certainly seen: it answers a STATUS published to it."""
    sub = harness.subscriber(client)
    for _ in range(50):
        harness.send(p.STATUS, b"native", client, b"0", p.dumps({}))
        if receive(sub, 100) is not None:
            return sub
    raise AssertionError("the sink never applied the subscription")


def test_a_request_is_published_once_whole_in_row_order(harness: Harness) -> None:
    client = "café".encode() + b"\x00\xff"
    sub = subscribed(harness, client)
    key = p.request_key(client, 7)
    harness.register(key, client, 7, 4)
    vectors = np.arange(16, dtype=np.float32).reshape(4, 4)
    harness.result([(key, [3, 1])], vectors[[3, 1]])
    harness.result([(key, [0, 2])], vectors[[0, 2]])
    reply = receive(sub)
    assert reply is not None and reply.ok and reply.client_id == client and reply.request_id == 7
    np.testing.assert_array_equal(reply.array(), vectors)
    assert receive(sub, 200) is None


def test_the_reply_counts_each_rows_tokens_once(harness: Harness) -> None:
    sub = subscribed(harness, b"t")
    first, second = p.request_key(b"t", 1), p.request_key(b"t", 2)
    harness.register(first, b"t", 1, 3)
    harness.register(second, b"t", 2, 1)
    vectors = np.ones((3, 2), np.float32)
    harness.result([(first, [2, 0]), (second, [0])], vectors, lengths=[5, 7, 11])  # a merged job
    harness.result([(first, [2])], vectors[:1], lengths=[5])  # row 2 again, from a retry
    harness.result([(first, [1])], vectors[:1], lengths=[3])
    replies = {reply.request_id: reply for reply in (receive(sub), receive(sub))}
    assert replies[2].header["token_count"] == 11
    assert replies[1].header["token_count"] == 5 + 7 + 3


def test_the_reply_says_which_inputs_their_workers_cut_each_row_once(harness: Harness) -> None:
    sub = subscribed(harness, b"r")
    first, second = p.request_key(b"r", 1), p.request_key(b"r", 2)
    harness.register(first, b"r", 1, 4)
    harness.register(second, b"r", 2, 2)
    vectors = np.ones((3, 1), np.float32)
    harness.result([(first, [3, 0]), (second, [1])], vectors, truncated=[True, False, True])  # a merged job
    harness.result([(first, [3])], vectors[:1], truncated=[False])  # row 3 again, from a retry: the first stays
    harness.result([(first, [1, 2])], vectors[:2], truncated=[False, True])
    harness.result([(second, [0])], vectors[:1])
    replies = {reply.request_id: reply for reply in (receive(sub), receive(sub))}
    assert replies[1].header["truncated"] == [2, 3]
    assert replies[2].header["truncated"] == [1]


@pytest.mark.parametrize(
    "truncated",
    [None, "missing", [True], [True, False, False], [1, 0], ["yes", "no"], "true", [None, False]],
    ids=["null", "missing", "too-few", "too-many", "ints", "strings", "string", "nulls"],
)
def test_a_result_without_its_rows_cut_flags_right_is_dropped_and_the_request_still_ends(
    harness: Harness, truncated: object
) -> None:
    sub = subscribed(harness, b"f")
    key = p.request_key(b"f", 1)
    harness.register(key, b"f", 1, 2)
    vectors = np.ones((2, 1), np.float32)
    header = {"parts": [{"key": key, "rows": [0, 1]}], **p.array_header(vectors), "truncated": truncated}
    if truncated == "missing":
        del header["truncated"]
    with pytest.raises(p.ProtocolError, match="truncated"):
        messages.read([wire.RESULT, b"job", p.dumps(header), vectors.tobytes()])
    harness.send(wire.RESULT, b"job", p.dumps(header), vectors.tobytes())
    assert receive(sub, 300) is None and harness.sink.running  # dropped at the edge, the sink goes on
    harness.result([(key, [0, 1])], vectors, truncated=[False, True])  # the job, run again, answers right
    reply = receive(sub)
    assert reply is not None and reply.ok and reply.header["truncated"] == [1]


def test_a_job_delivered_twice_can_neither_complete_nor_overwrite_a_request(harness: Harness) -> None:
    sub = subscribed(harness, b"c")
    key = p.request_key(b"c", 1)
    harness.register(key, b"c", 1, 4)
    good = np.ones((2, 3), np.float32)
    harness.result([(key, [0, 1])], good)
    harness.result([(key, [0, 1])], np.full((2, 3), 9, np.float32))  # the same rows again, from a retry
    assert receive(sub, 300) is None  # rows 2 and 3 are still missing
    harness.result([(key, [2, 3])], 2 * good)
    reply = receive(sub)
    assert reply is not None and reply.ok
    np.testing.assert_array_equal(reply.array(), np.concatenate([good, 2 * good]))


def test_a_result_that_does_not_fit_its_request_becomes_an_error_reply(harness: Harness) -> None:
    sub = subscribed(harness, b"c")
    key = p.request_key(b"c", 2)
    harness.register(key, b"c", 2, 2)
    harness.result([(key, [0, 5])], np.ones((2, 3), np.float32))
    reply = receive(sub)
    assert reply is not None and not reply.ok and reply.header["kind"] == "internal"


def test_a_failure_to_assemble_becomes_an_error_reply(harness: Harness, monkeypatch) -> None:
    def broken(self: Pending) -> np.ndarray:
        raise MemoryError("no room")

    monkeypatch.setattr(Pending, "assemble", broken)
    sub = subscribed(harness, b"c")
    key = p.request_key(b"c", 3)
    harness.register(key, b"c", 3, 1)
    harness.result([(key, [0])], np.ones((1, 3), np.float32))
    reply = receive(sub)
    assert reply is not None and not reply.ok and "could not assemble" in reply.header["error"]
    assert key not in harness.sink.pending


def test_results_that_arrive_before_their_registration_are_kept(harness: Harness) -> None:
    sub = subscribed(harness, b"c")
    key = p.request_key(b"c", 4)
    harness.result([(key, [0])], np.ones((1, 2), np.float32))
    time.sleep(0.05)
    harness.register(key, b"c", 4, 1)
    reply = receive(sub)
    assert reply is not None and reply.ok


def test_a_second_registration_of_a_pending_key_is_ignored(harness: Harness) -> None:
    sub = subscribed(harness, b"c")
    key = p.request_key(b"c", 5)
    harness.register(key, b"c", 5, 2)
    harness.register(key, b"c", 5, 1)
    harness.result([(key, [0])], np.ones((1, 2), np.float32))
    assert receive(sub, 300) is None
    harness.result([(key, [1])], np.ones((1, 2), np.float32))
    reply = receive(sub)
    assert reply is not None and reply.array().shape == (2, 2)


def test_nobody_can_subscribe_to_every_client(harness: Harness) -> None:
    snoop = harness.subscriber(b"")
    mine = subscribed(harness, b"victim")
    key = p.request_key(b"victim", 1)
    harness.register(key, b"victim", 1, 1)
    harness.result([(key, [0])], np.ones((1, 2), np.float32))
    assert receive(mine) is not None
    assert receive(snoop, 300) is None
    snoop.close()


def test_failed_requests_get_an_error_and_late_parts_are_dropped(harness: Harness) -> None:
    sub = subscribed(harness, b"c")
    key = p.request_key(b"c", 6)
    harness.register(key, b"c", 6, 2)
    harness.send(wire.FAIL, p.dumps({"keys": [key], "error": "it crashed a worker twice", "kind": "worker"}))
    reply = receive(sub)
    assert reply is not None and not reply.ok
    assert reply.header == {"error": "it crashed a worker twice", "kind": "worker"}
    harness.result([(key, [0, 1])], np.ones((2, 2), np.float32))
    assert receive(sub, 300) is None
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and key not in harness.sink.closed:
        time.sleep(0.01)
    assert key not in harness.sink.orphans


def test_dimensions_keep_the_first_k_renormalized_and_too_many_is_an_input_error(harness: Harness) -> None:
    sub = subscribed(harness, b"d")
    vectors = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    for request_id, extra in (
        (1, {"dimensions": 2, "normalize": True}),
        (2, {"dimensions": 3}),
        (3, {"dimensions": 5, "normalize": True}),
    ):
        key = p.request_key(b"d", request_id)
        harness.register(key, b"d", request_id, 3, **extra)
        harness.result([(key, [0, 1, 2])], vectors)
    replies = {reply.request_id: reply for reply in (receive(sub) for _ in range(3)) if reply is not None}
    cut = vectors[:, :2] / np.linalg.norm(vectors[:, :2], axis=1, keepdims=True)
    np.testing.assert_allclose(replies[1].array(), cut, rtol=1e-6)
    np.testing.assert_array_equal(replies[2].array(), vectors[:, :3])  # a model that does not normalize
    assert not replies[3].ok and replies[3].header["kind"] == "input"
    assert "dimensions=5 is more than this model's 4 dimensions" in replies[3].header["error"]


def test_a_request_past_the_deadline_the_head_gave_it_is_answered_as_expired(harness: Harness) -> None:
    sub = subscribed(harness, b"e")
    key = p.request_key(b"e", 1)
    admitted = time.monotonic() - 0.1  # the head admitted it a moment ago, on the same clock
    harness.register(key, b"e", 1, 2, admitted=admitted, deadline=admitted + 0.2)
    reply = receive(sub, 5000)
    assert reply is not None and not reply.ok and reply.header["kind"] == "expired"
    assert "expired" in reply.header["error"] and "0.2 s" in reply.header["error"]


MALFORMED = [
    [wire.REGISTER, b"not json"],
    [wire.REGISTER, p.dumps({"key": "k", "client": "00", "request_id": 1, "count": 1})],  # no deadline
    [wire.REGISTER, p.dumps({"key": "k", "client": "zz", "request_id": 1, "count": 1, "deadline": 1, "admitted": 0})],
    [wire.REGISTER, p.dumps({"key": "k", "client": "00", "request_id": "1", "count": 1, "deadline": 1, "admitted": 0})],
    [wire.REGISTER, b'{"key": "k", "client": "00", "request_id": 1, "count": 1, "deadline": 1e999, "admitted": 0}'],
    [wire.REGISTER, p.dumps({"key": "k", "client": "00", "request_id": 1, "count": 0, "deadline": 1, "admitted": 0})],
    [
        wire.REGISTER,
        p.dumps({"key": "k", "client": "00", "request_id": 1, "count": 1, "deadline": 1, "admitted": 0, "format": "x"}),
    ],
    [wire.REGISTER],
    [wire.FAIL, p.dumps({"keys": "k", "error": "e"})],
    [wire.FAIL, p.dumps({"keys": ["k"], "error": "e", "kind": "Evil\nkind"})],
    [wire.FAIL, p.dumps([1, 2])],
    [wire.RESULT, b"job", p.dumps({"parts": [{"key": "k", "rows": [0]}], "dtype": "float32", "shape": [1, 2]}), b"x"],
    [wire.RESULT, b"job", p.dumps({"parts": [], "dtype": "float32", "shape": [0, 2]}), b""],
    [wire.RESULT, b"job", p.dumps({"parts": [{"key": "k", "rows": [0]}], "dtype": "int8", "shape": [1, 1]}), b"x"],
    [wire.JOB_ERROR, b"job", p.dumps({"error": "no parts"})],
    [wire.PUBLISH, b"native"],
    [wire.PUBLISH, b"nobody's", b"c", b"1"],
    [p.STATUS, b"native", b"c", b"one", b"{}"],
    [p.STATUS, b"native", b"c", b"1", b"[]"],
    [wire.STOP, b"extra"],
    [b"WHAT", b"{}"],
    [],
]


@pytest.mark.parametrize("frames", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_message_is_refused_at_the_edge(frames: list[bytes]) -> None:
    with pytest.raises(p.ProtocolError):
        messages.read(frames)


def test_the_sink_drops_malformed_messages_and_goes_on(harness: Harness, caplog) -> None:
    sub = subscribed(harness, b"m")
    for frames in MALFORMED:
        if frames:
            harness.send(*frames)
    key = p.request_key(b"m", 1)
    harness.register(key, b"m", 1, 1)
    harness.result([(key, [0])], np.ones((1, 2), np.float32))
    reply = receive(sub)
    assert reply is not None and reply.ok and harness.sink.running
    assert "dropped a malformed internal message" in caplog.text


def test_register_and_fail_round_trip_through_their_schemas() -> None:
    register = messages.Register(
        key="k@1", client="00ff", request_id=7, count=3, deadline=12.5, admitted=10.0, version=2, format="legacy"
    )
    parsed = messages.read(register.frames())
    assert parsed == register and parsed.client_id == b"\x00\xff" and parsed.timeout_s == 2.5
    fail = messages.Fail(keys=["a", "b"], error="gone", kind="shutdown")
    assert messages.read(fail.frames()) == fail
