"""Attack: replies a live client never loses, and a reply dropped by design is told.

The server queues at most ``--reply-hwm`` replies for one connection. Our clients keep at most
that many requests unanswered (the ``CONFIG`` answer says how many), so however late they
read, none of their replies is dropped: 10,000 calls at once on one ``AsyncBertClient``, and
64 threads on one ``ConcurrentBertClient``, all come back. A client that does stop reading
(a raw protocol client, here) has replies dropped past that queue, and gets, for each, an
error naming why as soon as it reads again, never silence. Under CURVE the same holds on the
routed reply port, and one key's replies waiting for their connections cannot fill the room
another key's reply waits in.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import zmq
from bertserve.client import AsyncBertClient, BertClient, ConcurrentBertClient, protocol as p
from bertserve.client.security import announce, reply_socket
from bertserve.server import security as s
from bertserve.server.serving.protocol import formats
from bertserve.server.serving.sink.held import MAX_HELD
from bertserve.server.serving.sink.replies import Routed
from bertserve.server.testing.config import server_config
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from faulty_model import expected, pythonpath_env
from zmq.auth.certs import _write_key_file

pytestmark = pytest.mark.timeout(180)

REPLY_HWM = 10  # the server under attack queues this many replies a connection


@pytest.fixture(scope="module")
def http_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(tiny_google: str, http_port: int) -> Iterator[RunningServer]:
    """The hashing model with 1024-wide vectors (a reply of 16 is 64 KiB), a small reply
    queue, and the HTTP front end."""
    running = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        "faulty_model:WideModel",
        "--max-seq-len",
        "32",
        "--reply-hwm",
        str(REPLY_HWM),
        "--http-port",
        str(http_port),
        env=pythonpath_env(),
    )
    yield running
    running.stop()


def test_ten_thousand_calls_at_once_on_one_async_client_lose_nothing(server: RunningServer) -> None:
    """5 rounds of 10,000 concurrent one-text calls: every one answered with its own vector."""

    async def main() -> list[int]:
        lost = []
        async with AsyncBertClient(**server.client_kwargs, timeout=120_000) as client:
            for round_ in range(5):
                texts = [f"round {round_} call {i}" for i in range(10_000)]
                results = await asyncio.gather(*(client.encode([text]) for text in texts), return_exceptions=True)
                failed = [r for r in results if isinstance(r, BaseException)]
                lost.append(len(failed))
                assert not failed, failed[:3]
                np.testing.assert_allclose(np.concatenate(results), expected(texts, dim=1024), atol=1e-5)
                transport = client._connection.transport
                assert transport is not None and transport.window.size == REPLY_HWM
        return lost

    assert asyncio.run(main()) == [0] * 5


def test_sixty_four_threads_on_one_concurrent_client_lose_nothing(server: RunningServer) -> None:
    errors: list[BaseException] = []
    wrong: list[str] = []
    with ConcurrentBertClient(max_concurrency=16, **server.client_kwargs, timeout=120_000) as pool:

        def work(thread: int) -> None:
            for i in range(100):
                text = f"thread {thread} call {i}"
                try:
                    if not np.allclose(pool.encode([text]), expected([text], dim=1024), atol=1e-5):
                        wrong.append(text)
                except BaseException as exc:
                    errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(64)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(150)
    assert not errors, errors[:3]
    assert not wrong, wrong[:3]


def test_three_hundred_http_calls_at_once_all_come_back(server: RunningServer, http_port: int) -> None:
    """The HTTP front end is one client of the head for all its callers: 300 calls at once,
    30 times its reply queue, are each answered with their own vectors."""

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=120) as http:
            calls = [http.post("/v1/embeddings", json={"input": [f"http call {i}"] * 8}) for i in range(300)]
            return await asyncio.gather(*calls)

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200] * 300, {r.status_code for r in responses}
    for i, response in enumerate(responses):
        got = np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, expected([f"http call {i}"] * 8, dim=1024), atol=1e-5)


def test_non_blocking_requests_left_unfetched_all_come_back(server: RunningServer) -> None:
    """200 ``blocking=False`` requests of 64 KiB replies, fetched only once the server has
    answered them all: the client reads what is in whenever it is past the window, so every
    answer is there."""
    texts = [f"text {i} fetched late" for i in range(16)]
    with BertClient(**server.client_kwargs, timeout=60_000) as client:
        for _ in range(200):
            client.encode(texts, blocking=False)
        with BertClient(**server.client_kwargs, timeout=30_000) as other:
            _wait_until_answered(other)
        results = client.fetch_all()
    assert len(results) == 200
    for vectors in results:
        np.testing.assert_allclose(vectors, expected(texts, dim=1024), atol=1e-5)


def test_a_client_that_stops_reading_is_told_which_replies_were_dropped(server: RunningServer) -> None:
    """A raw client sends 200 requests of 16 texts (64 KiB replies) without reading; once it
    reads, every request has its answer: its vectors, or an error naming the reply queue.
    Another client is served meanwhile as ever."""
    context = zmq.Context()
    identity = b"stopped-" + os.urandom(8).hex().encode()
    push = context.socket(zmq.PUSH)
    sub = context.socket(zmq.SUB)
    for sock in (push, sub):
        sock.linger = 0
    sub.rcvhwm = 1
    sub.rcvbuf = 4096  # the kernel holds little for it either
    sub.setsockopt(zmq.SUBSCRIBE, identity)
    port, port_out = server.client_kwargs["port"], server.client_kwargs["port_out"]
    push.connect(f"tcp://127.0.0.1:{port}")
    sub.connect(f"tcp://127.0.0.1:{port_out}")
    try:
        _config = _first_config(push, sub, identity)
        assert _config["reply_hwm"] == REPLY_HWM
        texts = [f"text {i} of a reply nobody reads yet" for i in range(16)]
        sent = set(range(100, 300))
        for request_id in sent:
            push.send_multipart(p.encode_request(identity, p.ENCODE, request_id, {"client_version": "x"}, texts))
        with BertClient(**server.client_kwargs, timeout=30_000) as other:
            _wait_until_answered(other)
            assert other.encode(["another client"]).shape == (1, 1024)
        answers = _read_answers(sub, identity, sent, timeout_s=30)
    finally:
        push.close()
        sub.close()
        context.term()
    assert set(answers) == sent, f"{len(sent - set(answers))} requests got nothing"
    dropped = [reply for reply in answers.values() if not reply.ok]
    assert dropped, "the attack did not fill the reply queue: nothing was dropped"
    for reply in dropped:
        assert reply.header["kind"] == p.DROPPED
        assert "--reply-hwm" in reply.header["error"] and "not read" in reply.header["error"]
    for reply in answers.values():
        if reply.ok:
            np.testing.assert_allclose(reply.array(), expected(texts, dim=1024), atol=1e-5)


def _first_config(push: zmq.Socket, sub: zmq.Socket, identity: bytes) -> dict:
    """The server's CONFIG, asked again until the subscription is in."""
    for request_id in range(1, 100):
        push.send_multipart(p.encode_request(identity, p.CONFIG, request_id, {"client_version": "x"}))
        if sub.poll(200):
            return p.decode_reply(sub.recv_multipart()).header
    raise AssertionError("the server never answered CONFIG")


