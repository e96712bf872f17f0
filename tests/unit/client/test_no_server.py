"""A client that finds no server says so: at once on this machine, where a refused connection
means nothing listens; within its timeout elsewhere, or when something listens but does not
answer. (``bertserve encode`` without a server, a process of its own, is tested in
tests/integration/test_encode_without_a_server.py.)

No bertserve server runs here: the "servers" are a closed port, a plain TCP listener that
never answers, and a small stand-in that answers the handshake late or at once (late_server.py).
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest
import zmq
from bertserve.client import AsyncBertClient, BertClient, ConcurrentBertClient, ServerTimeoutError
from bertserve.client.errors import NoServerError
from bertserve.client.probe import PROBE_AFTER_S, REFUSED_FOR_S, ServerProbe, is_loopback
from bertserve.server.testing.launcher import free_port

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_leaked_contexts")]

FAST_S = 2.0  # a refused connection on this machine is reported within this (the probe needs REFUSED_FOR_S)


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
