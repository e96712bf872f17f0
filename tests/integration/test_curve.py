"""A real server under CURVE: who may connect, who reads which replies, who may stop it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import zmq
from bert_serving.client import BertClient as OldClient
from bertserve.client import AuthenticationError, BertClient, ServerError, protocol as p
from bertserve.client.security import ROUTE_ID_BYTES, announce, keygen, load_public_key, load_secret_cert
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from faulty_model import SLOW_WORD, expected as faulty_expected, pythonpath_env, sentences, wait_for
from integration.test_faults import sink_pid

pytestmark = pytest.mark.timeout(240)

FAULTY = "faulty_model:FaultyModel"  # CURVE is plumbing: HashingModel's vectors, no TensorFlow
DIM = 16  # FaultyModel's vectors


@dataclass
class Keys:
    root: Path

    @property
    def server(self) -> Path:
        return self.root / "server.key"

    def secret(self, name: str) -> Path:
        for folder in (self.root / "clients", self.root / "outsiders"):
            if (folder / f"{name}.key_secret").exists():
                return folder / f"{name}.key_secret"
        raise FileNotFoundError(name)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    root = tmp_path_factory.mktemp("curve")
    keygen(root, "server")
    for name in ("alice", "bob", "ops"):
        keygen(root / "clients", name)
    keygen(root / "admins", "ops-admin")
    (root / "admins" / "ops-admin.key").unlink()
    (root / "admins" / "ops.key").write_bytes((root / "clients" / "ops.key").read_bytes())
    keygen(root / "outsiders", "mallory")
    return Keys(root)


HTTP_KEY = "curve-and-http-key"


@pytest.fixture(scope="module")
def http_port() -> int:
    """Chosen when the server starts, not when the module is imported (each pytest-xdist
    worker imports every module)."""
    return free_port()


@pytest.fixture(scope="module")
def server(keys: Keys, tiny_google: str, http_port: int) -> Iterator[RunningServer]:
    running = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        FAULTY,
        "--max-seq-len",
        "32",
        "--curve-dir",
        str(keys.root),
        "--max-latency-ms",
        "2",
        "--http-port",
        str(http_port),
        "--api-key",
        HTTP_KEY,
        env=pythonpath_env(),
    )
    yield running
    running.stop()


def test_the_http_front_end_reaches_a_curve_server(server: RunningServer, keys: Keys, http_port: int) -> None:
    # The front end connects with a key the server made for it; its callers need the API key.
    texts = ["through the front end", "and a second sentence"]
    with client(server, keys, "alice") as alice:
        expected = alice.encode(texts)
    url, auth = f"http://127.0.0.1:{http_port}/v1/embeddings", {"Authorization": f"Bearer {HTTP_KEY}"}
    assert httpx.post(url, json={"input": texts}, timeout=30).status_code == 401
    reply = httpx.post(url, json={"input": texts}, headers=auth, timeout=30)
    assert reply.status_code == 200, reply.text
    np.testing.assert_allclose(np.array([d["embedding"] for d in reply.json()["data"]]), expected, atol=1e-5)


def client(server: RunningServer, keys: Keys, name: str, **options) -> BertClient:
    return BertClient(
        port=server.port,
        port_out=server.port_out,
        timeout=options.pop("timeout", 20_000),
        server_key=str(keys.server),
        client_cert=str(keys.secret(name)),
        **options,
    )


def curve_socket(context: zmq.Context, kind: int, keys: Keys, name: str) -> zmq.Socket:
    socket = context.socket(kind)
    socket.linger = 0
    public, secret = load_secret_cert(keys.secret(name))
    socket.curve_serverkey = load_public_key(str(keys.server))
    socket.curve_publickey, socket.curve_secretkey = public, secret
    return socket


def test_an_authenticated_client_is_served(server: RunningServer, keys: Keys) -> None:
    with client(server, keys, "alice") as alice:
        assert alice.identity.startswith(load_public_key(str(keys.root / "clients" / "alice.key")) + b":")
        assert alice.encode(["hello over curve", "second"]).shape == (2, DIM)
        assert alice.server_config["curve"] is True


def test_an_unknown_key_and_a_plain_client_are_refused_clearly(server: RunningServer, keys: Keys) -> None:
    with pytest.raises(AuthenticationError):
        client(server, keys, "mallory", timeout=10_000)
    with pytest.raises(AuthenticationError, match="CURVE"):
        BertClient(port=server.port, port_out=server.port_out, timeout=10_000)


def test_bert_as_service_clients_are_refused(server: RunningServer) -> None:
    # Its own client (bert-serving-client 1.10) has no keys: the CURVE handshake fails, so
    # nothing it sends is read and it gets no answer. Its send blocks while no connection is
    # up, which its own timeout does not bound; a send timeout here makes that a TimeoutError
    # too, so the test cannot hang.
    old = OldClient(port=server.port, port_out=server.port_out, ignore_all_checks=True, timeout=1500)
    old.sender.setsockopt(zmq.SNDTIMEO, 1500)
    try:
        with pytest.raises(TimeoutError):
            old.encode(["no keys"])
        with pytest.raises(TimeoutError):
            old.server_config  # noqa: B018
    finally:
        old.close()


def reply_dealer(context: zmq.Context, keys: Keys, name: str, server: RunningServer, topic: bytes) -> zmq.Socket:
    """A connection to the CURVE reply port as a client makes it (a DEALER with a random
    routing id, under ``name``'s key) that announces ``topic``."""
    socket = curve_socket(context, zmq.DEALER, keys, name)
    socket.routing_id = b"\x01" + os.urandom(ROUTE_ID_BYTES - 1)  # a random id, as a client's
    socket.connect(f"tcp://127.0.0.1:{server.port_out}")
    announce(socket, topic)
    return socket


def replies_read(socket: zmq.Socket, wait_ms: int) -> list[p.Reply]:
    got = []
    while socket.poll(wait_ms):
        got.append(p.decode_reply(socket.recv_multipart()))
    return got


def test_another_key_reads_none_of_a_clients_replies(server: RunningServer, keys: Keys) -> None:
    """bob announces alice's identity and a prefix of it (refused: not his key's), and his own
    client's identity (allowed): he reads his own replies there, and none of alice's."""
    context = zmq.Context()
    try:
        with client(server, keys, "alice") as alice, client(server, keys, "bob") as bob:
            snoops = [
                reply_dealer(context, keys, "bob", server, topic) for topic in (alice.identity, alice.identity[:45])
            ]
            own = reply_dealer(context, keys, "bob", server, bob.identity)
            mine: list[p.Reply] = []
            for i in range(20):  # at least 5 rounds, and until bob's own route is through
                assert bob.encode([f"bob's own {i}"]).shape == (1, DIM)
                alice.encode([f"alice's secret number {i}"])
                mine += replies_read(own, 100)
                if i >= 4 and mine:
                    break
            for snoop in snoops:
                assert not replies_read(snoop, 500), "bob read a reply addressed to alice"
            mine += replies_read(own, 500)
            assert {reply.client_id for reply in mine} == {bob.identity}, "bob's own route got none of his replies"
    finally:
        context.destroy(linger=0)


def test_a_request_under_another_keys_identity_is_dropped(server: RunningServer, keys: Keys) -> None:
    context = zmq.Context()
    try:
        with client(server, keys, "alice") as alice:
            listener = reply_dealer(context, keys, "alice", server, alice.identity)
            alice.encode(["make sure alice is routed"])
            spoof = curve_socket(context, zmq.PUSH, keys, "bob")
            spoof.connect(f"tcp://127.0.0.1:{server.port}")
            spoof.send_multipart(p.encode_request(alice.identity, p.ENCODE, 999_999, {}, ["spoofed"]))
            got: list[p.Reply] = []
            for _ in range(10):  # until the listener's handshake and announcement are through
                alice.encode(["after the spoof"])
                got += replies_read(listener, 300)
                if got:
                    break
            got += replies_read(listener, 1000)
            assert got, "the listener under alice's key read none of her replies"
            assert all(reply.request_id != 999_999 for reply in got), (
                "a request sent under alice's id by bob was served"
            )
            assert alice.server_status["rejections"].get("spoofed", 0) >= 1
    finally:
        context.destroy(linger=0)


def test_another_key_cannot_cancel_a_clients_request(server: RunningServer, keys: Keys) -> None:
    """bob holds a valid key and knows alice's client id and request id: his CANCEL under
    her id is refused as spoofed, and her request is answered whole."""
    context = zmq.Context()
    try:
        with client(server, keys, "alice") as alice:
            texts = [f"alice's long request {i}" for i in range(3000)]
            texts[0] = f"{SLOW_WORD} {texts[0]}"  # in flight for a second at least, as a real model's would be
            request_id = alice.encode(texts, blocking=False)
            spoof = curve_socket(context, zmq.PUSH, keys, "bob")
            spoof.connect(f"tcp://127.0.0.1:{server.port}")
            before = alice.server_status["rejections"].get("spoofed", 0)
            spoof.send_multipart(p.encode_request(alice.identity, p.CANCEL, request_id, {}))
            result = next(alice.fetch())
            assert result.id == request_id and result.embedding.shape == (3000, DIM)
            status = alice.server_status
            assert status["rejections"].get("spoofed", 0) == before + 1 and status["requests_cancelled"] == 0
    finally:
        context.destroy(linger=0)


def test_only_an_admin_key_may_stop_the_server(keys: Keys, tiny_google: str) -> None:
    running = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        FAULTY,
        "--max-seq-len",
        "32",
        "--curve-dir",
        str(keys.root),
        env=pythonpath_env(),
    )
    try:
        with client(running, keys, "alice") as alice, pytest.raises(ServerError, match="admins") as refused:
            alice.terminate()
        assert refused.value.kind == "forbidden"
        with client(running, keys, "ops") as ops:
            assert ops.terminate() == {"stopping": True}
        assert running.process.wait(60) == 0
    finally:
        running.stop()


