"""The ventilator's glue in this process: the test plays client, workers and sink over real sockets."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from bertserve.client import protocol as p
from bertserve.server.serving.protocol import wire
from bertserve.server.testing.config import server_config
from rigs import Rig, ventilator_rig

DEFAULT = "default"  # the name of a rig's one model

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def rig(tmp_path, request) -> Iterator[Rig]:
    """A ventilator on ipc sockets; ``indirect`` parametrization overrides its config."""
    options = {
        "max_batch_size": 4,
        "max_latency_ms": 0,
        "max_request_size": 10,
        "max_client_queued_sentences": 10,
        "max_queued_sentences": 20,
        **getattr(request, "param", {}),
    }
    with ventilator_rig(tmp_path, server_config("unused", **options)) as rig:
        yield rig


def kinds(messages: list[list[bytes]]) -> list[bytes]:
    return [m[0] for m in messages]


def test_a_request_is_registered_then_dispatched(rig: Rig) -> None:
    dealer, push = rig.worker(b"w0-1", 0)
    rig.request(b"\x00caf\xc3\xa9", 1, ["hello there"])
    job_id, header, texts = rig.job(dealer)
    assert texts == ["hello there"]
    key = rig.ventilator.requests.key_of(p.request_key(b"\x00caf\xc3\xa9", 1))
    assert header["parts"] == [{"key": key, "rows": [0]}]
    (register,) = rig.sink_messages()
    info = p.loads(register[1])
    assert register[0] == wire.REGISTER and bytes.fromhex(info["client"]) == b"\x00caf\xc3\xa9" and info["key"] == key
    push.send_multipart([wire.DONE, p.dumps({"job": job_id, "worker": "w0-1"})])
    rig.pump()
    assert rig.ventilator.idle


@pytest.mark.parametrize("rig", [{"max_latency_ms": 60_000}], indirect=True)
def test_an_idle_worker_gets_a_lone_request_at_once_a_busy_ones_prefetch_slot_waits(rig: Rig) -> None:
    dealer, push = rig.worker(b"w0-1", 0, credits=2)
    rig.request(b"a", 1, ["first"])
    job_id, _, texts = rig.job(dealer)  # no wait for company, though max_latency_ms is a minute
    assert texts == ["first"]
    rig.request(b"b", 1, ["second"])
    rig.request(b"c", 1, ["third"])
    rig.pump()
    assert not dealer.poll(100), "a job went to the busy worker's prefetch slot before its wait"
    push.send_multipart([wire.DONE, p.dumps({"job": job_id, "worker": "w0-1"})])
    _, _, texts = rig.job(dealer)  # idle again: what gathered goes as one job
    assert texts == ["second", "third"]


def pumped_until_job(rig: Rig, dealer, seconds: float) -> bool:
    """Run the ventilator's loop for up to ``seconds``; whether a job reached ``dealer``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rig.ventilator.poll_once(10)
        if dealer.poll(0):
            return True
    return False


def test_a_worker_about_to_finish_its_small_job_gets_the_next_one_beyond_its_credit(rig: Rig) -> None:
    """Just in time: what gathered while it ran goes once the worker should be about to be free
    (its last small job took 1 s: so 0.85 s after the next was sent), not when its credit is back."""
    dealer, push = rig.worker(b"w0-1", 0)
    for number, seconds in ((1, 9.0), (2, 1.0)):  # the first job's time (its one-off costs) is not learned
        rig.request(b"a", number, ["first"])
        first, _, _ = rig.job(dealer)
        push.send_multipart([wire.DONE, p.dumps({"job": first, "worker": "w0-1", "seconds": seconds})])
    rig.request(b"b", 1, ["second"])
    before = time.monotonic()
    second, _, _ = rig.job(dealer)
    rig.request(b"c", 1, ["third"])
    rig.request(b"d", 1, ["fourth"])
    assert not pumped_until_job(rig, dealer, before + 0.75 - time.monotonic()), "the next job went too soon"
    assert pumped_until_job(rig, dealer, 2.0), "no job went ahead of the worker's credit"
    third, _, texts = rig.job(dealer)
    assert texts == ["third", "fourth"] and time.monotonic() - before < 1.5
    rig.request(b"e", 1, ["fifth"])
    assert not pumped_until_job(rig, dealer, 0.5), "a second job went beyond the worker's credit"
    for job_id in (second, third):
        push.send_multipart([wire.DONE, p.dumps({"job": job_id, "worker": "w0-1", "seconds": 1.0})])
    _, _, texts = rig.job(dealer)
    assert texts == ["fifth"]


