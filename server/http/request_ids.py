"""Each HTTP request's id: the caller's ``X-Request-Id`` when it is a sane one, else a new
one; sent back in the response's ``X-Request-Id`` and named by every log line written while
the request is served (uvicorn's access line included: it is written from the request's own
task), through :data:`..logs.REQUEST_ID`."""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..logs import REQUEST_ID

HEADER = b"x-request-id"
_SANE = re.compile(rb"[A-Za-z0-9._:-]{1,128}")  # what a caller's id may be: anything else is replaced


class RequestIds:
    """Plain ASGI: gives each HTTP request its id (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or ()).get(HEADER, b"")
        request_id = given.decode() if _SANE.fullmatch(given) else uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
