"""Limits, end to end: admission (busy refusals), bounded memory against clients that do
not read or send huge frames, identities of any bytes, duplicate request ids.

The servers run the numpy models of :mod:`faulty_model`, so they start in seconds and
their answers are known exactly.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import bertserve.client
import numpy as np
import pytest
import zmq
from bertserve.client import BertClient, ServerError, protocol as p
from bertserve.server.testing.launcher import RunningServer, start_server
from faulty_model import expected, pythonpath_env, sentences, wait_for

ServerBusyError = getattr(bertserve.client, "ServerBusyError", ServerError)

MEMORY_SLACK_MIB = 64


def serve(model_dir: str, model: str, *flags: str) -> RunningServer:
    return start_server(
        "--model-dir",
        model_dir,
        "--max-seq-len",
        "32",
        "--model-class",
        f"faulty_model:{model}",
        *flags,
        env=pythonpath_env(),
        timeout=60,
    )


@pytest.fixture(scope="module")
def hashing_server(tiny_google: str) -> Iterator[RunningServer]:
    server = serve(tiny_google, "FaultyModel", "--num-worker", "1")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def wide_server(tiny_google: str) -> Iterator[RunningServer]:
    """1024-wide vectors (400 KiB for a reply of 100), at most 10 replies queued per client."""
    server = serve(tiny_google, "WideModel", "--num-worker", "1", "--reply-hwm", "10")
    yield server
    server.stop()


class _Raw:
    """A client made of bare sockets: a PUSH for requests, a SUB for one identity's replies."""

    def __init__(self, server: RunningServer, identity: bytes, *, rcvhwm: int = 1000, rcvbuf: int = -1) -> None:
        self.identity = identity
        self.context = zmq.Context()
        self.push = self.context.socket(zmq.PUSH)
        self.sub = self.context.socket(zmq.SUB)
        self.push.linger = self.sub.linger = 0
        self.push.sndhwm = 100_000
        self.sub.rcvhwm = rcvhwm
        self.sub.rcvbuf = rcvbuf
        self.sub.setsockopt(zmq.SUBSCRIBE, identity)
        self.sub.connect(f"tcp://127.0.0.1:{server.port_out}")
        self.push.connect(f"tcp://127.0.0.1:{server.port}")
        time.sleep(0.5)  # the subscription reaches the server

    def send(self, request_id: int, texts: list[str]) -> None:
        self.push.send_multipart(p.encode_request(self.identity, p.ENCODE, request_id, {}, texts))

    def replies(self, count: int, timeout_s: float) -> list[p.Reply]:
        got: list[p.Reply] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < count and (left := deadline - time.monotonic()) > 0:
            if self.sub.poll(int(left * 1000) + 1):
                got.append(p.decode_reply(self.sub.recv_multipart()))
        return got

    def close(self) -> None:
        self.push.close()
        self.sub.close()
        self.context.term()