@pytest.mark.parametrize("rig", [{"max_request_size": 8, "max_client_queued_sentences": 8}], indirect=True)
def test_a_small_request_overtakes_to_a_worker_busy_with_bulk_work(rig: Rig) -> None:
    dealer, push = rig.worker(b"w0-1", 0)
    rig.request(b"bulk", 1, [f"bulk {i}" for i in range(8)])  # two bulk jobs of 4
    bulk_id, header, _ = rig.job(dealer)
    assert header["bulk"] is True
    rig.request(b"a", 1, ["first small"])
    small_id, header, texts = rig.job(dealer)  # beyond the worker's one credit
    assert texts == ["first small"] and header["bulk"] is False
    rig.request(b"b", 1, ["second small"])
    rig.pump()
    assert not dealer.poll(100), "a second small job went to a worker that already holds one"
    push.send_multipart([wire.DONE, p.dumps({"job": small_id, "worker": "w0-1"})])
    second_id, _, texts = rig.job(dealer)
    assert texts == ["second small"]
    for job_id in (second_id, bulk_id):
        push.send_multipart([wire.DONE, p.dumps({"job": job_id, "worker": "w0-1"})])
    _, header, _ = rig.job(dealer)  # the credit back: the rest of the bulk request
    assert header["bulk"] is True


def test_a_pending_request_id_is_refused_and_the_first_is_untouched(rig: Rig) -> None:
    rig.worker(b"w0-1", 0)
    rig.request(b"c", 1, ["first"])
    rig.request(b"c", 1, ["second"])
    messages = rig.sink_messages()
    assert kinds(messages) == [wire.REGISTER, wire.PUBLISH]
    reply = p.decode_reply(messages[1][2:])
    assert not reply.ok and reply.header["kind"] == "duplicate"
    assert rig.ventilator.requests.key_of(p.request_key(b"c", 1)) in rig.ventilator.requests


def test_a_request_over_the_bounds_is_refused_busy_at_once(rig: Rig) -> None:
    rig.request(b"c", 1, ["a"] * 8)  # no worker: it stays queued
    rig.request(b"c", 2, ["b"] * 3)
    rig.request(b"d", 1, ["c"] * 3)
    messages = rig.sink_messages()
    assert kinds(messages) == [wire.REGISTER, wire.PUBLISH, wire.REGISTER]
    reply = p.decode_reply(messages[1][2:])
    assert (reply.request_id, reply.ok, reply.header["kind"]) == (2, False, p.BUSY)
    status = rig.ventilator.status()
    assert status["busy_rejections"] == 1 and status["rejections"] == {"busy": 1} and status["queued_sentences"] == 11


def test_each_limit_is_reported_once_in_order_a_declared_count_before_the_texts_are_read(rig: Rig) -> None:
    def send(request_id: int, header: dict, payload: bytes) -> None:
        full = {"protocol": p.PROTOCOL_VERSION, **header}
        rig.client.send_multipart([b"o", p.ENCODE, str(request_id).encode(), p.dumps(full), payload])

    send(1, {"count": 11}, b"not json")  # over --max-request-size: refused unread
    send(2, {}, b"not json")  # no count declared: read first, to be counted
    send(3, {}, p.dumps(["x"] * 11))
    send(4, {"count": 2}, p.dumps(["x", 7]))
    send(5, {"count": 1}, p.dumps(["x" * 200_000]))  # past --max-text-chars
    rig.request(b"o", 6, ["a"] * 10)  # queued: the client's queue is full
    rig.request(b"o", 7, ["b"])
    replies = [p.decode_reply(m[2:]) for m in rig.sink_messages() if m[0] == wire.PUBLISH]
    said = {reply.request_id: (reply.header["kind"], reply.header["error"]) for reply in replies}
    assert said[1] == ("limit", "the request has 11 inputs; this server takes at most 10 per request")
    assert said[2][0] == "protocol" and said[2][1].startswith("malformed request:")
    assert said[3] == ("limit", "the request has 11 inputs; this server takes at most 10 per request")
    assert said[4][0] == "input"
    assert said[5][0] == "limit" and "characters" in said[5][1]
    assert said[7][0] == p.BUSY and 6 not in said
    assert rig.ventilator.status()["busy_rejections"] == 1  # the room is asked once


