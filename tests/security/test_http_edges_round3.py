"""Attack: the HTTP front end's edges that a browser's preflight, one packet of headers and a
caller's trace context reach.

One real server (HashingModel, an API key, one origin allowed by CORS) takes the first two:
a preflight is held to the limits every other request is (header fields, a body on a method
that takes none), and a request's line and headers to ``--max-http-header-bytes`` however
their bytes arrive, one packet or many. The last two run the HTTP process's tracing layer in
this process, with OpenTelemetry's in-memory exporter: what a caller sends cannot name spans
without end, nor decide which requests the server traces.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest
from bertserve.server import tracing
from bertserve.server.http.traced import Traced
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

HASHING = "bertserve.server.model.interface:HashingModel"
KEY = "round3-test-key-0123456789"
ORIGIN = "https://app.example.com"
HEADER_BYTES = 16 * 1024  # --max-http-header-bytes, its default
PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}


@pytest.fixture(scope="module")
def url(tiny_google: str) -> Iterator[str]:
    port = free_port()
    running: RunningServer = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        HASHING,
        "--http-port",
        str(port),
        "--cors-allow-origin",
        ORIGIN,
        env={"BERTSERVE_API_KEY": KEY},
        timeout=60,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        running.stop()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _head(method: str, path: str, fields: dict[str, str] | list[tuple[str, str]]) -> bytes:
    items = fields.items() if isinstance(fields, dict) else fields
    lines = [f"{method} {path} HTTP/1.1", "Host: test", *(f"{name}: {value}" for name, value in items)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _one_packet(url: str, request: bytes, body: bytes = b"", *, closes: bool = True) -> tuple[int | None, bool]:
    """Send ``request`` in one write (then ``body``, if any, as the server takes it); the
    status answered (None: closed without one), and whether the server then closed the
    connection (within 3 s, if ``closes``; else not waited for)."""
    with socket.create_connection(("127.0.0.1", _port(url)), timeout=10) as sock:
        sock.sendall(request)
        with contextlib.suppress(OSError):  # answered and closed before the body was all sent
            sock.sendall(body)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except ConnectionResetError:
            pass
        if not answer.startswith(b"HTTP/1.1 "):
            return None, True
        status = int(answer.split()[1])
        if not closes:
            return status, False
        sock.settimeout(3)
        try:
            while sock.recv(65536):
                pass  # the rest of the answer, then the close
            closed = True
        except TimeoutError:
            closed = False
        except ConnectionResetError:
            closed = True
        return status, closed


# -- 1. a preflight passes the same limits ----------------------------------------------------


@pytest.mark.timeout(60)
def test_a_preflight_is_answered_without_the_key_and_without_credentials(url: str) -> None:
    preflight = httpx.options(url + "/v1/embeddings", headers=PREFLIGHT, timeout=10)
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "access-control-allow-credentials" not in preflight.headers
    assert len(preflight.headers["x-request-id"]) == 32
    assert "data" not in preflight.text and "embedding" not in preflight.text
    other = httpx.options(
        url + "/v1/embeddings", headers={**PREFLIGHT, "Origin": "https://evil.example.com"}, timeout=10
    )
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


@pytest.mark.timeout(60)
def test_a_preflight_with_too_many_header_fields_is_refused_431(url: str) -> None:
    many = {**PREFLIGHT, **{f"X-Field-{i}": "v" for i in range(150)}}
    answer = httpx.options(url + "/v1/embeddings", headers=many, timeout=10)
    assert answer.status_code == 431, answer.text
    assert len(answer.headers["x-request-id"]) == 32


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("fields", "body"),
    [
        ({"Content-Length": str(5 * 2**20)}, b"a" * (5 * 2**20)),  # 5 MB, all of it sent
        ({"Content-Length": str(5 * 2**20)}, b""),  # declared, none of it sent
        ({"Transfer-Encoding": "chunked"}, b"5\r\nhello\r\n0\r\n\r\n"),
    ],
)
def test_a_preflight_that_carries_a_body_is_refused_413(url: str, fields: dict[str, str], body: bytes) -> None:
    status, _ = _one_packet(url, _head("OPTIONS", "/v1/embeddings", {**PREFLIGHT, **fields}), body, closes=False)
    assert status == 413


@pytest.mark.timeout(60)
def test_a_preflight_with_20_kb_of_headers_is_refused(url: str) -> None:
    fields = {**PREFLIGHT, "X-Pad": "a" * 20_000}
    assert _one_packet(url, _head("OPTIONS", "/v1/embeddings", fields)) == (400, True)


# -- 2. the header limit holds when the headers come whole --------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [20_000, 60_000])
@pytest.mark.parametrize(
    ("method", "path", "auth"), [("GET", "/health", False), ("POST", "/v1/embeddings", True), ("GET", "/nowhere", True)]
)
def test_headers_whole_in_one_packet_are_held_to_the_header_limit(
    url: str, size: int, method: str, path: str, auth: bool
) -> None:
    fields = [("Authorization", f"Bearer {KEY}")] * auth + [
        ("X-Pad", "a" * (size // 2)),
        ("X-Pad-2", "b" * (size // 2)),
    ]
    assert _one_packet(url, _head(method, path, fields)) == (400, True)


@pytest.mark.timeout(60)
def test_headers_just_under_the_limit_are_served_and_just_over_are_not(url: str) -> None:
    base = _head("GET", "/health", [("X-Pad", "")])
    under = _head("GET", "/health", [("X-Pad", "a" * (HEADER_BYTES - len(base) - 64))])
    assert len(under) < HEADER_BYTES and _one_packet(url, under, closes=False)[0] == 200
    over = _head("GET", "/health", [("X-Pad", "a" * (HEADER_BYTES - len(base) + 64))])
    assert len(over) > HEADER_BYTES and _one_packet(url, over) == (400, True)
    # Many small fields add up the same way as one large one.
    fields = [(f"X-F{i}", "a" * 400) for i in range(60)]
    assert _one_packet(url, _head("GET", "/health", fields)) == (400, True)
    with httpx.Client(base_url=url, timeout=10) as http:  # httpx writes its headers whole, too
        assert http.get("/health", headers={"X-Pad": "a" * 20_000}).status_code == 400
        assert http.get("/health", headers={"X-Pad": "a" * 1_000}).status_code == 200


# -- 3 and 4. traces: span names, and who decides sampling ------------------------------------

ROUTES = frozenset({"/v1/embeddings", "/v1/models"})
KNOWN_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})
CALLER_SPAN = "00f067aa0ba902b7"


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"traceparent": tracing.current_traceparent()})


def _traced_app() -> Traced:
    app = Starlette(routes=[Route(path, _echo, methods=["GET", "POST"]) for path in ROUTES])
    return Traced(app, routes=ROUTES, untraced={"/health"}, untraced_under="/docs/")


@pytest.fixture
def traces(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str], InMemorySpanExporter]]:
    """This process traced, its spans kept in memory, under the sampler named (``OTEL_TRACES_SAMPLER``)."""

    def install(sampler: str, ratio: str = "") -> InMemorySpanExporter:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", ratio)
        exporter = InMemorySpanExporter()
        tracing.install(SimpleSpanProcessor(exporter), "http")
        return exporter

    try:
        yield install
    finally:
        tracing.shutdown()


def _requests(calls: list[tuple[str, str, dict[str, str]]]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=_traced_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return [await http.request(method, path, headers=headers) for method, path, headers in calls]

    return asyncio.run(run())


@pytest.mark.timeout(30)
def test_span_names_and_methods_come_from_a_fixed_set(traces: Callable[..., InMemorySpanExporter]) -> None:
    spans = traces("parentbased_always_on")
    calls = []
    for _ in range(20):
        token = uuid.uuid4().hex
        calls += [
            ("GET", f"/{token}", {}),
            ("POST", f"/v1/{token}/embeddings", {}),
            (f"X{token.upper()}", "/v1/embeddings", {}),  # any token is a method to HTTP/1.1
            (f"X{token.upper()}", f"/{token}", {}),
        ]
    calls += [("POST", "/v1/embeddings", {}), ("GET", "/v1/models", {}), ("PATCH", "/v1/models", {})]
    _requests(calls)
    finished = spans.get_finished_spans()
    assert len(finished) == len(calls)
    methods = KNOWN_METHODS | {"HTTP"}
    allowed = methods | {f"{method} {route}" for method in methods for route in ROUTES}
    names = {span.name for span in finished}
    assert names <= allowed, sorted(names - allowed)[:5]
    assert {"POST /v1/embeddings", "GET /v1/models", "GET", "POST", "HTTP", "HTTP /v1/embeddings"} <= names
    assert {span.attributes["http.request.method"] for span in finished} <= KNOWN_METHODS | {"_OTHER"}
    other = [span for span in finished if span.attributes["http.request.method"] == "_OTHER"]
    assert len(other) == 40
    assert all(len(str(span.attributes["http.request.method_original"])) <= 256 for span in other)


def _traceparent(trace_id: str, flags: str) -> dict[str, str]:
    return {"traceparent": f"00-{trace_id}-{CALLER_SPAN}-{flags}", "tracestate": "congo=t61rcWkgMzE"}


@pytest.mark.timeout(30)
def test_a_callers_sampled_flag_does_not_force_a_trace(traces: Callable[..., InMemorySpanExporter]) -> None:
    spans = traces("parentbased_traceidratio", "0")
    replies = _requests([("POST", "/v1/embeddings", _traceparent(uuid.uuid4().hex, "01")) for _ in range(20)])
    assert spans.get_finished_spans() == ()
    for reply in replies:  # the context the head continues says: not sampled, so it makes no span either
        sent = reply.json()["traceparent"]
        assert sent is not None and int(sent[-2:], 16) & 1 == 0
        assert tracing.recorded_traceparent(tracing.start("bertserve.head.request", parent=sent)) is None
    assert spans.get_finished_spans() == ()


@pytest.mark.timeout(30)
def test_a_callers_trace_id_does_not_pick_its_trace_for_the_ratio(traces: Callable[..., InMemorySpanExporter]) -> None:
    """A ratio sampler keeps a trace whose id is below its bound: a caller that picks such an
    id (here the lowest ones) is decided for as any other."""
    spans = traces("parentbased_traceidratio", "0.000000001")
    _requests([("POST", "/v1/embeddings", _traceparent("0" * 31 + str(i % 10), "01")) for i in range(20)])
    assert spans.get_finished_spans() == ()


@pytest.mark.timeout(30)
def test_a_sampled_request_joins_the_callers_trace_and_its_decision_is_carried_on(
    traces: Callable[..., InMemorySpanExporter],
) -> None:
    spans = traces("parentbased_always_on")
    trace_id = uuid.uuid4().hex
    (reply,) = _requests([("POST", "/v1/embeddings", _traceparent(trace_id, "00"))])  # the server decides: kept
    sent = reply.json()["traceparent"]
    assert sent.startswith(f"00-{trace_id}-") and int(sent[-2:], 16) & 1 == 1
    tracing.end(tracing.start("bertserve.head.request", parent=sent))  # the head follows the HTTP span
    http, head = spans.get_finished_spans()
    assert http.name == "POST /v1/embeddings" and http.context.trace_id == int(trace_id, 16)
    assert http.parent is not None and http.parent.span_id == int(CALLER_SPAN, 16)
    assert list(http.context.trace_state.keys()) == ["congo"]
    assert head.parent is not None and head.parent.span_id == http.context.span_id


@pytest.mark.timeout(30)
def test_a_zeromq_callers_sampled_flag_does_not_force_the_heads_trace(
    traces: Callable[..., InMemorySpanExporter],
) -> None:
    """A ZeroMQ client's ``traceparent`` is a caller's: the head decides, as the HTTP process
    decides an HTTP caller's; the HTTP process's own context is followed as it says."""
    spans = traces("parentbased_traceidratio", "0")
    caller = f"00-{uuid.uuid4().hex}-{CALLER_SPAN}-01"
    assert tracing.recorded_traceparent(tracing.start("bertserve.head.request", parent=caller, caller=True)) is None
    assert spans.get_finished_spans() == ()
    ours = tracing.start("bertserve.head.request", parent=caller)  # as the HTTP process sent it: followed
    assert tracing.recorded_traceparent(ours) is not None
    tracing.end(ours)
    assert len(spans.get_finished_spans()) == 1