# -- admission ---------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_a_flood_is_refused_at_once_while_other_clients_are_queued(tiny_google: str) -> None:
    server = serve(
        tiny_google,
        "FaultyModel",
        "--num-worker",
        "1",
        "--heartbeat-timeout-ms",
        "60000",
        "--max-request-size",
        "50",
        "--max-client-queued-sentences",
        "100",
        "--max-queued-sentences",
        "200",
    )
    kwargs = {**server.client_kwargs, "timeout": 20_000}
    try:
        with (
            BertClient(**kwargs) as flood,
            BertClient(**kwargs) as small,
            BertClient(**kwargs) as third,
            BertClient(**kwargs) as watcher,
        ):
            flood.encode(["warm up"])
            (worker,) = [w["pid"] for w in watcher.server_status["workers"]]
            os.kill(worker, signal.SIGSTOP)  # nothing is answered until SIGCONT: the queues stay full
            try:
                batches = [sentences(50, seed=i) for i in range(10)]
                flood.encode(batches[0], blocking=False)
                wait_for(
                    lambda: (s := watcher.server_status)["jobs_in_flight"] and not s["queued_sentences"],
                    5,
                    "the whole first request reaching the worker",
                )
                ids = [flood.encode(batch, blocking=False) for batch in batches[1:]]
                started = time.monotonic()
                refused = []
                for _ in range(7):  # 2 more fit the client's 100 queued sentences; 7 do not
                    with pytest.raises(ServerBusyError) as caught:
                        next(flood.fetch())
                    refused.append(caught.value)
                refused_in = time.monotonic() - started
                mine = sentences(10, seed=100)
                small.encode(mine, blocking=False)  # another client still has room
                theirs = sentences(50, seed=101)
                third.encode(theirs, blocking=False)  # 160 queued in all
                third.encode(sentences(50, seed=102), blocking=False)  # 210: over the server's 200
                with pytest.raises(ServerBusyError) as over_total:
                    next(third.fetch())
                status = watcher.server_status
            finally:
                os.kill(worker, signal.SIGCONT)
            assert refused_in < 3, f"the busy replies took {refused_in:.1f} s"
            assert all(e.kind == "busy" and "may queue at most 100" in e.message for e in refused), refused
            assert over_total.value.kind == "busy" and "at most 200" in over_total.value.message, over_total.value
            assert sorted(e.request_id for e in refused) == ids[2:]  # whole requests: the first 3 queued
            assert status["busy_rejections"] == 8 and status["rejections"].get("busy") == 8, status
            assert status["queued_sentences"] == 160 and status["active_clients"] == 3, status

            answered = flood.fetch_all()
            assert len(answered) == 3
            for batch, got in zip(batches[:3], answered, strict=True):
                np.testing.assert_allclose(got, expected(batch), atol=1e-6)
            np.testing.assert_allclose(small.fetch_all()[0], expected(mine), atol=1e-6)
            np.testing.assert_allclose(third.fetch_all()[0], expected(theirs), atol=1e-6)
            after = watcher.server_status
        assert after["queued_sentences"] == 0 and after["active_clients"] == 0, after
    finally:
        server.stop()


# -- memory ------------------------------------------------------------------------------


def _settle(client: BertClient, served: int, timeout: float = 60) -> None:
    """Wait until the server has answered ``served`` requests and holds nothing."""

    def done() -> bool:
        status = client.server_status
        return status["requests_served"] >= served and not status["requests_pending"] and not status["queued_sentences"]

    wait_for(done, timeout, f"{served} requests answered", interval=0.25)
    time.sleep(1.0)


@pytest.mark.timeout(120)
def test_a_client_that_never_reads_costs_the_server_bounded_memory(wide_server: RunningServer) -> None:
    with BertClient(**wide_server.client_kwargs, timeout=30_000) as reader:
        for seed in range(20):  # warm up at the size of the flood, so the allocator has what it keeps
            reader.encode(sentences(100, seed=seed))
        served = reader.server_status["requests_served"]
        before = wide_server.family_rss_mib()
        # rcvhwm 1 and a small kernel buffer: ZeroMQ stops reading for this client at once.
        lazy = _Raw(wide_server, b"never-reads", rcvhwm=1, rcvbuf=4096)
        try:
            for request_id in range(300):
                lazy.send(request_id, sentences(100, seed=1000 + request_id))
            _settle(reader, served + 300)
            after = wide_server.family_rss_mib()
            replies = lazy.replies(300, 10)
        finally:
            lazy.close()
        texts = sentences(30, seed=5)
        np.testing.assert_allclose(reader.encode(texts), expected(texts, dim=1024), atol=1e-6)
    assert after - before < MEMORY_SLACK_MIB, f"RSS grew {after - before:.0f} MiB (from {before:.0f})"
    kept = [reply for reply in replies if reply.ok]
    assert len(kept) < 100, f"{len(kept)} replies were kept for a client that did not read"
    # the rest were dropped, and each is told as a small error once the client reads
    assert len(replies) == 300 and all(r.header["kind"] == p.DROPPED for r in replies if not r.ok), len(replies)


@pytest.mark.timeout(120)
def test_a_100_mb_frame_is_dropped_unread(wide_server: RunningServer) -> None:
    with BertClient(**wide_server.client_kwargs, timeout=30_000) as client:
        limit = client.server_config["max_message_bytes"]
        assert limit <= 64 * 2**20
        received = client.server_status["requests_received"]
        before = wide_server.family_rss_mib()
        raw = _Raw(wide_server, b"huge")
        try:
            raw.push.send_multipart([b"huge", p.ENCODE, b"1", p.dumps({"protocol": 1}), b"x" * 100_000_000])
            time.sleep(2.0)
            peak = wide_server.family_rss_mib()
            dropped = raw.replies(1, 1)
        finally:
            raw.close()
        texts = sentences(20, seed=6)
        np.testing.assert_allclose(client.encode(texts), expected(texts, dim=1024), atol=1e-6)
        status = client.server_status
    assert peak - before < MEMORY_SLACK_MIB, f"RSS grew {peak - before:.0f} MiB (from {before:.0f})"
    assert dropped == [] and status["requests_received"] == received + 1  # only the encode above