def test_a_lost_workers_job_goes_to_another_and_its_late_done_is_ignored(rig: Rig) -> None:
    first, first_push = rig.worker(b"w0-1", 0)
    rig.request(b"c", 1, ["hello"])
    job_id, _, _ = rig.job(first)
    second, second_push = rig.worker(b"w1-2", 1)
    rig.ventilator.worker_lost(0, "killed by the test")
    again, _, texts = rig.job(second)
    assert again == job_id and texts == ["hello"]
    first_push.send_multipart([wire.DONE, p.dumps({"job": job_id, "worker": "w0-1"})])  # the dead one, late
    rig.pump()
    assert rig.ventilator.requests.pending(p.request_key(b"c", 1))
    second_push.send_multipart([wire.DONE, p.dumps({"job": job_id, "worker": "w1-2"})])
    rig.pump()
    assert rig.ventilator.idle


def test_a_job_that_loses_two_workers_fails_its_requests_and_spares_the_others(rig: Rig) -> None:
    rig.client.send_multipart(p.encode_request(b"a", p.ENCODE, 1, {}, ["poison"]))
    rig.client.send_multipart(p.encode_request(b"b", p.ENCODE, 1, {}, ["innocent"]))
    rig.pump()  # both queued before any worker is there
    dealer, _ = rig.worker(b"w0-1", 0, credits=1)
    _job_id, header, _ = rig.job(dealer)
    assert len(header["parts"]) == 2  # merged
    rig.ventilator.worker_lost(0, "worker 0 died")
    dealer, _ = rig.worker(b"w0-2", 0, credits=1)
    _first_retry, header, texts = rig.job(dealer)
    assert texts == ["poison"]  # the merged job was split
    rig.ventilator.worker_lost(0, "worker 0 died")
    messages = rig.sink_messages()
    fail = next(m for m in messages if m[0] == wire.FAIL)
    info = p.loads(fail[1])
    assert [key.split("@")[0] for key in info["keys"]] == [p.request_key(b"a", 1)]
    assert info["kind"] == "worker" and "2 times" in info["error"]
    dealer, _ = rig.worker(b"w0-3", 0, credits=1)
    _, _, texts = rig.job(dealer)
    assert texts == ["innocent"]


def test_a_silent_worker_is_reported_and_its_job_handed_on(rig: Rig, monkeypatch) -> None:
    dealer, _ = rig.worker(b"w0-1", 0)
    rig.request(b"c", 1, ["hello"])
    rig.job(dealer)
    rig.ventilator.registry.heartbeat_timeout_s = 0.0
    found = rig.ventilator.unresponsive_workers()
    assert [(index, pid) for index, pid, _ in found] == [(0, 100)]
    assert len(rig.ventilator.registry) == 0 and rig.ventilator.scheduler.queued == 1


def test_terminate_is_refused_beyond_loopback(rig: Rig) -> None:
    rig.ventilator.control.config = server_config("unused", bind="0.0.0.0")
    rig.client.send_multipart(p.encode_request(b"c", p.TERMINATE, 1, {}))
    messages = rig.sink_messages()
    reply = p.decode_reply(messages[0][2:])
    assert not reply.ok and reply.header["kind"] == "forbidden" and not rig.ventilator.terminate_requested


def test_after_a_sink_restart_every_known_request_gets_an_error(rig: Rig, monkeypatch) -> None:
    rig.worker(b"w0-1", 0)
    rig.request(b"c", 1, ["in flight"])
    rig.request(b"c", 2, ["queued"] * 9)
    rig.sink_messages()
    rig.ventilator.sink_lost()
    replies = [p.decode_reply(m[2:]) for m in rig.sink_messages() if m[0] == wire.PUBLISH]
    assert sorted(r.request_id for r in replies) == [1, 2] and {r.header["kind"] for r in replies} == {"internal"}
    assert rig.ventilator.scheduler.queued == 0 and not rig.ventilator.requests