@pytest.mark.timeout(120)
def test_after_the_sink_is_killed_clients_and_the_http_front_end_hear_of_their_requests(
    keys: Keys, tiny_google: str
) -> None:
    """A restarted sink knows no route until a client announces again: clients waiting for a
    reply announce every second, so the in-flight requests' errors reach them (not a timeout)."""
    http_port = free_port()
    server = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        "faulty_model:FaultyModel",
        "--curve-dir",
        str(keys.root),
        "--heartbeat-timeout-ms",
        "60000",
        "--http-port",
        str(http_port),
        env=pythonpath_env(BERTSERVE_API_KEY=HTTP_KEY),
    )
    texts = sentences(5, seed=1)
    url, auth = f"http://127.0.0.1:{http_port}/v1/embeddings", {"Authorization": f"Bearer {HTTP_KEY}"}
    try:
        with client(server, keys, "alice", timeout=30_000) as alice:
            np.testing.assert_allclose(alice.encode(texts), faulty_expected(texts), atol=1e-6)
            with client(server, keys, "ops") as ops:  # pids are shown to admin keys only
                (worker,) = [w["pid"] for w in ops.server_status["workers"]]
            sink = sink_pid(server)
            assert sink is not None
            os.kill(worker, signal.SIGSTOP)  # holds the next requests in flight
            try:
                alice.encode(sentences(3, seed=2), blocking=False)
                with ThreadPoolExecutor(1) as pool:
                    http_reply = pool.submit(httpx.post, url, json={"input": ["held"]}, headers=auth, timeout=60)
                    wait_for(lambda: alice.server_status["requests_pending"] >= 2, 10, "both requests in flight")
                    started = time.monotonic()
                    psutil.Process(sink).kill()
                    with pytest.raises(ServerError) as caught:
                        alice.fetch_all()
                    status = http_reply.result().status_code
                    took = time.monotonic() - started
            finally:
                os.kill(worker, signal.SIGCONT)
            assert caught.value.kind == "internal", caught.value
            assert status >= 500 and took < 20, (status, took)
            wait_for(lambda: sink_pid(server) not in (None, sink), 20, "a new sink")
            np.testing.assert_allclose(alice.encode(texts), faulty_expected(texts), atol=1e-6)
            assert httpx.post(url, json={"input": texts}, headers=auth, timeout=30).status_code == 200
    finally:
        server.stop()
