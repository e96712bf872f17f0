"""The HTTP connections the process keeps: how many at once, how large a request's headers
may be, and how long they may take to arrive.

uvicorn's h11 protocol bounds the size of a request's headers (``h11_max_incomplete_event_size``),
but only while they are not whole: a request line and headers that come whole in one read
(one packet of 60 KB, say) pass whatever their size. Its httptools protocol bounds nothing, so
the HTTP process runs h11. Neither bounds the time headers take, and uvicorn's
``limit_concurrency`` answers 503 only once an excess connection has sent its headers, so it
holds the connection until then. :class:`BoundedH11Protocol` adds all three, at the connection:

- a request's line and headers larger than ``h11_max_incomplete_event_size`` (uvicorn's
  option: ``--max-http-header-bytes``) are answered ``400`` and the connection closed, however
  their bytes arrive: as h11 holds them before they are whole, and as they are once whole
  (each line counted with its CRLF; the whitespace h11 trims around a value is not counted,
  and is not held past the read that brought it);
- a connection past ``max_connections`` is answered ``503`` with ``Retry-After`` and closed as
  soon as it is accepted, before anything of it is read;
- a request's headers must be whole within ``header_timeout_s`` of the connection opening, or
  of the first byte of the next request on a kept-alive connection; else ``408`` and close.
  The body's own pace is the front's (:class:`~.bodies.BodyPace`); an idle kept-alive
  connection is uvicorn's (``timeout_keep_alive``);
- the rest of a body the front refused unread is dropped for ``discard_timeout_s`` at most.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..config.http import HTTP_CONNECTIONS, HTTP_HEADER_BYTES, HTTP_HEADER_TIMEOUT_S

logger = logging.getLogger("bertserve.http")


def _answer(status: str, text: str) -> bytes:
    """A whole HTTP/1.1 answer of ``text`` that closes the connection, written before any request is read."""
    body = text.encode() + b"\n"
    head = f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    return (
        head.encode()
        + b"retry-after: 1\r\n" * status.startswith("503")
        + b"content-length: %d\r\n\r\n" % len(body)
        + body
    )


_BUSY = _answer("503 Service Unavailable", "the server has as many connections as it takes")
_SLOW = _answer("408 Request Timeout", "the request's headers were not whole in time")


@dataclass(frozen=True)
class ConnectionLimits:
    """What one HTTP process keeps of its connections."""

    max_connections: int = HTTP_CONNECTIONS
    header_timeout_s: float = HTTP_HEADER_TIMEOUT_S
    discard_timeout_s: float = 60.0  # the body of a request answered early is read and dropped this long at most


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with a cap on connections and deadlines on what it waits for.

    A request answered before its body was whole (a 413 by its Content-Length, say) keeps its
    connection while uvicorn reads and drops the rest, so that the caller reads its answer
    (closing at once would reset the connection under a caller still sending), but only for
    ``discard_timeout_s``. uvicorn makes one protocol per connection with its own arguments
    only, so the limits are a class attribute: :func:`bounded_protocol` makes the class."""

    limits = ConnectionLimits()
    _timer: asyncio.TimerHandle | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _HeadBoundConnection(self.config.h11_max_incomplete_event_size or HTTP_HEADER_BYTES)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            logger.warning(
                "refused an HTTP connection: %d are open, the most --max-http-connections allows",
                len(self.connections) - 1,
            )
            self.transport.write(_BUSY)
            self.transport.close()
            return
        self._deadline(self.limits.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            if self.conn.trailing_data[0]:  # a request's first bytes: its headers' clock starts
                self._deadline(self.limits.header_timeout_s)
        elif not self._discarding():
            self._stop_timer()  # headers whole: the body's pace is the front's

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._stop_timer()  # idle until the next request: uvicorn's keep-alive timeout
        if self._discarding():
            self._deadline(self.limits.discard_timeout_s)
        elif self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._deadline(self.limits.header_timeout_s)  # a pipelined request's first bytes are in already

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def _discarding(self) -> bool:
        """Whether the request was answered and its body's rest is being dropped."""
        return self.conn.their_state is h11.SEND_BODY and self.conn.our_state in (h11.DONE, h11.MUST_CLOSE)

    def _deadline(self, seconds: float) -> None:
        if self._timer is None and not self.transport.is_closing():
            self._timer = self.loop.call_later(seconds, self._late)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self) -> None:
        """Headers not whole, or a dropped body not done, in time: close (saying why if nothing was answered)."""
        self._timer = None
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
            self.transport.write(_SLOW)
        self.transport.close()


class _HeadBoundConnection(h11.Connection):
    """h11's server side, its bound on a request's line and headers held when they come whole
    in one read too: h11 checks its buffer only while it waits for more."""

    def __init__(self, max_head_bytes: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self.max_head_bytes = max_head_bytes

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        event = super().next_event()
        if isinstance(event, h11.Request) and _head_bytes(event) > self.max_head_bytes:
            # uvicorn answers a RemoteProtocolError 400 and closes, as it does for headers that
            # outgrow h11's buffer before they are whole: the same answer however they came.
            raise h11.RemoteProtocolError(
                f"the request's line and headers are larger than {self.max_head_bytes} bytes", error_status_hint=431
            )
        return event


def _head_bytes(request: h11.Request) -> int:
    """The bytes of ``request``'s line and headers, each line with its CRLF, and the blank line."""
    line = len(request.method) + len(request.target) + len(request.http_version) + 9  # "M T HTTP/V\r\n"
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers) + 2  # "N: V\r\n", "\r\n"


def bounded_protocol(limits: ConnectionLimits) -> type[BoundedH11Protocol]:
    """The protocol class uvicorn runs (``uvicorn.Config(http=...)``) for ``limits``."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"limits": limits})