def test_a_worker_found_unreachable_hands_back_every_job_it_held(rig: Rig) -> None:
    dealer, _ = rig.worker(b"w0-1", 0, credits=2)
    rig.request(b"c", 1, ["first"])
    rig.job(dealer)
    dealer.close(linger=0)  # it dies without a word; the supervisor has not noticed yet
    rig.sockets.remove(dealer)
    time.sleep(0.5)  # ZeroMQ's I/O thread sees the pipe close in its own time (longer on a loaded machine)
    for _ in range(50):
        rig.request(b"c", 2, ["second"])  # its dispatch finds the worker gone
        if b"w0-1" not in rig.ventilator.registry.workers:
            break
    assert b"w0-1" not in rig.ventilator.registry.workers
    other, _ = rig.worker(b"w1-2", 1, credits=2)
    texts = sorted(rig.job(other)[2] + rig.job(other)[2])
    assert texts == ["first", "second"]


def test_an_expired_request_leaves_the_queue(rig: Rig, monkeypatch) -> None:
    rig.request(b"c", 1, ["no worker will come"] * 3)
    assert rig.ventilator.scheduler.queued == 3
    for request in rig.ventilator.requests.book.requests.values():
        request.deadline = 0.0
    rig.ventilator.expiry.sweep(0.0)
    rig.pump()
    assert rig.ventilator.scheduler.queued == 0 and rig.ventilator.idle


def test_a_cancelled_request_leaves_the_queue_and_only_its_owner_can_cancel_it(rig: Rig) -> None:
    rig.request(b"c", 1, ["no worker will come"] * 3)
    rig.request(b"d", 1, ["nor for this"] * 2)
    rig.sink_messages()
    rig.client.send_multipart(p.encode_request(b"d", p.CANCEL, 2, {}))  # not d's pending request: nothing
    rig.client.send_multipart(p.encode_request(b"e", p.CANCEL, 1, {}))  # another client's id: nothing of c's
    rig.client.send_multipart(p.encode_request(b"c", p.CANCEL, 1, {}))
    fails = [p.loads(m[1]) for m in rig.sink_messages() if m[0] == wire.FAIL]
    assert [(fail["kind"], len(fail["keys"])) for fail in fails] == [("cancelled", 1)]
    assert rig.ventilator.scheduler.queued == 2 and rig.ventilator.status()["requests_cancelled"] == 1
    dealer, _ = rig.worker(b"w0-1", 0)
    assert rig.job(dealer)[2] == ["nor for this"] * 2  # the other request runs, whole


def test_a_job_past_its_deadline_is_never_sent_and_the_rest_go_with_the_time_left(rig: Rig) -> None:
    rig.request(b"c", 1, ["expired before any worker came"] * 3)
    rig.client.send_multipart(p.encode_request(b"d", p.ENCODE, 1, {"timeout_ms": 60_000}, ["still awaited"]))
    rig.pump()
    for request in rig.ventilator.requests.book.requests.values():
        if request.client == b"c":
            request.deadline = 0.0
    for piece in (item for queue in rig.ventilator.scheduler.clients.values() for item in queue.small):
        if piece.client == b"c":
            piece.deadline = 0.0
    dealer, _ = rig.worker(b"w0-1", 0)
    _, header, texts = rig.job(dealer)
    assert texts == ["still awaited"] and 59 < header["expires_in_s"] <= 60
    assert rig.ventilator.status()["expired_sentences_dropped"] == 3 and rig.ventilator.scheduler.empty