# -- identities --------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_any_identity_of_1_to_64_bytes_gets_its_own_replies(hashing_server: RunningServer) -> None:
    identities: list[bytes | str] = [
        "café",
        b"\x00",
        b"\xff\x00\xfe",
        bytes(range(64)),
        bytes(range(192, 256)),
        b"a",
        b"ab",
        b"a\x00",
        "日本語",
    ]
    clients = [BertClient(**hashing_server.client_kwargs, timeout=10_000, identity=i) for i in identities]
    try:
        batches = [sentences(3 + i, seed=200 + i) for i in range(len(clients))]
        for client, batch in zip(clients, batches, strict=True):  # all at once: "a" must not get "ab"'s
            client.encode(batch, blocking=False)
        for identity, client, batch in zip(identities, clients, batches, strict=True):
            (got,) = client.fetch_all()
            np.testing.assert_allclose(got, expected(batch), atol=1e-6, err_msg=repr(identity))
    finally:
        for client in clients:
            client.close()
    raw = _Raw(hashing_server, b"\x00\xff raw \xfe")
    try:
        raw.send(3, ["hello world"])
        (reply,) = raw.replies(1, 10)
    finally:
        raw.close()
    assert reply.ok and reply.client_id == b"\x00\xff raw \xfe" and reply.request_id == 3
    np.testing.assert_allclose(reply.array(), expected(["hello world"]), atol=1e-6)


@pytest.mark.timeout(60)
def test_a_pending_request_id_sent_again_is_refused_and_the_first_answered(hashing_server: RunningServer) -> None:
    first, second = sentences(40, seed=300), sentences(5, seed=301)
    raw = _Raw(hashing_server, b"twice")
    try:
        raw.send(5, first)
        raw.send(5, second)
        replies = raw.replies(2, 10)
        late = raw.replies(1, 1)
    finally:
        raw.close()
    assert len(replies) == 2 and not late, replies + late
    assert all(reply.request_id == 5 for reply in replies)
    (refused,) = [reply for reply in replies if not reply.ok]
    (answered,) = [reply for reply in replies if reply.ok]
    assert refused.header["kind"] == "duplicate", refused.header
    np.testing.assert_allclose(answered.array(), expected(first), atol=1e-6)
    with BertClient(**hashing_server.client_kwargs, timeout=10_000) as client:
        assert client.server_status["rejections"].get("duplicate", 0) >= 1


@pytest.mark.timeout(60)
def test_an_identity_used_again_by_a_new_client_is_served(hashing_server: RunningServer) -> None:
    """A program that names its client (``identity=``) and reconnects starts its request ids
    again; its earlier requests were answered, so none of the new ones is a duplicate."""
    texts = sentences(4, seed=400)
    for _ in range(2):
        with BertClient(**hashing_server.client_kwargs, timeout=10_000, identity="reconnecting") as client:
            np.testing.assert_allclose(client.encode(texts), expected(texts), atol=1e-6)


def test_a_server_started_with_only_a_lower_queue_bound_starts_and_the_others_follow(tiny_google: str) -> None:
    server = serve(tiny_google, "FaultyModel", "--num-worker", "1", "--max-queued-sentences", "2000")
    try:
        with BertClient(**server.client_kwargs, timeout=30_000) as client:
            config = client.server_config
            bounds = ("max_queued_sentences", "max_client_queued_sentences", "max_request_size")
            assert [config[name] for name in bounds] == [2000, 2000, 2000]
            texts = sentences(2001)
            np.testing.assert_allclose(client.encode(texts[:2000]), expected(texts[:2000]), atol=1e-6)
            # The client sends 2,001 as requests that fit the bounds, four in flight within 2,000 queued.
            np.testing.assert_allclose(client.encode(texts), expected(texts), atol=1e-6)
        raw = _Raw(server, b"one-request")
        try:
            raw.send(1, texts)  # as one request: refused
            (refused,) = raw.replies(1, 10)
        finally:
            raw.close()
        assert not refused.ok and refused.header["kind"] == "limit", refused.header
        assert "at most 2000 per request" in refused.header["error"], refused.header
    finally:
        server.stop()
