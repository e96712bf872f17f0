"""A client pointed at the wrong port says what answers there, through the real clients and
``bertserve status``: a bertserve server's HTTP port, its reply port, any HTTP server, and
(with CURVE keys) a plain server's reply port each raise ``WrongPortError`` within a couple
of seconds; a CURVE server reached without keys still says that it requires CURVE. With the
request port right and only ``port_out`` wrong (nothing there, a silent TCP listener, an
HTTP server), the error says that the server runs and how to find its reply port, within a
few seconds, and is both a ``NoServerError`` and a ``WrongPortError``."""

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
from bertserve.client.errors import NoServerError, WrongPortError, WrongReplyPortError
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


def wrong_port_out(port: int, port_out: int, found: str, *, flags: bool = False) -> str:
    """The message for a server that runs at ``port`` while ``found`` answers at ``port_out``;
    with ``flags``, in ``bertserve``'s words."""
    option, request = ("--port-out", "--port") if flags else ("port_out", "port")
    default = f"by default {request} + 1 ({port + 1})"
    if port_out == port + 1:
        default = f"{request} + 1 by default, another since the server was started with --port-out"
    return (
        f"the bertserve server at {address(port)} is running, but {option} {port_out} is not its reply port: "
        f"{found}. Set {option} to the server's reply port, which its ready line names "
        f'("results on port N"): {default}'
    )


NOTHING = "nothing listens there"
SILENT = "something listens there but says nothing, as no ZeroMQ socket does"
HTTP_501 = (
    "an HTTP server answers there (HTTP/1.0 501 Unsupported method ('HEAD')), as a bertserve server's --http-port does"
)


class Served:
    def __init__(self, running: RunningServer, http_port: int) -> None:
        self.running = running
        self.port, self.port_out, self.http_port = running.port, running.port_out, http_port
        # A wrong port's own port + 1 may be another of this server's ports, which the client
        # would name first: each test names the reply port it means, the right one or a port
        # nobody listens on.
        taken = (self.port, self.port_out, http_port, self.port + 1)  # port + 1: the default port_out
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


# -- the request port right, port_out wrong -----------------------------------------------------


def _wrong_port_out(error: Exception, served: Served, port_out: int, found: str) -> None:
    assert isinstance(error, WrongReplyPortError), repr(error)
    assert isinstance(error, NoServerError) and isinstance(error, WrongPortError)  # as caught before
    assert str(error) == wrong_port_out(served.port, port_out, found)
    assert error.address == address(served.port) and error.port_out == port_out and not error.refused


def test_port_out_where_nothing_listens_says_the_server_runs(served: Served, no_leaked_contexts: None) -> None:
    error, _ = raised(lambda: BertClient("127.0.0.1", served.port, served.nowhere, timeout=TIMEOUT_MS))
    _wrong_port_out(error, served, served.nowhere, NOTHING)
    assert "bertserve start" not in str(error)


def test_port_out_at_a_silent_listener_says_the_server_runs(
    served: Served, listener: int, no_leaked_contexts: None
) -> None:
    error, _ = raised(lambda: BertClient("127.0.0.1", served.port, listener, timeout=TIMEOUT_MS))
    _wrong_port_out(error, served, listener, SILENT)


def test_port_out_at_an_http_server_says_the_server_runs(
    served: Served, http_server: int, no_leaked_contexts: None
) -> None:
    error, _ = raised(lambda: BertClient("127.0.0.1", served.port, http_server, timeout=TIMEOUT_MS))
    _wrong_port_out(error, served, http_server, HTTP_501)


def test_port_out_at_this_servers_http_port_is_named(served: Served) -> None:
    error, _ = raised(lambda: BertClient("127.0.0.1", served.port, served.http_port, timeout=TIMEOUT_MS))
    assert isinstance(error, WrongReplyPortError)
    assert re.match(
        re.escape(f"the bertserve server at {address(served.port)} is running, but port_out {served.http_port} ")
        + r"is not its reply port: an HTTP server answers there \(HTTP/1\.1 \d{3} [^)]+\), ",
        str(error),
    ), str(error)


def test_the_async_client_and_the_pool_say_it_too(served: Served) -> None:
    async def connect() -> None:
        async with AsyncBertClient("127.0.0.1", served.port, served.nowhere, timeout=TIMEOUT_MS):
            pass

    error, _ = raised(lambda: asyncio.run(connect()))
    _wrong_port_out(error, served, served.nowhere, NOTHING)

    with ConcurrentBertClient(host="127.0.0.1", port=served.port, port_out=served.nowhere, timeout=TIMEOUT_MS) as pool:
        error, _ = raised(lambda: pool.encode(["hello"]))
    _wrong_port_out(error, served, served.nowhere, NOTHING)


def test_a_timeout_shorter_than_the_look_still_says_the_server_runs(served: Served) -> None:
    # Nothing has been refused for long enough by the deadline: what was seen by then is said.
    error, took = raised(lambda: BertClient("127.0.0.1", served.port, served.nowhere, timeout=1000))
    assert took >= 0.9
    _wrong_port_out(error, served, served.nowhere, NOTHING)


@pytest.mark.parametrize("command", ["status", "encode"])
def test_bertserve_at_a_wrong_port_out(served: Served, bertserve_main: Callable[..., Any], command: str) -> None:
    ports = ("--port", str(served.port), "--port-out", str(served.nowhere))
    started = time.monotonic()
    result = bertserve_main(command, "--host", "127.0.0.1", *ports, "--timeout", "10000", stdin="hello\n")
    assert time.monotonic() - started < TIMEOUT_MS / 1000 / 2
    assert result.returncode == 1 and result.stdout == ""
    expected = wrong_port_out(served.port, served.nowhere, NOTHING, flags=True)
    assert result.stderr == f"bertserve: error: {expected}\n"
