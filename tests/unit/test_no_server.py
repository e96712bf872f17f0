"""A client that finds no server says so: at once on this machine, where a refused connection
means nothing listens; within its timeout elsewhere, or when something listens but does not
answer. ``bertserve encode`` says so in its own flags, and at a terminal says what it waits for.

No bertserve server runs here: the "servers" are a closed port, a plain TCP listener that
never answers, and a small stand-in that answers the handshake late or at once.
"""

from __future__ import annotations

import asyncio
import os
import pty
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from bertserve.client import AsyncBertClient, BertClient, ConcurrentBertClient, ServerTimeoutError, __version__
from bertserve.client import protocol as p
from bertserve.client.errors import NoServerError
from bertserve.client.probe import PROBE_AFTER_S, REFUSED_FOR_S, ServerProbe, is_loopback
from bertserve.server.testing.launcher import free_port

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_leaked_contexts")]

FAST_S = 2.0  # a refused connection on this machine is reported within this (the probe needs REFUSED_FOR_S)


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections and never says a word."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


class LateServer:
    """Answers CONFIG after ``delay_s`` (as a server whose PUB has not yet seen the client's
    subscription), then ENCODE at once with one row ``[words, 0, 0, 0]`` per text."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self._context = zmq.Context()
        self._pull = self._context.socket(zmq.PULL)
        self._pub = self._context.socket(zmq.PUB)
        for sock in (self._pull, self._pub):
            sock.setsockopt(zmq.LINGER, 0)
        self.port = self._pull.bind_to_random_port("tcp://127.0.0.1")
        self.port_out = self._pub.bind_to_random_port("tcp://127.0.0.1")
        self._first_seen: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._pull.poll(10):
                    continue
                request = p.decode_request(self._pull.recv_multipart())
                cid, rid = request.client_id, request.request_id
                if request.command == p.CONFIG:
                    self._first_seen = self._first_seen or time.monotonic()
                    if time.monotonic() - self._first_seen >= self.delay_s:
                        config = {"server_version": __version__, "protocol": p.PROTOCOL_VERSION, "output_dim": 4}
                        self._pub.send_multipart(p.encode_reply(cid, rid, True, config))
                elif request.command == p.ENCODE:
                    words = [len(text if isinstance(text, list) else text.split()) for text in request.texts]
                    vectors = np.array([[n, 0, 0, 0] for n in words], np.float32).reshape(-1, 4)
                    self._pub.send_multipart(p.encode_reply(cid, rid, True, p.array_header(vectors), vectors.tobytes()))
        finally:
            self._pull.close()
            self._pub.close()
            self._context.term()


@pytest.fixture
def late_server() -> Iterator[Any]:
    started: list[LateServer] = []

    def start(delay_s: float) -> LateServer:
        started.append(LateServer(delay_s))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def _elapsed(call: Any) -> tuple[BaseException, float]:
    started = time.monotonic()
    try:
        call()
    except BaseException as exc:  # the caller checks what it is
        return exc, time.monotonic() - started
    raise AssertionError("no error")


# -- the Python clients --------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_refused_connection_on_this_machine_is_no_server_at_once(host: str) -> None:
    port = free_port()
    error, took = _elapsed(lambda: BertClient(host, port, timeout=60_000))
    assert isinstance(error, NoServerError) and isinstance(error, ServerTimeoutError)
    assert took < FAST_S and error.refused
    assert error.address == f"tcp://{host}:{port}"
    assert str(error) == (
        f"no bertserve server at tcp://{host}:{port}: the connection was refused, so nothing listens there. "
        "Start one with `bertserve start`, or pass its host= and port= if it runs elsewhere"
    )


def test_over_ipv6_loopback_too() -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback here")
        port = sock.getsockname()[1]
    error, took = _elapsed(lambda: BertClient("::1", port, timeout=60_000))
    assert isinstance(error, NoServerError) and error.refused and took < FAST_S
    assert f"tcp://[::1]:{port}" in str(error)


def test_the_pool_and_the_async_client_say_it_at_once_too() -> None:
    port = free_port()
    with ConcurrentBertClient(host="127.0.0.1", port=port, timeout=60_000) as pool:
        error, took = _elapsed(lambda: pool.encode(["hello"]))
        assert isinstance(error, NoServerError) and error.refused and took < FAST_S
        assert pool._created == 0  # nothing kept

    async def main() -> None:
        client = AsyncBertClient("127.0.0.1", port, timeout=60_000)
        for attempt in range(2):  # a failed connection leaves the client unconnected, to try again
            started = time.monotonic()
            with pytest.raises(NoServerError, match=rf"no bertserve server at tcp://127\.0\.0\.1:{port}: .*refused"):
                await (client.connect() if attempt == 0 else client.encode(["hello"]))
            assert time.monotonic() - started < FAST_S
            assert not client.closed and client._connection.transport is None
        await client.aclose()

    asyncio.run(main())


def test_something_that_listens_but_never_answers_is_waited_for_until_the_timeout(listener: int) -> None:
    error, took = _elapsed(lambda: BertClient("127.0.0.1", listener, timeout=1500))
    assert isinstance(error, NoServerError) and not error.refused
    assert 1.4 < took < 3
    assert str(error) == (
        f"no bertserve server answered at tcp://127.0.0.1:{listener} (replies on port {listener + 1}) within "
        "1500 ms. Start one with `bertserve start`, or pass its host= and port= if it runs elsewhere"
    )

    async def main() -> None:
        started = time.monotonic()
        with pytest.raises(NoServerError, match="within 1500 ms") as info:
            await AsyncBertClient("127.0.0.1", listener, timeout=1500).connect()
        assert not info.value.refused and time.monotonic() - started > 1.4

    asyncio.run(main())


def test_a_server_slow_to_answer_on_this_machine_is_not_taken_for_none(late_server: Any) -> None:
    server = late_server(delay_s=PROBE_AFTER_S + 2 * REFUSED_FOR_S + 0.5)
    started = time.monotonic()
    with BertClient("127.0.0.1", server.port, server.port_out, timeout=10_000) as client:
        assert time.monotonic() - started > PROBE_AFTER_S + 2 * REFUSED_FOR_S
        assert client.encode(["two words"])[0, 0] == 2
        assert client._connection.transport._probe._sockets is None  # closed once connected


def test_a_server_that_is_up_is_connected_to_as_fast_as_ever(late_server: Any) -> None:
    server = late_server(delay_s=0)
    started = time.monotonic()
    with BertClient("127.0.0.1", server.port, server.port_out, timeout=10_000) as client:
        took = time.monotonic() - started
        transport = client._connection.transport
        assert transport._probe._sockets is None and transport._probe._started == 0  # never probed
    assert took < 0.5


def _outward_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, a route is chosen
        except OSError:
            return None
        address = sock.getsockname()[0]
    return None if is_loopback(address) or address == "0.0.0.0" else address


def test_elsewhere_a_refusal_is_waited_out_within_the_timeout() -> None:
    address = _outward_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    port = free_port()
    error, took = _elapsed(lambda: BertClient(address, port, timeout=1500))
    assert isinstance(error, NoServerError) and not error.refused and took > 1.4
    assert f"tcp://{address}:{port}" in str(error) and "`bertserve start`" in str(error)


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("example.org", False),
        ("::ffff:10.0.0.1", False),
    ],
)
def test_only_this_machine_is_probed(host: str, local: bool) -> None:
    assert is_loopback(host) is local
    context = zmq.Context()
    try:
        probe = ServerProbe(context, host, f"tcp://{host}:1")
        if not local:
            assert not probe.nobody_listens(waited_s=60) and probe._sockets is None
        assert not probe.nobody_listens(waited_s=0) or probe._sockets is None  # too soon to look
        probe.close()
    finally:
        context.destroy(linger=0)


# -- bertserve encode ----------------------------------------------------------------------


def _encode_command(port: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "bertserve.server.cli", "encode", "--host", "127.0.0.1", "--port", str(port), *args]


def test_bertserve_encode_without_a_server_says_how_to_start_one_at_once(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "out.npy"
    started = time.monotonic()
    done = subprocess.run(
        _encode_command(port, "-o", str(out)), input="hello\n", capture_output=True, text=True, timeout=30
    )
    took = time.monotonic() - started
    assert done.returncode == 1 and not out.exists()
    assert done.stderr == (
        f"bertserve: error: no bertserve server at tcp://127.0.0.1:{port}: the connection was refused, so nothing "
        "listens there. Start one with `bertserve start`, or pass its --host and --port if it runs elsewhere\n"
    )
    assert took < FAST_S + 5  # the interpreter's start, then about a second; not the 60 s timeout


def _run_on_a_terminal(command: list[str], stdin: bytes, timeout_s: float = 30) -> tuple[int, str]:
    """Run ``command`` with its stderr on a pseudo-terminal; its exit code and what it wrote there."""
    leader, follower = pty.openpty()
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=follower) as proc:
        os.close(follower)
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        seen = b""
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if select.select([leader], [], [], 0.1)[0]:
                    try:
                        chunk = os.read(leader, 4096)
                    except OSError:  # EIO: every writer of the terminal has closed it
                        break
                    if not chunk:
                        break
                    seen += chunk
                elif proc.poll() is not None:
                    break
        finally:
            os.close(leader)
            if proc.poll() is None:
                proc.kill()
        return proc.wait(10), seen.decode("utf-8", "replace")


def test_bertserve_encode_at_a_terminal_says_what_it_waits_for(listener: int, tmp_path: Path) -> None:
    command = _encode_command(listener, "--timeout", "2500", "-o", str(tmp_path / "out.npy"))
    code, said = _run_on_a_terminal(command, b"hello\n")
    assert code == 1
    waiting = f"waiting for the server at tcp://127.0.0.1:{listener} ..."
    assert waiting in said
    error = said.index(f"no bertserve server answered at tcp://127.0.0.1:{listener}")
    assert said.index(waiting) < error
    assert "within 2500 ms. Start one with `bertserve start`, or pass its --host and --port" in said

    piped = subprocess.run(command, input="hello\n", capture_output=True, text=True, timeout=30)
    assert piped.returncode == 1 and "waiting for" not in piped.stderr  # a pipe gets the error alone
    assert piped.stderr.startswith(f"bertserve: error: no bertserve server answered at tcp://127.0.0.1:{listener}")


def test_bertserve_encode_at_a_terminal_says_nothing_of_waiting_for_a_prompt_server(
    late_server: Any, tmp_path: Path
) -> None:
    server = late_server(delay_s=0)
    out = tmp_path / "out.npy"
    command = _encode_command(server.port, "--port-out", str(server.port_out), "-o", str(out))
    code, said = _run_on_a_terminal(command, b"one\ntwo words\n")
    assert code == 0 and "waiting for" not in said and "wrote 2 vectors of dimension 4" in said
    np.testing.assert_array_equal(np.load(out)[:, 0], [1, 2])
