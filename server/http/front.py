"""The plain ASGI layer every HTTP request passes before the application (:class:`Front`),
and whom the server's bounds and turns count a request to (:func:`caller`)."""

from __future__ import annotations

import time

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import metrics
from .bodies import ARRAY_COST, COMMA_COST, OBJECT_COST, BodyBudget, parse_cost
from .principals import Principals
from .schemas import HTTPError, error_response

_OPEN_PATHS = {"/health", "/ready"}  # probes need no key
# Nor does the API's description, which a browser fetches without the key: the same for every
# server of this version, it holds no model name and no data.
_DOCS_PATHS = {"/docs", "/redoc", "/openapi.json"}
_DOCS_PREFIX = "/docs/"  # the assets of /docs and /redoc, and its OAuth2 redirect page
_PRINCIPAL = "bertserve.principal"  # the scope key of the principal's name, once its API key is checked
ANONYMOUS = "anonymous"  # the metrics' principal label on a server without keys


class Front:
    """What every request passes first, as plain ASGI (no per-request task): the API key and
    its principal, the body limits, and the request's count and time for ``/metrics``.

    The body is read here, whole, before the application sees the request, so a body refused
    on the way is dropped at once (no half-read body lingers in the application's exception
    handling). A body larger than ``limit`` bytes is refused with 413: at once by its
    Content-Length, or as soon as a chunked body passes the limit. Every body also holds its
    part of ``budget`` (:mod:`.bodies`) from its first byte until its response is sent: one
    whose Content-Length does not fit what is left is refused with 429 before it is read, and
    one that outgrows what is left as it arrives (a chunked body, or its commas) is cut off
    with 429, or with 413 if it alone costs more than the whole budget.
    """

    def __init__(self, app: ASGIApp, principals: Principals, limit: int, budget: BodyBudget) -> None:
        self.app, self.principals, self.limit, self.budget = app, principals, limit, budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500
        principal: str | None = None
        held = 0  # what this request holds of the budget

        async def reply(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        def hold(amount: int) -> HTTPError | None:
            """Take ``amount`` more of the budget for this body; the error if it does not fit."""
            nonlocal held
            if held + amount > self.budget.total:
                return HTTPError(413, f"the request body would take about {_mib(held + amount)} of memory once "
                                 f"parsed (its bytes, and {COMMA_COST} bytes for each comma, {OBJECT_COST} for "
                                 f"each '{{' and {ARRAY_COST} for each '['); "
                                 f"this server holds at most {_mib(self.budget.total)} of bodies at once: send "
                                 "fewer inputs per request", code="limit")  # fmt: skip
            if not self.budget.take(amount):
                return HTTPError(429, f"the server holds as many request bodies as it can at once "
                                 f"({_mib(self.budget.total)}); retry later", code="busy")  # fmt: skip
            held += amount
            metrics.HTTP_BODY_BYTES.set(self.budget.in_use)
            return None

        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        too_large = HTTPError(413, f"the request body is larger than this server's limit of {self.limit} bytes",
                              code="limit")  # fmt: skip
        try:
            if not _open(scope["path"]):
                principal = _authenticated(headers, self.principals) if self.principals.required else ANONYMOUS
                if principal is None:
                    unknown = HTTPError(401, "a valid API key is needed: Authorization: Bearer KEY")
                    return await error_response(scope["path"], unknown)(scope, receive, reply)
                if self.principals.required:
                    scope[_PRINCIPAL] = principal
            if length is not None and (not length.isdigit() or int(length) > self.limit):
                return await error_response(scope["path"], too_large)(scope, receive, reply)
            error = hold(int(length)) if length is not None else None
            if error is not None:
                return await error_response(scope["path"], error)(scope, receive, reply)
            chunks: list[bytes] = []
            received = 0
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    status = 499  # the client left before its body was whole: no one to answer
                    return None
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > self.limit:
                    error = too_large
                elif chunk:
                    error = hold(parse_cost(chunk) + (len(chunk) if length is None else 0))
                if error is not None:
                    chunks.clear()
                    return await error_response(scope["path"], error)(scope, receive, reply)
                if chunk:
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            whole = [b"".join(chunks)]  # one chunk is passed on as it is, without a copy
            chunks.clear()

            async def replay() -> Message:
                if whole:  # the body once, whole; then whatever the client does next
                    return {"type": "http.request", "body": whole.pop(), "more_body": False}
                return await receive()

            await self.app(scope, replay, reply)
        finally:
            if held:
                self.budget.give(held)
                metrics.HTTP_BODY_BYTES.set(self.budget.in_use)
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "other"
            metrics.HTTP_REQUESTS.labels(endpoint, str(status)).inc()
            metrics.HTTP_SECONDS.labels(endpoint).observe(time.perf_counter() - started)
            if principal is not None:
                metrics.HTTP_PRINCIPAL_REQUESTS.labels(principal, str(status)).inc()


def _open(path: str) -> bool:
    """Whether ``path`` is served without an API key."""
    return path in _OPEN_PATHS or path in _DOCS_PATHS or path.startswith(_DOCS_PREFIX)


def _authenticated(headers: dict[bytes, bytes], principals: Principals) -> str | None:
    """The name of the principal whose key the request's ``Authorization: Bearer`` holds."""
    scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
    return principals.authenticate(token.strip()) if scheme.lower() == b"bearer" else None


def caller(request: Request) -> str:
    """Whom the server's bounds and turns count an encode request to: its API key's principal,
    or without keys its peer address (never the body's ``user``)."""
    name = request.scope.get(_PRINCIPAL)
    if name is not None:
        return "key:" + name
    return "address:" + (request.client.host if request.client else "unknown")


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