def test_chunk_requests_go_to_workers_as_their_own_jobs_and_are_refused_where_the_model_cannot(rig: Rig) -> None:
    dealer, _ = rig.worker(b"w0-1", 0, credits=4)
    rig.ventilator.registry.models[(DEFAULT, None)] = {"pooling_strategy": "REDUCE_MEAN", "chunking": True}
    rig.client.send_multipart(p.encode_request(b"c", p.ENCODE, 1, {"long_inputs": "chunk"}, ["long one"]))
    rig.request(b"d", 1, ["plain one"])
    jobs = [rig.job(dealer), rig.job(dealer)]
    headers = {tuple(texts): header for _, header, texts in jobs}
    assert headers[("long one",)].get("chunk") is True and "chunk" not in headers[("plain one",)]
    rig.ventilator.registry.models[(DEFAULT, None)] = {"pooling_strategy": "CLS_TOKEN", "chunking": False}
    rig.client.send_multipart(p.encode_request(b"e", p.ENCODE, 1, {"long_inputs": "chunk"}, ["x"]))
    rig.client.send_multipart(p.encode_request(b"e", p.ENCODE, 2, {"long_inputs": "window"}, ["x"]))
    errors: dict[int, str] = {}

    def refused(count: int) -> None:  # until the head has answered them: a loaded machine is slow to deliver
        for _ in range(200):
            replies = [p.decode_reply(m[2:]) for m in rig.sink_messages() if m[0] == wire.PUBLISH]
            errors.update({reply.request_id: reply.header["error"] for reply in replies if not reply.ok})
            if len(errors) >= count:
                return

    refused(2)
    rig.ventilator.registry.models[(DEFAULT, None)] = {"model_class": "some:Model"}
    rig.client.send_multipart(p.encode_request(b"e", p.ENCODE, 3, {"long_inputs": "chunk"}, ["x"]))
    refused(3)
    assert "CLS_TOKEN takes one token of one window" in errors[1]
    assert "long_inputs must be truncate or chunk" in errors[2]
    assert "cannot encode long inputs in windows" in errors[3]


def test_a_job_goes_only_to_a_worker_of_the_model_version_it_was_admitted_under(rig: Rig) -> None:
    served = rig.ventilator.models.default
    rig.ventilator.serve_version(served, 1, served.config.model.model_dir)
    old, _ = rig.worker(b"old", 0, version=1)
    rig.request(b"c1", 1, ["a", "b"])  # pinned to version 1
    _, header, _ = rig.job(old)  # the old worker now holds its one credit
    assert header["parts"][0]["key"].startswith(b"c1".hex())
    rig.ventilator.serve_version(served, 2, served.config.model.model_dir)  # a swap: new requests run on 2
    rig.request(b"c2", 1, ["c"])
    assert not old.poll(200), "a version-2 job went to a version-1 worker"
    new, _ = rig.worker(b"new", 1, version=2)
    _, header, texts = rig.job(new)
    assert texts == ["c"] and rig.ventilator.scheduler.empty
    registers = [p.loads(m[1]) for m in rig.sink_messages() if m[0] == wire.REGISTER]
    assert [r["version"] for r in registers] == [1, 2]


@pytest.mark.parametrize("rig", [{"max_queued_bytes": 2**20, "max_text_chars": 200_000}], indirect=True)
def test_requests_past_the_byte_bound_are_refused_busy_and_a_request_that_never_fits_limit(rig: Rig) -> None:
    rig.request(b"c", 1, ["a" * 60_000] * 10)  # no worker: it stays queued, holding about 600 KB
    rig.request(b"d", 1, ["b" * 60_000] * 10)  # would pass 1 MiB beside it
    rig.request(b"e", 1, ["€" * 100_000] * 6)  # two bytes a character in memory: 1.2 MB never fits
    rig.request(b"f", 1, ["small"])
    messages = rig.sink_messages()
    assert kinds(messages) == [wire.REGISTER, wire.PUBLISH, wire.PUBLISH, wire.REGISTER]
    busy, never = p.decode_reply(messages[1][2:]), p.decode_reply(messages[2][2:])
    assert busy.header["kind"] == p.BUSY and "--max-queued-bytes" in busy.header["error"]
    assert never.header["kind"] == "limit" and "--max-queued-bytes" in never.header["error"]
    held = rig.ventilator.status()["queued_bytes"]
    assert 600_000 < held < 700_000
    first = rig.ventilator.requests.key_of(p.request_key(b"c", 1))
    assert first is not None
    rig.ventilator.requests.fail({first}, "the test gave up on it", "timeout")  # answered: its bytes are free
    assert rig.ventilator.status()["queued_bytes"] < 1000  # only the small request's
    rig.request(b"d", 2, ["b" * 60_000] * 10)
    assert kinds(rig.sink_messages()) == [wire.FAIL, wire.REGISTER]
