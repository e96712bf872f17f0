"""The plain ASGI layer every HTTP request passes before the application (:class:`Front`),
and whom the server's bounds and turns count a request to (:func:`caller`)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import metrics
from ..config.http import HTTP_HEADERS
from .bodies import ARRAY_COST, COMMA_COST, OBJECT_COST, BodyBudget, BodyPace, parse_cost
from .disconnects import Call, disconnected
from .principals import Principals
from .schemas import HTTPError, error_response

_OPEN_PATHS = {"/health", "/ready"}  # probes need no key
# Nor does the API's description, which a browser fetches without the key: the same for every
# server of this version, it holds no model name and no data.
_DOCS_PATHS = {"/docs", "/redoc", "/openapi.json"}
_DOCS_PREFIX = "/docs/"  # the assets of /docs and /redoc, and its OAuth2 redirect page
_BODILESS_METHODS = {"GET", "HEAD", "OPTIONS", "DELETE"}
_PRINCIPAL = "bertserve.principal"  # the scope key of the principal's name, once its API key is checked
_VISIT = "bertserve.visit"  # the scope key of the request's _Visit, for the steps after CORS
_CLOSE = (b"connection", b"close")
ANONYMOUS = "anonymous"  # the metrics' principal label on a server without keys


class Front:
    """What every request passes first, as plain ASGI (no per-request task), in this order:
    the header count; no body where none is taken; CORS (``cors``, a layer that wraps what
    follows: it answers a browser's preflight itself, without a key, and names the allowed
    origin in the other answers); the API key and its principal; the body's limits in bytes
    and in time. Every request, a preflight too, is counted and timed for ``/metrics``.

    A GET (or HEAD, OPTIONS, DELETE) and a path open without a key (``/health``, ``/ready``,
    the API's docs) take no body: one that declares a body is refused with 413 before a byte
    of it is read, so a caller without a key can hold nothing. Any other body is read here,
    whole, before the application sees the request, so a body refused on the way is dropped at
    once. A body larger than ``limit`` bytes is refused with 413: at once by its
    Content-Length, or as soon as a chunked body passes the limit. A body holds its part of
    ``budget`` (:mod:`.bodies`) as its bytes arrive, until its response is sent: one whose
    Content-Length does not fit what its principal may still take is refused with 429 before
    it is read (nothing is set aside for it), and one that outgrows it as it arrives is cut
    off with 429, or with 413 if it alone costs more than a principal may hold. A body slower
    than ``pace`` is cut off with 408, and its connection closed. The rest of a body refused
    before it was whole is dropped as it comes, never held (:mod:`.connections`).
    """

    def __init__(
        self,
        app: ASGIApp,
        principals: Principals,
        limit: int,
        budget: BodyBudget,
        *,
        pace: BodyPace | None = None,
        max_headers: int = HTTP_HEADERS,
        principal_metrics: bool = False,
        cors: Callable[[ASGIApp], ASGIApp] | None = None,
    ) -> None:
        self.app, self.principals, self.limit, self.budget = app, principals, limit, budget
        self.pace = pace or BodyPace()
        self.max_headers = max_headers
        self.principal_metrics = principal_metrics  # --metrics-principals: name each principal in /metrics
        # Within the limits, so that a preflight is held to them as any request is; before the
        # key, which a browser's preflight never carries.
        self._admit: ASGIApp = self._keyed if cors is None else cors(self._keyed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        visit = _Visit(scope, send)
        try:
            await self._serve(visit, receive)
        finally:
            if visit.held:
                self.budget.give(visit.held, visit.owner)
                metrics.HTTP_BODY_BYTES.set(self.budget.in_use)
            visit.record(self.principal_metrics)

    async def _serve(self, visit: _Visit, receive: Receive) -> None:
        scope = visit.scope
        if len(scope.get("headers") or ()) > self.max_headers:
            return await visit.refuse(
                HTTPError(431, f"the request has more than {self.max_headers} header fields", code="limit"), visit.reply
            )
        if (_open(scope["path"]) or scope["method"] in _BODILESS_METHODS) and _declares_body(scope):
            return await visit.refuse(
                HTTPError(413, f"{scope['method']} {scope['path']} takes no body", code="limit"), visit.reply
            )
        scope[_VISIT] = visit
        await self._admit(scope, receive, visit.reply)

    async def _keyed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The rest of a request past the limits and CORS: its key, then its body. ``send``
        is CORS's (its headers added), which ends in the visit's own."""
        visit: _Visit = scope[_VISIT]
        headers = dict(scope.get("headers") or [])
        open_path = _open(scope["path"])
        if not open_path:
            principal = _authenticated(headers, self.principals) if self.principals.required else ANONYMOUS
            if principal is None:
                return await visit.refuse(HTTPError(401, "a valid API key is needed: Authorization: Bearer KEY"), send)
            visit.principal = principal
            if self.principals.required:
                scope[_PRINCIPAL] = principal
        if open_path or scope["method"] in _BODILESS_METHODS:
            return await self.app(scope, receive, send)
        body = await self._read_body(visit, headers, receive)
        if isinstance(body, HTTPError):
            return await visit.refuse(body, send)
        if body is None:
            return None
        whole = [body]

        async def replay() -> Message:
            if whole:  # the body once, whole; then whatever the client does next
                return {"type": "http.request", "body": whole.pop(), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read_body(
        self, visit: _Visit, headers: dict[bytes, bytes], receive: Receive
    ) -> bytes | HTTPError | None:
        """The whole body, its cost held in the budget; or the error to refuse it with; or None
        if its caller left."""
        visit.owner = _owner(visit.scope)
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return self._too_large()
        if length is not None and int(length) > 0:
            error = self._fits(visit, int(length))
            if error is not None:
                return error
        loop = asyncio.get_running_loop()
        started = loop.time()
        chunks: list[bytes] = []
        received = 0
        while True:
            try:  # wait_for, not asyncio.timeout_at: the server runs on Python 3.10 too
                left = max(0.0, self.pace.deadline(started, received) - loop.time())
                message = await asyncio.wait_for(receive(), left)
            except asyncio.TimeoutError:
                return self._too_slow(received, loop.time() - started)
            if message["type"] != "http.request":
                visit.status = 499  # the client left before its body was whole: no one to answer
                return None
            chunk = message.get("body", b"")
            received += len(chunk)
            error = self._too_large() if received > self.limit else self._hold(visit, chunk) if chunk else None
            if error is not None:
                return error
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one chunk is passed on without a copy

    def _fits(self, visit: _Visit, amount: int) -> HTTPError | None:
        """The error if ``amount`` more would not fit what ``visit``'s principal may still hold."""
        if visit.held + amount > self.budget.per_principal:
            return HTTPError(
                413,
                f"the request body would take about {_mib(visit.held + amount)} of memory once "
                f"parsed (its bytes, and {COMMA_COST} bytes for each comma, {OBJECT_COST} for each "
                f"'{{' and {ARRAY_COST} for each '['); this server holds at most "
                f"{_mib(self.budget.per_principal)} of one caller's bodies at once: send fewer inputs "
                "per request",
                code="limit",
            )
        if not self.budget.fits(amount, visit.owner):
            return HTTPError(
                429,
                f"the server holds as many request bodies as it can at once "
                f"({_mib(self.budget.total)}, {_mib(self.budget.per_principal)} of one caller's); "
                "retry later",
                code="busy",
            )
        return None

    def _hold(self, visit: _Visit, chunk: bytes) -> HTTPError | None:
        """Take what ``chunk`` costs for this body; the error if it does not fit."""
        amount = len(chunk) + parse_cost(chunk)
        error = self._fits(visit, amount)
        if error is not None:
            return error
        self.budget.take(amount, visit.owner)  # it fits: _fits checked both bounds
        visit.held += amount
        metrics.HTTP_BODY_BYTES.set(self.budget.in_use)
        return None

    def _too_large(self) -> HTTPError:
        return HTTPError(
            413, f"the request body is larger than this server's limit of {self.limit} bytes", code="limit"
        )

    def _too_slow(self, received: int, seconds: float) -> HTTPError:
        pace = self.pace
        return HTTPError(
            408,
            f"the request body was not whole in time: {received} bytes in {seconds:.1f} s; this "
            f"server takes a body in at most {pace.timeout_s:g} s, at {pace.min_rate} bytes/s or "
            "faster",
            code="timeout",
        )


class _Visit:
    """One request as the front sees it: whom it counts to, what it holds, and how it was answered."""

    def __init__(self, scope: Scope, send: Send) -> None:
        self.scope, self._send = scope, send
        self.started = time.perf_counter()
        self.status = 500
        self.principal: str | None = None  # its metrics label, once its key is checked
        self.owner = ""  # whose share of the body budget it takes from
        self.held = 0  # what it holds of the budget
        self.closing = False  # too slow: the connection closes after the answer

    async def reply(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            if self.closing:
                message = {**message, "headers": [*message.get("headers", []), _CLOSE]}
        await self._send(message)

    async def refuse(self, error: HTTPError, send: Send) -> None:
        """Answer ``error`` through ``send`` (:meth:`reply`, or a layer's around it), and none
        of the body the application sees. The connection reads and drops the body's rest for a
        while (:mod:`.connections`), so that a caller still sending reads its answer; one too
        slow (408) is closed at once."""
        self.closing = error.status == 408

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        await error_response(self.scope["path"], error)(self.scope, nothing, send)

    def record(self, by_principal: bool) -> None:
        route = self.scope.get("route")
        endpoint = getattr(route, "path", None) or "other"
        metrics.HTTP_REQUESTS.labels(endpoint, str(self.status)).inc()
        metrics.HTTP_SECONDS.labels(endpoint).observe(time.perf_counter() - self.started)
        if by_principal and self.principal is not None:
            metrics.HTTP_PRINCIPAL_REQUESTS.labels(self.principal, str(self.status)).inc()


def _open(path: str) -> bool:
    """Whether ``path`` is served without an API key."""
    return path in _OPEN_PATHS or path in _DOCS_PATHS or path.startswith(_DOCS_PREFIX)


def _declares_body(scope: Scope) -> bool:
    for name, value in scope.get("headers") or ():
        if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return True
    return False


def _authenticated(headers: dict[bytes, bytes], principals: Principals) -> str | None:
    """The name of the principal whose key the request's ``Authorization: Bearer`` holds."""
    scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
    return principals.authenticate(token.strip()) if scheme.lower() == b"bearer" else None


def _owner(scope: Scope) -> str:
    """Whose share of the body budget a request takes from: as :func:`caller` counts it."""
    name = scope.get(_PRINCIPAL)
    if name is not None:
        return "key:" + name
    client = scope.get("client")
    return "address:" + (client[0] if client else "unknown")


def caller(request: Request) -> str:
    """Whom the server's bounds and turns count an encode request to: its API key's principal,
    or without keys its peer address (never the body's ``user``, and never a forwarded header
    but from an address ``--forwarded-allow-ips`` lists)."""
    return _owner(request.scope)


def http_call(request: Request) -> Call:
    """An HTTP request as the API sees it: its :func:`caller`, and its connection's end."""
    return Call(caller(request), functools.partial(disconnected, request.receive))


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
