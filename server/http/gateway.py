"""The way into the server for the front ends (HTTP today): one asyncio ZeroMQ client of the
ventilator shared by every request in flight.

It is built on the asyncio client's transport
(:class:`~bertserve.client.aio.transport.AsyncTransport`): one PUSH and one reply socket, a
reader that hands each reply to the request waiting for it, and at most as many requests
unanswered as the server queues replies for the connection
(:mod:`bertserve.client.core.window`), so no caller's reply is dropped while the event loop is
busy elsewhere; the others wait their turn, within their deadlines. What the front end adds:
its callers (principals: an API key's name, or without keys a peer address, :mod:`.principals`)
are told apart by their client id, ``<prefix>.<caller hash>``, so the ventilator's per-client
bounds and turns apply to each; the reply socket subscribes to the prefix (under CURVE:
announces it) and so reads the replies of them all. Under CURVE the prefix starts with the
front end's own public key, which the server generated for it and allows.

Its interface knows no front end: a caller is a principal's name (:meth:`Gateway.client_id`),
a request a protocol command, its answer a protocol reply, a failure a :class:`GatewayError`
or :class:`FrameTooLarge`; the HTTP routes (and a gRPC front end the same way) translate them
into their own status codes.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from bertserve.client import protocol as p
from bertserve.client.aio.transport import AsyncTransport, TimedOut
from bertserve.client.core.options import Curve
from bertserve.client.core.requests import check_size, request_frames
from bertserve.client.errors import ClientClosedError

from ..metrics import HTTP_ID_MARK

_HANDSHAKE_RESEND_S = 0.2
_STATUS_TTL_S = 0.25  # readiness probes and /status share one answer this long

GatewayKeys: TypeAlias = Curve
"""The CURVE keys of the front end's connection: the server's public key and its own pair."""


class GatewayError(Exception):
    """The ventilator could not be reached, or did not answer in time."""


class FrameTooLarge(ValueError):
    """A request's frame is larger than the head takes (its ``max_message_bytes``): the head's
    socket would drop it unread, so it is never sent."""


class Gateway:
    """One connection to the ventilator, shared by every request of a front end's process."""

    def __init__(
        self, host: str, port: int, port_out: int, *, keys: GatewayKeys | None = None, mark: bytes = HTTP_ID_MARK
    ) -> None:
        token = os.urandom(3).hex().encode()  # a restarted front end never reads its predecessor's replies
        self.prefix = (keys.public + b":" if keys else b"") + mark + token  # mark: the front end's, for metrics
        self._transport = AsyncTransport(host, port, port_out, self.prefix + b".", keys, shared=True, seen=self._seen)
        self.address = self._transport.address
        self._status: tuple[float, dict[str, Any]] | None = None
        self.config: dict[str, Any] = {}  # the head's CONFIG answer at start: its default model's
        self.closed = False

    def client_id(self, caller: str) -> bytes:
        """The client id of one caller: ``key:NAME`` (an API key's principal), ``address:HOST``
        (without keys), or ``bertserve`` (the front end's own questions)."""
        return self.prefix + b"." + hashlib.blake2b(caller.encode(), digest_size=5).hexdigest().encode()

    async def start(self, timeout_s: float) -> None:
        """Start reading replies, and ask for the server's configuration until it answers
        (the subscription takes a moment to reach the server)."""
        self._transport.start()
        deadline = time.monotonic() + timeout_s
        caller = self.client_id("bertserve")
        while True:
            try:
                reply = await self.request(caller, p.CONFIG, timeout_s=_HANDSHAKE_RESEND_S)
            except GatewayError:
                if time.monotonic() >= deadline:
                    failure = self._transport.refusal()
                    raise GatewayError(
                        f"no bertserve server answered at {self.address} within {timeout_s:g} s"
                        + (f": {failure}" if failure is not None else "")
                    ) from None
                continue
            self._transport.stop_probing()
            if not reply.ok:
                raise GatewayError(f"the server refused its configuration: {reply.header.get('error')}")
            self.config = reply.header
            self._transport.window.fit(reply.header)
            return

    async def close(self) -> None:
        """Fail the requests in flight with :class:`GatewayError` and close the sockets."""
        self.closed = True
        self._transport.close("the front end's connection to the server was closed")
        await self._transport.wait_closed()

    async def request(
        self,
        client_id: bytes,
        command: bytes,
        texts: Sequence[Any] = (),
        *,
        is_tokenized: bool = False,
        options: Mapping[str, Any] | None = None,
        model: str | None = None,
        timeout_s: float,
    ) -> p.Reply:
        """Send one request and wait for its reply; :class:`GatewayError` after ``timeout_s``.

        ``options`` go into an ENCODE header as they are (:data:`~bertserve.client.protocol.ENCODE_OPTIONS`);
        ``model`` names the served model the request is for (``None``: the head's default).
        A request larger than the head takes raises :class:`FrameTooLarge` before it is sent.
        An ENCODE whose wait ends without its reply, timed out or cancelled (its caller
        left), is withdrawn from the server: its queued work is dropped before it runs.
        """
        header: dict[str, Any] = {}
        if command == p.ENCODE:
            header.update(is_tokenized=is_tokenized, show_tokens=False, **(options or {}))
        if model is not None:
            header["model"] = model
        request_id = self._transport.book.new_id()
        frames = request_frames(client_id, command, request_id, header, texts)
        try:
            check_size(frames, self.config)
        except ValueError as exc:
            raise FrameTooLarge(str(exc)) from None
        withdraw = request_frames(client_id, p.CANCEL, request_id) if command == p.ENCODE else None
        try:
            return await self._transport.exchange(request_id, frames, time.monotonic() + timeout_s, withdraw)
        except TimedOut:
            raise GatewayError(f"no answer from the server within {timeout_s:g} s") from None
        except ClientClosedError as exc:
            raise GatewayError(str(exc)) from None

    async def status(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """The server's status (``bertserve status``), at most ``_STATUS_TTL_S`` old."""
        now = time.monotonic()
        if self._status is not None and now - self._status[0] < _STATUS_TTL_S:
            return self._status[1]
        reply = await self.request(self.client_id("bertserve"), p.STATUS, timeout_s=timeout_s)
        if not reply.ok:
            raise GatewayError(str(reply.header.get("error")))
        self._status = (time.monotonic(), reply.header)
        return reply.header

    def _seen(self, reply: p.Reply) -> None:
        """Every reply as it comes: one saying the server began to stop makes a cached "ready" stale."""
        if not reply.ok and reply.header.get("kind") == "shutdown":
            self._status = None
