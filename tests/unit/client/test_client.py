"""The client on its own: validation, the wire protocol, timeouts without a server, and the
client's behaviour against a minimal responder that speaks ``client/protocol.py``.

The responder is the protocol, not the server: one thread with a PULL and a PUB socket that
answers CONFIG/STATUS/TERMINATE and "encodes" texts as ``[words, row, request id, 0]``.
Texts containing "slow" are answered after 0.6 s, texts containing "boom" with an error,
"busy" with a refusal of kind "busy". With ``curve_dir`` both sockets are CURVE servers
behind pyzmq's authenticator, allowing the keys in ``curve_dir/clients``, and replies go
out on a ROUTER to the connections that announced a prefix of their client id, as a CURVE
server routes them.
The real server is tested end to end in ``tests/integration``.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import io
import itertools
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bertserve.client
import numpy as np
import pytest
import zmq
import zmq.auth
from bertserve.client import (
    AsyncBertClient,
    AuthenticationError,
    BertClient,
    BertClientError,
    ClientClosedError,
    ConcurrentBertClient,
    ConcurrentUseError,
    ProtocolVersionError,
    ServerBusyError,
    ServerError,
    ServerTimeoutError,
    __version__,
    protocol as p,
)
from bertserve.client.cli import add_client_commands
from bertserve.client.protocol import check_texts
from bertserve.client.security import keygen, load_public_key
from bertserve.server.testing.launcher import free_ports
from zmq.auth.thread import ThreadAuthenticator

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.usefixtures("no_leaked_contexts"),
]  # every test here talks to sockets and could hang

SLOW_S = 0.6


class Responder:
    """A one-thread bertserve stand-in on random ports; see the module docstring."""

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        drop_configs: int = 0,
        reject: str = "",
        curve_dir: Path | None = None,
        adjacent: bool = False,
    ) -> None:
        self.config = {"server_version": __version__, "protocol": p.PROTOCOL_VERSION, "output_dim": 4}
        self.config.update(config or {})
        self.drop_configs = drop_configs
        self.reject = reject  # answer every request with this error, of kind "protocol"
        self.requests: list[p.Request] = []
        self.user_ids: list[str | None] = []  # the User-Id of each request, under CURVE
        self._context = zmq.Context()
        self._authenticator: ThreadAuthenticator | None = None
        self._pull = self._context.socket(zmq.PULL)
        self._pub = self._context.socket(zmq.PUB if curve_dir is None else zmq.ROUTER)
        self._routes: dict[bytes, bytes] = {}  # under CURVE: routing id -> announced topic
        for sock in (self._pull, self._pub):
            sock.setsockopt(zmq.LINGER, 0)
        if curve_dir is not None:
            self._authenticator = ThreadAuthenticator(self._context)
            self._authenticator.start()
            self._authenticator.configure_curve(domain="*", location=str(curve_dir / "clients"))
            public, secret = zmq.auth.load_certificate(curve_dir / "server.key_secret")
            for sock in (self._pull, self._pub):
                sock.curve_publickey, sock.curve_secretkey = public, secret
                sock.curve_server = True
        if adjacent:  # replies on port + 1, where clients look by default
            self.port, self.port_out = self._bind_adjacent()
        else:
            self.port = self._pull.bind_to_random_port("tcp://127.0.0.1")
            self.port_out = self._pub.bind_to_random_port("tcp://127.0.0.1")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def client(self, **kwargs: Any) -> BertClient:
        return BertClient("127.0.0.1", self.port, self.port_out, timeout=kwargs.pop("timeout", 5000), **kwargs)

    def _bind_adjacent(self) -> tuple[int, int]:
        for _ in range(50):
            port = self._pull.bind_to_random_port("tcp://127.0.0.1", max_port=65534)
            try:
                self._pub.bind(f"tcp://127.0.0.1:{port + 1}")
            except zmq.ZMQError:
                self._pull.unbind(f"tcp://127.0.0.1:{port}")
                continue
            return port, port + 1
        raise AssertionError("no two adjacent free ports")

    def commands(self, command: bytes) -> list[p.Request]:
        return [r for r in list(self.requests) if r.command == command]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        scheduled: list[tuple[float, int, list[Any]]] = []
        order = itertools.count()
        try:
            while not self._stop.is_set():
                if self._pull.poll(10):
                    frames = self._pull.recv_multipart(copy=False)
                    request = p.decode_request([frame.bytes for frame in frames])
                    self.user_ids.append(frames[0].get("User-Id") if self._authenticator else None)
                    self.requests.append(request)
                    delay, reply = self._answer(request)
                    if reply is not None:
                        heapq.heappush(scheduled, (time.monotonic() + delay, next(order), reply))
                while self._authenticator is not None and self._pub.poll(0):
                    route, command, topic = self._pub.recv_multipart()
                    assert command == p.ANNOUNCE
                    self._routes[route] = topic
                while scheduled and scheduled[0][0] <= time.monotonic():
                    self._reply(heapq.heappop(scheduled)[2])
        finally:
            self._pull.close()
            self._pub.close()
            if self._authenticator is not None:
                self._authenticator.stop()
            self._context.term()

    def _reply(self, frames: list[Any]) -> None:
        if self._authenticator is None:
            self._pub.send_multipart(frames)
            return
        for route, topic in self._routes.items():
            if bytes(frames[0]).startswith(topic):
                self._pub.send_multipart([route, *frames])

    def _answer(self, request: p.Request) -> tuple[float, list[Any] | None]:
        cid, rid = request.client_id, request.request_id
        if self.reject:
            return 0, p.error_reply(cid, rid, self.reject, kind="protocol")
        if request.command == p.CONFIG:
            if self.drop_configs > 0:  # as if the subscription had not reached the PUB yet
                self.drop_configs -= 1
                return 0, None
            return 0, p.encode_reply(cid, rid, True, self.config)
        if request.command == p.STATUS:
            return 0, p.encode_reply(cid, rid, True, {"requests": len(self.requests)})
        if request.command == p.TERMINATE:
            return 0, p.encode_reply(cid, rid, True, {"stopping": True})
        words = [t if isinstance(t, list) else t.split() for t in request.texts]
        joined = " ".join(" ".join(w) for w in words)
        if "boom" in joined:
            return 0, p.error_reply(cid, rid, "cannot encode boom", kind="input")
        if "busy" in joined:
            return 0, p.error_reply(cid, rid, "the server is busy: 100 requests queued", kind="busy")
        vectors = np.array([[len(w), i, rid, 0] for i, w in enumerate(words)], np.float32).reshape(-1, 4)
        header = p.array_header(vectors)
        if request.header.get("show_tokens"):
            header["tokens"] = words
        return (SLOW_S if "slow" in joined else 0), p.encode_reply(cid, rid, True, header, vectors.tobytes())


@pytest.fixture
def responder() -> Iterator[Callable[..., Responder]]:
    started: list[Responder] = []

    def start(**kwargs: Any) -> Responder:
        started.append(Responder(**kwargs))
        return started[-1]

    yield start
    for r in started:
        r.stop()


# -- without a server ------------------------------------------------------------------


def test_no_server_times_out_within_the_timeout() -> None:
    port, port_out = free_ports(2)
    started = time.monotonic()
    with pytest.raises(ServerTimeoutError, match=rf"127\.0\.0\.1:{port}.*500 ms") as info:
        BertClient("127.0.0.1", port, port_out, timeout=500)
    elapsed = time.monotonic() - started
    assert 0.45 < elapsed < 3
    assert info.value.timeout_ms == 500
    assert isinstance(info.value, TimeoutError)


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        (None, TypeError),
        ("60", TypeError),
        (True, TypeError),
    ],
)
def test_bad_timeouts_are_rejected(timeout: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="timeout"):
        BertClient(timeout=timeout)
    with pytest.raises(error, match="timeout"):
        ConcurrentBertClient(timeout=timeout)


@pytest.mark.parametrize("identity", [b"", b"x" * 65])
def test_bad_identities_are_rejected(identity: bytes) -> None:
    with pytest.raises(ValueError, match="identity must be 1 to 64 bytes"):
        BertClient(identity=identity)


@pytest.mark.parametrize(
    ("texts", "is_tokenized", "error", "message"),
    [
        ("one string", False, TypeError, "texts must be a list of strings, not str"),
        (None, False, TypeError, "not NoneType"),
        (["a", "b", 3], False, ValueError, r"texts\[2\] must be a string, not int"),
        ([" \t"], False, ValueError, r"texts\[0\] is empty"),
        (["ok", "left ||| "], False, ValueError, r"texts\[1\] is a sentence pair with an empty side"),
        (["not tokens"], True, ValueError, r"texts\[0\] must be a list of tokens, not str"),
        ([["a"], []], True, ValueError, r"texts\[1\] is an empty token list"),
        ([["a", ""]], True, ValueError, r"texts\[0\]\[1\] must be a non-empty string token"),
    ],
)
def test_bad_input_is_named(texts: Any, is_tokenized: bool, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        check_texts(texts, is_tokenized)


def test_good_input_passes() -> None:
    assert check_texts(("a b", "c ||| d")) == ["a b", "c ||| d"]
    assert check_texts([["a", "b"]], is_tokenized=True) == [["a", "b"]]
    assert check_texts([]) == []


def test_pool_without_a_server_times_out() -> None:
    port, port_out = free_ports(2)
    with ConcurrentBertClient(host="127.0.0.1", port=port, port_out=port_out, timeout=300) as pool:
        with pytest.raises(ServerTimeoutError):
            pool.encode(["hello"])
        with pytest.raises(ValueError, match="is empty"):
            pool.encode([""])
        assert pool._created == 0  # the failed client was not kept
    pool.close()
    with pytest.raises(ClientClosedError):
        pool.encode(["hello"])


def test_pool_options_are_checked_up_front() -> None:
    with pytest.raises(TypeError):
        ConcurrentBertClient(prot=5555)
    with pytest.raises(ValueError, match="max_concurrency"):
        ConcurrentBertClient(max_concurrency=0)


def test_public_names_and_hierarchy() -> None:
    for name in bertserve.client.__all__:
        assert getattr(bertserve.client, name) is not None
    assert issubclass(ServerTimeoutError, (BertClientError, TimeoutError))
    assert issubclass(ConcurrentUseError, RuntimeError)
    for error in (ServerError, ClientClosedError, ProtocolVersionError, AuthenticationError):
        assert issubclass(error, BertClientError)
    assert issubclass(ServerBusyError, ServerError)


# -- the wire protocol -----------------------------------------------------------------


def test_request_round_trip() -> None:
    frames = p.encode_request(b"me", p.ENCODE, 7, {"show_tokens": True}, ["a b", "c"])
    request = p.decode_request(frames)
    assert (request.client_id, request.command, request.request_id) == (b"me", p.ENCODE, 7)
    assert request.texts == ["a b", "c"] and request.header["show_tokens"] is True
    assert request.header["protocol"] == p.PROTOCOL_VERSION and request.key == b"me".hex() + "#7"
    with pytest.raises(p.ProtocolError, match="5 frames"):
        p.decode_request(frames[:4])
    with pytest.raises(p.ProtocolError, match="not supported"):
        p.decode_request([*frames[:3], p.dumps({"protocol": 99}), frames[4]])


def test_reply_round_trip() -> None:
    vectors = np.arange(6, dtype=np.float16).reshape(2, 3)
    reply = p.decode_reply(p.encode_reply(b"me", 3, True, p.array_header(vectors), vectors.tobytes()))
    assert (reply.client_id, reply.request_id, reply.ok) == (b"me", 3, True)
    np.testing.assert_array_equal(reply.array(), vectors)
    error = p.decode_reply(p.error_reply(b"me", 4, "no", kind="input"))
    assert not error.ok and error.header == {"error": "no", "kind": "input"}
    with pytest.raises(p.ProtocolError, match="4 or 5 frames"):
        p.decode_reply([b"me", b"1"])


@pytest.mark.parametrize(
    ("header", "size", "message"),
    [
        ({"dtype": "float32", "shape": [2, 3]}, 20, "holds 20 bytes, the header implies 24"),
        ({"dtype": "object", "shape": [1]}, 8, "unsupported array dtype"),
        ({"dtype": "float32", "shape": [-1]}, 4, "bad array shape"),
    ],
)
def test_array_from_buffer_checks_the_header(header: dict[str, Any], size: int, message: str) -> None:
    with pytest.raises(p.ProtocolError, match=message):
        p.array_from_buffer(header, bytes(size))


# -- against the responder -------------------------------------------------------------


def test_encode(responder: Callable[..., Responder]) -> None:
    r = responder()
    with r.client() as bc:
        vectors = bc.encode(["one", "two words", "three more words"])
        assert vectors.shape == (3, 4) and vectors.dtype == np.float32
        assert vectors.flags.owndata and vectors.flags.writeable
        np.testing.assert_array_equal(vectors[:, :2], [[1, 0], [2, 1], [3, 2]])
        tokenized, tokens = bc.encode([["a", "b"]], is_tokenized=True, show_tokens=True)
        assert tokens == [["a", "b"]] and tokenized[0, 0] == 2
        encodes = r.commands(p.ENCODE)
        assert [q.header["is_tokenized"] for q in encodes] == [False, True]
        assert encodes[0].header["client_version"] == __version__
    with r.client(output_fmt="list") as bc:
        rows = bc.encode(["a"])
        assert isinstance(rows, list) and rows[0][:2] == [1.0, 0.0]


def test_handshake_resends_until_answered(responder: Callable[..., Responder]) -> None:
    r = responder(drop_configs=2)
    with r.client() as bc:
        assert bc.server_config["output_dim"] == 4
    assert len(r.commands(p.CONFIG)) >= 4  # two lost, one answered, one for server_config


def test_control_commands(responder: Callable[..., Responder]) -> None:
    r = responder()
    with r.client() as bc:
        assert "requests" in bc.server_status
        assert bc.terminate() == {"stopping": True}


def test_server_error(responder: Callable[..., Responder]) -> None:
    r = responder()
    with r.client() as bc:
        with pytest.raises(ServerError, match="cannot encode boom") as info:
            bc.encode(["fine", "boom"])
        assert info.value.kind == "input"
        assert bc.encode(["still works"]).shape == (1, 4)


def test_late_reply_is_dropped(responder: Callable[..., Responder]) -> None:
    r = responder()
    with r.client(timeout=300) as bc:
        with pytest.raises(ServerTimeoutError, match="request"):
            bc.encode(["slow one"])
        time.sleep(SLOW_S)  # the late reply is now queued ahead of the next one
        vectors = bc.encode(["fast"])
        assert vectors[0, 2] == r.commands(p.ENCODE)[-1].request_id


def test_empty_input_needs_no_round_trip(responder: Callable[..., Responder]) -> None:
    r = responder()
    with r.client() as bc:
        assert bc.encode([]).shape == (0, 4)
    assert not r.commands(p.ENCODE)


def test_long_texts_warn_once(responder: Callable[..., Responder]) -> None:
    r = responder(config={"max_seq_len": 3, "max_batch_size": 1})
    texts = ["short", "one two three four five", "six seven eight nine ten"]
    with r.client() as bc:
        for show_progress in (False, True):
            with pytest.warns(UserWarning, match=r"texts\[1\] has 5 words") as record:
                bc.encode(texts * 2, show_progress=show_progress)
            assert len(record) == 1 and record[0].filename == __file__
        with pytest.warns(UserWarning, match=r"texts\[1\] has 5 words") as record:
            list(bc.encode_async([texts[:1], texts, texts]))
        assert len(record) == 1 and record[0].filename == __file__


def test_version_checks(responder: Callable[..., Responder]) -> None:
    with pytest.warns(UserWarning, match="runs bertserve 9.9"):
        responder(config={"server_version": "9.9"}).client().close()
    with pytest.raises(ProtocolVersionError, match="speaks protocol 99"):
        responder(config={"protocol": 99}).client()
    responder(config={"protocol": 99, "server_version": "9.9"}).client(check_version=False).close()
    with pytest.raises(ProtocolVersionError, match=r"does not speak protocol 1.*this server speaks 2"):
        responder(reject="protocol version 1 is not supported; this server speaks 2").client()


def test_closed_client(responder: Callable[..., Responder]) -> None:
    bc = responder().client()
    bc.close()
    bc.close()
    assert bc.closed
    for use in (lambda: bc.encode(["a"]), lambda: bc.server_status, lambda: list(bc.fetch())):
        with pytest.raises(ClientClosedError):
            use()


def test_concurrent_use_fails_loudly(responder: Callable[..., Responder]) -> None:
    r = responder()
    results: list[Any] = []
    with r.client() as bc:
        worker = threading.Thread(target=lambda: results.append(bc.encode(["slow"])))
        worker.start()
        while not r.commands(p.ENCODE):
            time.sleep(0.01)
        with pytest.raises(ConcurrentUseError, match="ConcurrentBertClient"):
            bc.encode(["other thread"])
        worker.join(10)
    assert results[0].shape == (1, 4)


def test_non_blocking_requests(responder: Callable[..., Responder]) -> None:
    r = responder()
    with r.client() as bc:
        ids = [bc.encode(texts, blocking=False) for texts in (["slow a"], ["b"], ["c c", "d"])]
        assert bc.encode(["blocking in between"]).shape == (1, 4)
        arrays = bc.fetch_all(sort=True)
        assert [a[0, 2] for a in arrays] == ids
        assert [len(a) for a in arrays] == [1, 1, 2]
        assert bc.fetch_all() == []

        ids = [bc.encode(texts, blocking=False, show_tokens=True) for texts in (["slow x"], ["y"])]
        results = list(bc.fetch())
        assert [result.id for result in results] == ids[::-1]  # in order of arrival
        assert results[0].tokens == [["y"]]
        bc.encode(["e"], blocking=False)
        bc.encode(["f g", "h"], blocking=False)
        assert bc.fetch_all(concat=True).shape == (3, 4)


def test_encode_async_keeps_order_and_stops(responder: Callable[..., Responder]) -> None:
    r = responder()
    pulled: list[int] = []

    def batches() -> Iterator[list[str]]:
        for n in range(8):
            pulled.append(n)
            yield ["slow"] * 2 if n == 1 else ["w " * (n + 1)]

    with r.client() as bc:
        arrays = list(bc.encode_async(batches(), max_num_batch=5))
        assert [a[0, 0] for a in arrays] == [1, 1, 3, 4, 5]
        assert pulled == [0, 1, 2, 3, 4]
        with pytest.raises(ValueError, match=r"batch 1: texts\[0\] is empty"):
            list(bc.encode_async(iter([["a"], [""]])))
        assert bc.encode(["afterwards"]).shape == (1, 4)


def test_progress_keeps_order_and_raises_what_one_request_raises(
    responder: Callable[..., Responder], capsys: pytest.CaptureFixture[str]
) -> None:
    r = responder(config={"max_batch_size": 2})  # chunks of 8 texts
    texts = [" ".join(["w"] * (1 + i % 5)) for i in range(40)]
    with r.client() as bc:
        vectors = bc.encode(texts, show_progress=True)
        np.testing.assert_array_equal(vectors[:, 0], [1 + i % 5 for i in range(40)])
        np.testing.assert_array_equal(vectors[:, 1], [i % 8 for i in range(40)])  # row within its chunk
        assert len(r.commands(p.ENCODE)) == 5 and "40/40" in capsys.readouterr().err

        for word, error in (("boom", ServerError), ("busy", ServerBusyError)):
            bad = [*texts[:29], word, *texts[30:]]
            with pytest.raises(error) as whole:
                bc.encode(bad)
            with pytest.raises(error) as piped:
                bc.encode(bad, show_progress=True)
            assert (piped.value.kind, piped.value.message) == (whole.value.kind, whole.value.message)
            assert not bc._connection.transport.pending and bc.encode(texts[:3]).shape == (3, 4)
        with pytest.raises(ValueError, match="show_progress needs blocking=True"):
            bc.encode(texts, blocking=False, show_progress=True)

    with r.client(timeout=300) as bc:  # the fourth chunk is answered after 0.6 s
        started = time.monotonic()
        with pytest.raises(ServerTimeoutError):
            bc.encode([*texts[:29], "slow", *texts[30:]], show_progress=True)
        assert time.monotonic() - started < 1.5
    capsys.readouterr()


def test_per_token_answers_are_joined_as_the_server_joins_them() -> None:
    from bertserve.client.core.chunking import join

    first, second = np.ones((2, 3, 4), np.float16), np.full((1, 5, 4), 2, np.float16)
    joined = join([first, second])
    assert joined.shape == (3, 5, 4) and joined.dtype == np.float16
    assert (joined[:2, 3:] == 0).all() and (joined[:2, :3] == 1).all() and (joined[2] == 2).all()


def test_pool_shares_a_server_between_threads(responder: Callable[..., Responder]) -> None:
    r = responder()
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(5):
                texts = ["w " * (n + i + 1)]
                assert pool.encode(texts)[0, 0] == n + i + 1
        except BaseException as exc:
            errors.append(exc)

    with ConcurrentBertClient(max_concurrency=3, host="127.0.0.1", port=r.port, port_out=r.port_out) as pool:
        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert not errors
        assert pool._created <= 3
        assert pool.server_config["output_dim"] == 4 and "requests" in pool.server_status
    pool.close()


def test_pool_waits_for_a_client_then_times_out(responder: Callable[..., Responder]) -> None:
    r = responder()
    options = {"host": "127.0.0.1", "port": r.port, "port_out": r.port_out}
    with ConcurrentBertClient(max_concurrency=1, timeout=2000, **options) as pool:
        threads = [threading.Thread(target=pool.encode, args=(["slow"],)) for _ in range(2)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert time.monotonic() - started >= 2 * SLOW_S - 0.1  # the second waited, then succeeded
        assert len(r.commands(p.ENCODE)) == 2
    busy = pytest.raises(ServerTimeoutError, match="stayed busy for 300 ms")
    with ConcurrentBertClient(max_concurrency=1, timeout=300, **options) as pool, pool._client(), busy:
        pool.encode(["a"])


def test_pool_replaces_a_client_that_timed_out(responder: Callable[..., Responder]) -> None:
    r = responder()
    options = {"host": "127.0.0.1", "port": r.port, "port_out": r.port_out}
    with ConcurrentBertClient(max_concurrency=1, timeout=300, **options) as pool:
        with pytest.raises(ServerTimeoutError):
            pool.encode(["slow"])
        pool.encode(["fast"])
    first, second = r.commands(p.ENCODE)
    assert first.client_id != second.client_id


def test_busy_server(responder: Callable[..., Responder]) -> None:
    r = responder()
    with r.client() as bc:
        with pytest.raises(ServerBusyError, match="100 requests queued") as info:
            bc.encode(["busy now"])
        assert info.value.kind == "busy" and isinstance(info.value, ServerError)
        assert bc.encode(["fine"]).shape == (1, 4)
    with ConcurrentBertClient(max_concurrency=1, host="127.0.0.1", port=r.port, port_out=r.port_out) as pool:
        with pytest.raises(ServerBusyError):
            pool.encode(["busy"])
        pool.encode(["fine"])
    first, second = r.commands(p.ENCODE)[-2:]
    assert first.client_id == second.client_id  # a refusal does not cost the pooled client


# -- AsyncBertClient ---------------------------------------------------------------------


def async_client(r: Responder, **kwargs: Any) -> AsyncBertClient:
    return AsyncBertClient("127.0.0.1", r.port, r.port_out, timeout=kwargs.pop("timeout", 5000), **kwargs)


def test_async_encode_answers_as_bert_client_does(responder: Callable[..., Responder]) -> None:
    r = responder(drop_configs=2)
    with r.client() as bc:
        want = bc.encode(["one", "two words"])

    async def main() -> None:
        async with async_client(r) as client:
            vectors = await client.encode(["one", "two words"])
            np.testing.assert_array_equal(vectors[:, :2], want[:, :2])
            assert vectors.flags.owndata and vectors.flags.writeable
            tokenized, tokens = await client.encode([["a", "b"]], is_tokenized=True, show_tokens=True)
            assert tokens == [["a", "b"]] and tokenized[0, 0] == 2
            assert (await client.encode([])).shape == (0, 4)
            assert (await client.server_config())["output_dim"] == 4
            assert "requests" in await client.server_status()
            assert await client.terminate() == {"stopping": True}
            with pytest.raises(ServerError, match="cannot encode boom") as info:
                await client.encode(["fine", "boom"])
            assert info.value.kind == "input"
        async with async_client(r, output_fmt="list") as client:
            rows = await client.encode(["a"])
            assert isinstance(rows, list) and rows[0][:2] == [1.0, 0.0]

    asyncio.run(main())
    assert r.commands(p.ENCODE)[-1].header["client_version"] == __version__


def test_async_calls_in_flight_at_once_each_get_their_own_answer(responder: Callable[..., Responder]) -> None:
    r = responder()

    async def main() -> list[Any]:
        async with async_client(r) as client:
            # the slow ones are answered last: replies come out of order
            return await asyncio.gather(*(client.encode(["slow " * (i % 3 == 0) + "w " * i]) for i in range(1, 60)))

    answers = asyncio.run(main())
    ids = {request.request_id: len(request.texts[0].split()) for request in r.commands(p.ENCODE)}
    for i, vectors in enumerate(answers, start=1):
        assert vectors[0, 0] == ids[int(vectors[0, 2])] == i + (i % 3 == 0)  # its own words, its own request


def test_async_without_a_server_times_out_and_tries_again_on_the_next_call() -> None:
    port, port_out = free_ports(2)

    async def main() -> None:
        client = AsyncBertClient("127.0.0.1", port, port_out, timeout=400)
        for attempt in range(2):
            started = time.monotonic()
            with pytest.raises(ServerTimeoutError, match=rf"127\.0\.0\.1:{port}.*400 ms") as info:
                await (client.connect() if attempt == 0 else client.encode(["hello"]))
            assert 0.35 < time.monotonic() - started < 2 and info.value.timeout_ms == 400
            assert not client.closed and client._connection.transport is None  # nothing left open
        await client.aclose()

    asyncio.run(main())


def test_async_options_are_checked_before_any_socket_opens() -> None:
    with pytest.raises(ValueError, match="timeout"):
        AsyncBertClient(timeout=0)
    with pytest.raises(ValueError, match="output_fmt"):
        AsyncBertClient(output_fmt="json")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="identity must be 1 to 64 bytes"):
        AsyncBertClient(identity=b"")
    with pytest.raises(TypeError, match="port must be an int"):
        AsyncBertClient(port="5555")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="host"):
        AsyncBertClient(host="")


def test_async_timeout_cancellation_and_late_replies(responder: Callable[..., Responder]) -> None:
    r = responder()

    async def main() -> None:
        async with async_client(r, timeout=300) as client:
            started = time.monotonic()
            with pytest.raises(ServerTimeoutError, match="within 300 ms"):
                await client.encode(["slow one"])
            assert time.monotonic() - started < 0.6
            call = asyncio.create_task(client.encode(["slow two"]))
            await asyncio.sleep(0.05)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(client.encode(["slow three"]), 0.05)
            await asyncio.sleep(SLOW_S + 0.2)  # the late replies come, and are dropped
            assert client._connection.transport is not None and client._connection.transport.in_flight == 0
            vectors = await client.encode(["fast"])
            assert vectors[0, 2] == r.commands(p.ENCODE)[-1].request_id

    asyncio.run(main())
    encodes, cancels = r.commands(p.ENCODE), r.commands(p.CANCEL)
    assert [c.request_id for c in cancels] == [e.request_id for e in encodes[:3]]  # one for each abandoned call
    assert cancels[0].client_id == encodes[0].client_id and not cancels[0].texts


def test_async_busy_and_progress_errors_name_the_text(
    responder: Callable[..., Responder], capsys: pytest.CaptureFixture[str]
) -> None:
    r = responder(config={"max_batch_size": 2})  # chunks of 8 texts
    texts = [" ".join(["w"] * (1 + i % 5)) for i in range(40)]
    bad = [*texts[:29], "boom", *texts[30:]]
    with r.client() as bc, pytest.raises(ServerError) as whole:
        bc.encode(bad)

    async def main() -> None:
        async with async_client(r) as client:
            with pytest.raises(ServerBusyError, match="100 requests queued") as busy:
                await client.encode(["busy now"])
            assert busy.value.kind == "busy"
            vectors = await client.encode(texts, show_progress=True)
            np.testing.assert_array_equal(vectors[:, 0], [1 + i % 5 for i in range(40)])
            np.testing.assert_array_equal(vectors[:, 1], [i % 8 for i in range(40)])
            assert "40/40" in capsys.readouterr().err
            with pytest.raises(ServerError) as piped:
                await client.encode(bad, show_progress=True)
            assert (piped.value.kind, piped.value.message) == (whole.value.kind, whole.value.message)
            assert client._connection.transport is not None and client._connection.transport.in_flight == 0

    asyncio.run(main())
    capsys.readouterr()


def test_async_warnings_point_at_the_caller(responder: Callable[..., Responder]) -> None:
    r = responder(config={"max_seq_len": 3, "server_version": "9.9"})

    async def main() -> None:
        client = async_client(r)
        with pytest.warns(UserWarning, match="runs bertserve 9.9") as record:
            await client.connect()
        assert record[0].filename == __file__
        with pytest.warns(UserWarning, match=r"texts\[1\] has 5 words") as record:
            await client.encode(["short", "one two three four five"])
        assert len(record) == 1 and record[0].filename == __file__
        await client.aclose()
        with pytest.raises(ProtocolVersionError, match="speaks protocol 99"):
            await async_client(responder(config={"protocol": 99})).connect()

    asyncio.run(main())


def test_async_sends_wait_on_the_loop_while_the_queue_is_full(responder: Callable[..., Responder]) -> None:
    """The server goes away: requests queue in the client up to ZeroMQ's high-water mark (1,000),
    and the calls past it wait for room without holding the loop, until their timeout."""
    r = responder()

    async def main() -> tuple[list[Any], int, float]:
        async with async_client(r, timeout=500) as client:
            r.stop()
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            ticking = asyncio.create_task(ticker())
            started = time.monotonic()
            results = await asyncio.gather(*(client.encode([f"w {i}"]) for i in range(1100)), return_exceptions=True)
            elapsed = time.monotonic() - started
            ticking.cancel()
            return results, ticks, elapsed

    results, ticks, elapsed = asyncio.run(main())
    assert all(isinstance(result, ServerTimeoutError) for result in results), {type(x) for x in results}
    assert any("the send queue stayed full" in str(result) for result in results)
    assert elapsed < 2.5 and ticks >= 10  # the ticker ran all along the wait


def test_async_close_fails_the_calls_in_flight(responder: Callable[..., Responder]) -> None:
    r = responder()

    async def main() -> None:
        client = async_client(r)
        calls = [asyncio.create_task(client.encode([f"slow {i}"])) for i in range(5)]
        while len(r.commands(p.ENCODE)) < 5:  # connected, and all five sent
            await asyncio.sleep(0.01)
        assert repr(client).endswith("open>")
        await client.aclose()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(result, ClientClosedError) for result in results), results
        assert client.closed and repr(client).endswith("closed>")
        for use in (client.encode(["a"]), client.server_status(), client.connect()):
            with pytest.raises(ClientClosedError):
                await use
        client.close()  # again: harmless
        await client.aclose()

    asyncio.run(main())


def test_an_async_client_belongs_to_its_loop(responder: Callable[..., Responder]) -> None:
    r = responder()
    client = async_client(r)
    asyncio.run(client.connect())
    try:
        with pytest.raises(BertClientError, match="belongs to the event loop it connected on"):
            asyncio.run(client.encode(["elsewhere"]))
    finally:
        client.close()  # its loop has ended: closing still releases the sockets


# -- CURVE -------------------------------------------------------------------------------


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """``curve/`` (server pair, ``clients/alice.key``) and ``own/`` (alice's and mallory's pairs)."""
    keygen(tmp_path / "curve", "server")
    keygen(tmp_path / "own", "alice")
    keygen(tmp_path / "own", "mallory")
    (tmp_path / "curve" / "clients").mkdir()
    (tmp_path / "curve" / "clients" / "alice.key").write_bytes((tmp_path / "own" / "alice.key").read_bytes())
    return tmp_path


def curve_options(keys: Path, name: str = "alice") -> dict[str, Any]:
    return {"server_key": keys / "curve" / "server.key", "client_cert": keys / "own" / f"{name}.key_secret"}


def test_curve_options_come_in_pairs(keys: Path) -> None:
    options = curve_options(keys)
    with pytest.raises(ValueError, match="server_key was given without client_cert"):
        BertClient(server_key=options["server_key"])
    with pytest.raises(ValueError, match="client_cert was given without server_key"):
        BertClient(client_cert=options["client_cert"])
    with pytest.raises(ValueError, match="holds no secret key"):
        BertClient(server_key=options["server_key"], client_cert=keys / "own" / "alice.key")
    with pytest.raises(ValueError, match="neither a certificate file"):
        BertClient(server_key="not a key", client_cert=options["client_cert"])
    with pytest.raises(ValueError, match="may have at most 23 bytes"):
        BertClient(identity="x" * 24, **options)
    with pytest.raises(TypeError):
        ConcurrentBertClient(server_kye="x")


def test_curve_identity_is_the_key_and_a_suffix(
    responder: Callable[..., Responder], keys: Path, tmp_path: Path
) -> None:
    r = responder(curve_dir=keys / "curve")
    alice = load_public_key(keys / "own" / "alice.key")
    with r.client(**curve_options(keys), identity="x" * 23) as bc:
        assert bc.identity == alice + b":" + b"x" * 23 and len(bc.identity) == 64
        assert bc.encode(["hello world"])[0, 0] == 2
    server_key = load_public_key(keys / "curve" / "server.key").decode()  # the z85 text does as well
    with r.client(server_key=server_key, client_cert=str(keys / "own" / "alice.key_secret")) as bc:
        suffix = bc.identity.removeprefix(alice + b":")
        assert len(suffix) == 16 and int(suffix, 16) >= 0
        bc.encode(["again"])
    assert all(request.client_id.startswith(alice + b":") for request in r.requests)
    assert set(r.user_ids) == {alice.decode()}  # every request came authenticated as alice
    with ConcurrentBertClient(
        max_concurrency=2, host="127.0.0.1", port=r.port, port_out=r.port_out, **curve_options(keys)
    ) as pool:
        assert pool.encode(["pooled"]).shape == (1, 4)


def check_refused(make: Callable[[], BertClient], match: str) -> AuthenticationError:
    started = time.monotonic()
    with pytest.raises(AuthenticationError, match=match) as info:
        make()
    assert time.monotonic() - started < 3  # at once, not after the 10 s timeout
    return info.value


def test_a_key_the_server_does_not_list_is_refused(responder: Callable[..., Responder], keys: Path) -> None:
    r = responder(curve_dir=keys / "curve")
    mallory = load_public_key(keys / "own" / "mallory.key").decode()
    error = check_refused(
        lambda: r.client(timeout=10_000, **curve_options(keys, "mallory")),
        rf"refused this client's key {re.escape(mallory)}.*clients/ directory",
    )
    assert error.address is not None and error.address.startswith("tcp://127.0.0.1:")
    assert not r.requests


def test_curve_mismatches_are_named(responder: Callable[..., Responder], keys: Path) -> None:
    secure, plain = responder(curve_dir=keys / "curve"), responder()
    check_refused(lambda: secure.client(timeout=10_000), "requires CURVE: pass server_key and client_cert")
    check_refused(lambda: plain.client(timeout=10_000, **curve_options(keys)), "does not use CURVE")
    wrong_server = {**curve_options(keys), "server_key": keys / "own" / "mallory.key"}
    check_refused(lambda: secure.client(timeout=10_000, **wrong_server), "server_key is probably not")


def test_a_refusal_after_connecting_is_reported_at_the_timeout(responder: Callable[..., Responder], keys: Path) -> None:
    """The server comes back on the same ports, now with CURVE: the wait ends in
    AuthenticationError, not in a timeout that would blame a server that is up."""
    first = responder()
    with first.client(timeout=1000) as bc:
        first.stop()
        secure, _sockets = _bind_curve_server(keys, first.port, first.port_out)
        try:
            started = time.monotonic()
            with pytest.raises(AuthenticationError, match="requires CURVE"):
                bc.encode(["hello"])
            assert time.monotonic() - started < 3
        finally:
            secure.destroy(linger=0)


def test_async_curve_serves_an_allowed_key_and_refuses_another(responder: Callable[..., Responder], keys: Path) -> None:
    r = responder(curve_dir=keys / "curve")
    alice = load_public_key(keys / "own" / "alice.key")

    async def main() -> None:
        async with async_client(r, **curve_options(keys), identity="a" * 23) as client:
            assert client.identity == alice + b":" + b"a" * 23
            answers = await asyncio.gather(*(client.encode([f"w {i}"]) for i in range(20)))
            assert [int(a[0, 0]) for a in answers] == [2] * 20
        started = time.monotonic()
        with pytest.raises(AuthenticationError, match="refused this client's key"):
            await async_client(r, timeout=10_000, **curve_options(keys, "mallory")).connect()
        with pytest.raises(AuthenticationError, match="does not use CURVE"):
            await async_client(responder(), timeout=10_000, **curve_options(keys)).connect()
        assert time.monotonic() - started < 5  # each at once, not after the 10 s timeout

    asyncio.run(main())
    assert set(r.user_ids) == {alice.decode()}


def _bind_curve_server(keys: Path, port: int, port_out: int) -> tuple[zmq.Context, list[zmq.Socket]]:
    """A CURVE PULL and PUB bound to ``port`` and ``port_out``; keep the sockets referenced."""
    context = zmq.Context()
    public, secret = zmq.auth.load_certificate(keys / "curve" / "server.key_secret")
    sockets = []
    for kind, number in ((zmq.PULL, port), (zmq.PUB, port_out)):
        sockets.append(sock := context.socket(kind))
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.curve_server = True
        sock.bind(f"tcp://127.0.0.1:{number}")
    return context, sockets


# -- the command line ------------------------------------------------------------------


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_client_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.run(args))


def test_cli(
    responder: Callable[..., Responder],
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = responder()
    server = ["--host", "127.0.0.1", "--port", str(r.port), "--port-out", str(r.port_out)]
    source = tmp_path / "in.txt"
    source.write_text("one\ntwo words\nthree more words\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    assert run_cli("encode", str(source), "-o", str(out), "--batch-size", "2", *server) == 0
    np.testing.assert_array_equal(np.load(out)[:, 0], [1, 2, 3])
    assert capsys.readouterr().err.startswith("wrote 3 vectors of dimension 4")  # no bar in a pipe

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    with monkeypatch.context() as patch:
        patch.setattr(sys, "stderr", terminal := Terminal())
        assert run_cli("encode", str(source), "-o", str(out), "--batch-size", "1", *server) == 0
    bar, wrote = terminal.getvalue().splitlines()[-2:]  # splitlines also splits at the bar's carriage returns
    assert "encoding: 100%" in bar and "3/3" in bar and wrote.startswith("wrote 3 vectors")

    assert run_cli("status", *server, "--json") == 0
    assert "requests" in json.loads(capsys.readouterr().out)
    assert run_cli("status", *server) == 0  # without --json: a summary, whatever the status holds
    assert capsys.readouterr().out.startswith("bertserve ")
    assert run_cli("stop", *server) == 0
    assert "stopping" in capsys.readouterr().out

    port, port_out = free_ports(2)
    assert run_cli("status", "--port", str(port), "--port-out", str(port_out), "--timeout", "200") == 1
    err = capsys.readouterr().err
    assert err.startswith("bertserve: error: no bertserve server answered") and err.count("\n") == 1


def test_the_reply_port_defaults_to_the_request_port_plus_one(
    responder: Callable[..., Responder], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = responder(adjacent=True)
    with BertClient("127.0.0.1", r.port, timeout=5000) as bc:
        assert bc.port_out == r.port + 1
        assert bc.encode(["one"]).shape == (1, 4)
    with ConcurrentBertClient(host="127.0.0.1", port=r.port, timeout=5000) as pool:
        assert pool.encode(["two words"]).shape == (1, 4)
    assert run_cli("status", "--host", "127.0.0.1", "--port", str(r.port), "--json") == 0
    assert "requests" in json.loads(capsys.readouterr().out)

    elsewhere = responder()  # an explicit port_out, or BERTSERVE_PORT_OUT, wins
    with BertClient("127.0.0.1", elsewhere.port, elsewhere.port_out, timeout=5000) as bc:
        assert bc.port_out == elsewhere.port_out
    monkeypatch.setenv("BERTSERVE_PORT_OUT", str(elsewhere.port_out))
    assert run_cli("status", "--host", "127.0.0.1", "--port", str(elsewhere.port)) == 0
    capsys.readouterr()
    with pytest.raises(ValueError, match=r"port_out defaults to port \+ 1, and port is 65535"):
        BertClient(port=65535, timeout=100)


def test_cli_warnings_are_one_line(
    responder: Callable[..., Responder], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bertserve.server.cli import main as cli

    r = responder(config={"server_version": "0.0.1"})
    (tmp_path / "in.txt").write_text("one\n", encoding="utf-8")
    server = ["--host", "127.0.0.1", "--port", str(r.port), "--port-out", str(r.port_out)]
    assert cli.main(["encode", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.npy"), *server]) == 0
    warning, wrote = capsys.readouterr().err.splitlines()
    assert warning.startswith("bertserve: warning: the server at ") and "runs bertserve 0.0.1" in warning
    assert wrote.startswith("wrote 1 vector of dimension 4")


def test_cli_keygen_and_curve_options(
    responder: Callable[..., Responder],
    keys: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert run_cli("keygen", str(tmp_path / "new"), "--name", "bob") == 0
    public, secret = capsys.readouterr().out.split()
    assert (public, secret) == (str(tmp_path / "new" / "bob.key"), str(tmp_path / "new" / "bob.key_secret"))
    assert load_public_key(public) == load_public_key(secret)
    assert os.stat(secret).st_mode & 0o077 == 0
    assert run_cli("keygen", str(tmp_path / "new"), "--name", "bob") == 1
    assert "already exists" in capsys.readouterr().err

    r = responder(curve_dir=keys / "curve")
    server = ["--host", "127.0.0.1", "--port", str(r.port), "--port-out", str(r.port_out), "--timeout", "3000"]
    options = curve_options(keys)
    curve = ["--server-key", str(options["server_key"]), "--client-cert", str(options["client_cert"])]
    assert run_cli("status", *server, *curve, "--json") == 0
    assert "requests" in json.loads(capsys.readouterr().out)
    assert run_cli("status", *server) == 1
    assert "requires CURVE: pass server_key and client_cert" in capsys.readouterr().err
    assert run_cli("status", *server, *curve[:2]) == 1
    assert "server_key was given without client_cert" in capsys.readouterr().err

    monkeypatch.setenv("BERTSERVE_SERVER_KEY", str(options["server_key"]))
    monkeypatch.setenv("BERTSERVE_CLIENT_CERT", str(options["client_cert"]))
    assert run_cli("stop", *server) == 0
    assert "stopping" in capsys.readouterr().out


def test_a_request_larger_than_the_servers_message_limit_is_refused_before_sending() -> None:
    server = Responder(config={"max_message_bytes": 2048})
    try:
        with server.client() as bc:
            with pytest.raises(ValueError, match=r"the server takes at most 2048 bytes per message"):
                bc.encode(["x" * 3000])
            assert bc.encode(["small enough"]).shape == (1, 4)
        assert len(server.commands(p.ENCODE)) == 1
    finally:
        server.stop()