def _wait_until_answered(client: BertClient) -> None:
    deadline = time.monotonic() + 60
    while client.server_status["requests_in_flight"] > 0:
        assert time.monotonic() < deadline, "the server did not answer the flood within 60 s"
        time.sleep(0.1)
    time.sleep(0.5)  # the sink's last sends, and a retry of what it owes


def _read_answers(sub: zmq.Socket, identity: bytes, wanted: set[int], timeout_s: float) -> dict[int, p.Reply]:
    answers: dict[int, p.Reply] = {}
    deadline = time.monotonic() + timeout_s
    while set(answers) != wanted and time.monotonic() < deadline:
        if sub.poll(100):
            reply = p.decode_reply(sub.recv_multipart())
            if reply.client_id == identity and reply.request_id in wanted:
                assert reply.request_id not in answers, f"request {reply.request_id} answered twice"
                answers[reply.request_id] = reply
    return answers


# -- under CURVE: the routed reply port, with real DEALER clients on loopback -----------------


@pytest.fixture
def routed(tmp_path: Path) -> Iterator[tuple[Routed, str, dict[str, tuple[bytes, bytes]], zmq.Context, bytes]]:
    server_public, server_secret = zmq.curve_keypair()
    clients = tmp_path / "clients"
    clients.mkdir()
    pairs = {name: zmq.curve_keypair() for name in ("attacker", "victim")}
    for name, (public, _) in pairs.items():
        _write_key_file(str(clients / f"{name}.key"), "test", public)
    keys = s.CurveServerKeys(server_public, server_secret, clients)
    context = zmq.Context()
    authenticator = s.start_authenticator(context, keys)
    replies = Routed(context, server_config("unused", reply_hwm=2), keys)
    replies.socket.bind("tcp://127.0.0.1:0")
    endpoint = replies.socket.getsockopt(zmq.LAST_ENDPOINT).decode()
    try:
        yield replies, endpoint, pairs, context, server_public
    finally:
        replies.close()
        authenticator.stop()
        context.destroy(linger=0)


