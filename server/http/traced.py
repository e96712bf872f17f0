"""Each HTTP request's span, when the HTTP process traces (:mod:`..tracing`): a plain ASGI
layer that continues the caller's W3C ``traceparent`` (a malformed one is ignored, as W3C
says: the request starts a trace of its own), makes the request's span current while the
application serves it, so the ENCODE it sends carries its context to the head, and ends it
with the response's status. Whether the span is sampled is the server's decision, not the
caller's flag's (:mod:`..tracing`); its name and method come from a fixed set (:class:`Traced`).

It does what OpenTelemetry's ASGI middleware does for this API, in a quarter of the time
(about 20 against 87 µs a request, ``benchmarks/tracing.py``'s reason): one span, the
semantic conventions' core attributes, no metrics of its own (the server's are Prometheus').
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import tracing

_CONTEXT_HEADERS = {b"traceparent": "traceparent", b"tracestate": "tracestate"}
# The methods the semantic conventions know; any other token is a method to HTTP/1.1, and is
# named _OTHER (its span HTTP), so that a caller cannot make methods, or span names, without end.
_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})
_OTHER_METHOD = "_OTHER"
_MAX_TRACESTATE = 512  # W3C's own advice: a vendor may drop a longer one
_MOST_CHARS = 256  # of what a caller sends that a span quotes


class Traced:
    """Plain ASGI: a span for each HTTP request to a path not in ``untraced`` (probes and
    pages), named ``METHOD /route`` for a route of the API (``routes``) and ``METHOD`` for any
    other path, with ``HTTP`` for METHOD when the method is not one of the nine HTTP defines
    (its ``http.request.method`` is then ``_OTHER``, as the semantic conventions say): span
    names come from a fixed set, so a caller cannot make them without end."""

    def __init__(self, app: ASGIApp, routes: Collection[str], untraced: Collection[str], untraced_under: str) -> None:
        self.app = app
        self.routes = frozenset(routes)
        self.untraced = frozenset(untraced)
        self.untraced_under = untraced_under  # and every path under this one (the docs' assets)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or not tracing.enabled()
            or path in self.untraced
            or path.startswith(self.untraced_under)
        ):
            return await self.app(scope, receive, send)
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        carrier = {}
        for name, value in scope.get("headers") or ():
            key = _CONTEXT_HEADERS.get(name.lower())
            if key is not None and len(value) <= _MAX_TRACESTATE:
                carrier[key] = value.decode("latin-1")
        given = scope.get("method", "")
        method = given if given in _METHODS else _OTHER_METHOD
        route = path if path in self.routes else None
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.path": path[:_MOST_CHARS],  # a caller's path may be as long as the headers' limit
            "url.scheme": scope["scheme"],
        }
        if method is _OTHER_METHOD:
            attributes["http.request.method_original"] = given[:_MOST_CHARS]
        if route is not None:
            attributes["http.route"] = route
        client = scope.get("client")
        if client:
            attributes["client.address"] = client[0]
        named = "HTTP" if method is _OTHER_METHOD else method
        name = f"{named} {route}" if route else named
        span = tracing.server_span(name, carrier.get("traceparent"), carrier.get("tracestate"), attributes)

        async def send_with_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                span.set_attribute("http.response.status_code", status)
                if status >= 500:  # a server span's error; a 4xx is the caller's
                    span.set_status(Status(StatusCode.ERROR))
            await send(message)

        with trace.use_span(span, end_on_exit=True, record_exception=True, set_status_on_exception=True):
            await self.app(scope, receive, send_with_status)
