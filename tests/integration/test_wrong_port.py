"""A client pointed at the wrong port says what answers there, through the real clients and
``bertserve status``: a bertserve server's HTTP port, its reply port, any HTTP server, and
(with CURVE keys) a plain server's reply port each raise ``WrongPortError`` within a couple
of seconds; a CURVE server reached without keys still says that it requires CURVE."""

from __future__ import annotations

import asyncio
import http.server
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from bertserve.client import AsyncBertClient, AuthenticationError, BertClient, ConcurrentBertClient
from bertserve.client.errors import WrongPortError
from bertserve.client.security import keygen
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from faulty_model import pythonpath_env

pytestmark = pytest.mark.timeout(120)

FAULTY = "faulty_model:FaultyModel"  # HashingModel's vectors: a server that starts in a second
TIMEOUT_MS = 10_000  # each wrong port is named long before this
ADVICE = "Point the client at the server's request port: its --port, 5555 by default"


def address(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


def named_http(port: int, status: str = r"HTTP/1\.1 \d{3} [^)]+") -> str:
    """The message for an HTTP server at ``port``, as a pattern (its status line varies)."""
    return (
        rf"^{re.escape(address(port))} is not a bertserve request port: an HTTP server answers there "
        rf"\({status}\), as a bertserve server's --http-port does\. {re.escape(ADVICE)}$"
    )


def named_reply_port(port: int) -> str:
    return (
        f"{address(port)} is not a bertserve request port: a ZeroMQ XPUB socket answers there, "
        f"as a bertserve server's reply port (--port-out) does. {ADVICE}"
    )


class Served:
    def __init__(self, running: RunningServer, http_port: int) -> None:
        self.running = running
        self.port, self.port_out, self.http_port = running.port, running.port_out, http_port
        # A wrong port's own port + 1 may be another of this server's ports, which the client
        # would name first: each test names the reply port it means, the right one or a port
        # nobody listens on.
        taken = (self.port, self.port_out, http_port)
        self.nowhere = next(port for port in iter(free_port, None) if port not in taken)


def _start(tiny_google: str, *flags: str) -> RunningServer:
    """A server of the fast model, with ``flags``."""
    return start_server(
        "--model-dir", tiny_google, "--model-class", FAULTY, "--max-seq-len", "32", *flags, env=pythonpath_env()
    )


@pytest.fixture(scope="module")
def served(tiny_google: str) -> Iterator[Served]:
    """A plain server with its HTTP front end."""
    http_port = free_port()
    running = _start(tiny_google, "--http-port", str(http_port))
    yield Served(running, http_port)
    running.stop()


@pytest.fixture(scope="module")
def curve_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("curve")
    keygen(root, "server")
    keygen(root / "clients", "alice")
    return root


@pytest.fixture(scope="module")
def curve_server(tiny_google: str, curve_keys: Path) -> Iterator[RunningServer]:
    running = _start(tiny_google, "--curve-dir", str(curve_keys))
    yield running
    running.stop()


@pytest.fixture
def http_server() -> Iterator[int]:
    """Python's own HTTP server on loopback, which answers HEAD with 501 and waits in silence
    for a request line that a ZeroMQ greeting never ends."""

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def raised(make: Callable[[], Any]) -> tuple[Exception, float]:
    """What ``make()`` raised and how long it took; it must raise within the client's timeout."""
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        make()
    took = time.monotonic() - started
    assert took < TIMEOUT_MS / 1000 / 2, f"took {took:.1f} s: found at the timeout, not named at once"
    assert isinstance(info.value, Exception)
    return info.value, took


def test_the_http_port_is_named_not_taken_for_curve(served: Served, no_leaked_contexts: None) -> None:
    error, _ = raised(lambda: BertClient("127.0.0.1", served.http_port, served.port_out, timeout=TIMEOUT_MS))
    assert isinstance(error, WrongPortError) and error.address == address(served.http_port)
    assert re.match(named_http(served.http_port), str(error)), str(error)
    assert "CURVE" not in str(error)
    with BertClient("127.0.0.1", served.port, served.port_out, timeout=TIMEOUT_MS) as client:  # still served
        assert client.encode(["the right port"]).shape == (1, 16)


def test_the_reply_port_taken_for_the_request_port_is_named(served: Served, no_leaked_contexts: None) -> None:
    error, _ = raised(lambda: BertClient("127.0.0.1", served.port_out, served.nowhere, timeout=TIMEOUT_MS))
    assert isinstance(error, WrongPortError) and str(error) == named_reply_port(served.port_out)


def test_any_http_server_is_named(http_server: int) -> None:
    error, _ = raised(lambda: BertClient("127.0.0.1", http_server, free_port(), timeout=TIMEOUT_MS))
    assert isinstance(error, WrongPortError)
    assert re.match(named_http(http_server, re.escape("HTTP/1.0 501 Unsupported method ('HEAD')")), str(error))


def test_the_async_client_and_the_pool_name_it_too(served: Served) -> None:
    async def connect() -> None:
        async with AsyncBertClient("127.0.0.1", served.http_port, served.port_out, timeout=TIMEOUT_MS):
            pass

    error, _ = raised(lambda: asyncio.run(connect()))
    assert isinstance(error, WrongPortError) and re.match(named_http(served.http_port), str(error))

    pool_ports = {"port": served.port_out, "port_out": served.nowhere}
    with ConcurrentBertClient(host="127.0.0.1", **pool_ports, timeout=TIMEOUT_MS) as pool:
        error, _ = raised(lambda: pool.encode(["hello"]))
    assert isinstance(error, WrongPortError) and str(error) == named_reply_port(served.port_out)


def test_a_curve_server_reached_without_keys_still_asks_for_them(curve_server: RunningServer) -> None:
    error, _ = raised(lambda: BertClient("127.0.0.1", curve_server.port, curve_server.port_out, timeout=TIMEOUT_MS))
    assert isinstance(error, AuthenticationError)
    assert "requires CURVE: pass server_key and client_cert" in str(error) and "not a bertserve" not in str(error)


def test_a_curve_client_at_a_plain_reply_port_is_told_the_port_not_curve(served: Served, curve_keys: Path) -> None:
    # One side uses CURVE and the other does not, which alone would say "does not use CURVE";
    # what answers is not a request port at all, and that is said first.
    keys = {"server_key": curve_keys / "server.key", "client_cert": curve_keys / "clients" / "alice.key_secret"}
    error, _ = raised(lambda: BertClient("127.0.0.1", served.port_out, served.nowhere, timeout=TIMEOUT_MS, **keys))
    assert isinstance(error, WrongPortError) and str(error) == named_reply_port(served.port_out)


def test_bertserve_status_at_the_http_port(served: Served, bertserve_main: Callable[..., Any]) -> None:
    started = time.monotonic()
    ports = ("--port", str(served.http_port), "--port-out", str(served.port_out))
    result = bertserve_main("status", "--host", "127.0.0.1", *ports, "--timeout", "10000")
    assert time.monotonic() - started < TIMEOUT_MS / 1000 / 2
    assert result.returncode == 1 and result.stdout == ""
    line = result.stderr.removeprefix("bertserve: error: ")
    assert line != result.stderr and line.endswith("\n") and line.count("\n") == 1
    assert re.match(named_http(served.http_port), line.rstrip("\n")), result.stderr