def _dealer(context: zmq.Context, server_public: bytes, pair: tuple[bytes, bytes], topic: bytes) -> zmq.Socket:
    sock = reply_socket(context, topic, routed=True)
    sock.curve_serverkey = server_public
    sock.curve_publickey, sock.curve_secretkey = pair
    sock.rcvhwm = 1
    sock.rcvbuf = 4096
    return sock


def _pump(replies: Routed, until: float) -> None:
    """Run the reply port's loop, as the sink does, until ``until``."""
    while time.monotonic() < until:
        if replies.socket.poll(20):
            replies.read()
        replies.release_due(time.monotonic())


def test_under_curve_a_full_connection_is_told_and_one_key_cannot_fill_the_held_room(routed) -> None:  # type: ignore[no-untyped-def]
    replies, endpoint, pairs, context, server_public = routed
    attacker_id, victim_id = pairs["attacker"][0] + b":a", pairs["victim"][0] + b":v"
    # The attacker's replies come before any connection of its key, more than the whole room
    # holds: past its key's share they are owed, not held, and the victim's one early reply
    # is still held for it.
    payload = b"x" * 1000
    for request_id in range(MAX_HELD + 50):
        replies.send(p.encode_reply(attacker_id, request_id, True, {}, payload), formats.NATIVE)
    replies.send(p.encode_reply(victim_id, 1, True, {}, payload), formats.NATIVE)
    victim = _dealer(context, server_public, pairs["victim"], victim_id)
    victim.connect(endpoint)
    announce(victim, victim_id)
    _pump(replies, time.monotonic() + 1.0)
    assert victim.poll(3000), "the victim's early reply was dropped"
    assert p.decode_reply(victim.recv_multipart()).ok

    # The victim stops reading while 200 replies of 64 KiB come: past its queue each is owed
    # as an error, and once it reads, every one is there, as itself or as that error.
    big = np.zeros(16_384, dtype=np.float32)
    for request_id in range(100, 300):
        replies.send(p.encode_reply(victim_id, request_id, True, {"dtype": "float32", "shape": [16_384]}, big.data))
    answers: dict[int, p.Reply] = {}
    deadline = time.monotonic() + 30
    while len(answers) < 200 and time.monotonic() < deadline:
        _pump(replies, time.monotonic() + 0.05)
        while victim.poll(0):
            reply = p.decode_reply(victim.recv_multipart())
            answers[reply.request_id] = reply
    victim.close(linger=0)
    assert set(answers) == set(range(100, 300)), f"{200 - len(answers)} replies vanished"
    dropped = [reply for reply in answers.values() if not reply.ok]
    assert dropped and all(reply.header["kind"] == p.DROPPED for reply in dropped)
