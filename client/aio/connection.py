"""The asyncio driver of the client core: an ``AsyncBertClient``'s connection to one server,
each wait on the event loop and bounded by the timeout.

:meth:`AsyncConnection.open` opens an :class:`~bertserve.client.aio.transport.AsyncTransport`
and runs the :class:`~bertserve.client.core.handshake.Handshake` over it, once for every task
that asks meanwhile; a handshake that fails leaves the connection unopened, to try again.
:meth:`AsyncConnection.request` sends one request framed by the
:class:`~bertserve.client.core.base.ClientCore` and awaits the future its reply is handed to;
a caller that gives up (cancelled, or out of time) withdraws a sent ENCODE from the server.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import zmq

from ..core.base import ClientCore
from ..core.options import model_field
from ..core.results import answer
from ..errors import BertClientError, ClientClosedError
from ..protocol import CONFIG, ENCODE, ProtocolError, Reply
from ..reply_port import ReplyPortCheck
from .transport import AsyncTransport, TimedOut

logger = logging.getLogger("bertserve.client")


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class AsyncConnection:
    """The connection of one ``AsyncBertClient`` to the server ``core`` names; it belongs to
    the event loop it opened on."""

    def __init__(self, core: ClientCore) -> None:
        self.core = core
        self.state = _State.UNOPENED
        self.transport: AsyncTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Lock | None = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self.state is _State.CLOSED

    # -- connecting --------------------------------------------------------------------

    async def open(self) -> AsyncTransport:
        """The open transport, connecting first if need be (one handshake for every caller)."""
        loop = asyncio.get_running_loop()
        if self.state is _State.CLOSED:
            raise ClientClosedError("this AsyncBertClient is closed")
        if self._loop is not None and loop is not self._loop:
            raise BertClientError("an AsyncBertClient belongs to the event loop it connected on; make one per loop")
        if self.state is _State.OPEN and self.transport is not None and not self.transport.closed:
            return self.transport
        self._loop = loop
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self.state is _State.UNOPENED:
                await self._handshake()
        if self.state is not _State.OPEN or self.transport is None:
            raise ClientClosedError("this AsyncBertClient is closed")
        return self.transport

    async def _handshake(self) -> None:
        """Open the sockets and run the handshake over them; leave the connection open, or the
        transport closed if it failed."""
        options = self.core.options
        try:
            transport = AsyncTransport(options.host, options.port, options.port_out, options.identity, options.curve)
        except zmq.ZMQError as exc:
            raise self.core.cannot_connect(exc) from exc
        transport.start()
        self.transport = transport
        opened = False
        try:
            config = await self._first_config(transport)
            transport.window.fit(config)  # as many requests in flight as the server queues replies
            if options.check_version:
                self.core.check_server(stacklevel=4)  # past _handshake, open and encode or connect: their caller
            opened = True
        finally:
            if not opened:
                self.transport = None
                transport.close("the connection failed")
                await transport.wait_closed()
        if self.state is _State.CLOSED:  # closed while connecting
            transport.close("this AsyncBertClient was closed")
            return
        self.state = _State.OPEN
        if options.show_server_config:
            logger.info("server config of %s:\n%s", self.core.address, json.dumps(config, indent=2))

    async def _first_config(self, transport: AsyncTransport) -> dict[str, Any]:
        """The config of the client's model, asked for again every
        :data:`~bertserve.client.core.handshake.RESEND_S` until an answer comes through (the
        subscription takes a moment to reach the server)."""
        handshake = self.core.handshake(time.monotonic())
        reply_port = ReplyPortCheck(self.core.options.host, transport.address, transport.address_out)
        asked: dict[int, asyncio.Future[Reply]] = {}
        try:
            while True:
                now = time.monotonic()
                until = handshake.wait_until(now, transport.refusal, reply_port)
                request_id, future = transport.expect()
                asked[request_id] = future
                frames = self.core.frames(handshake.command, request_id, handshake.header)
                await transport.send(request_id, frames, handshake.deadline)
                done, _ = await asyncio.wait(asked.values(), timeout=until - now, return_when=asyncio.FIRST_COMPLETED)
                if done:
                    return self.core.connected(handshake, done.pop().result())
                refusal = transport.refusal(certain_only=True)
                handshake.unanswered(time.monotonic(), refusal, transport.nobody_listens, reply_port)
        finally:
            reply_port.close()
            transport.stop_probing()
            for request_id in asked:
                transport.forget(request_id)  # a late answer to one of them is dropped

    async def ask_config(self, model: str | None) -> dict[str, Any]:
        """The config of ``model`` (``None``: the server's default), asked for afresh and kept."""
        return self.core.learn(model, answer(await self.request(CONFIG, "CONFIG", model_field(model))))

    async def config_of(self, model: str | None) -> dict[str, Any]:
        """The config of ``model`` (``None``: the server's default) as last told: asked for the
        first time a request goes to it, then kept, so its options are checked against it."""
        known = self.core.known_config(model)
        return known if known is not None else await self.ask_config(model)

    # -- requests ----------------------------------------------------------------------

    async def request(
        self, command: bytes, what: str, header: dict[str, Any] | None = None, texts: Sequence[Any] = ()
    ) -> Reply:
        """Send one request and await its reply, at most ``timeout`` ms (``what`` names it in a
        timeout). If the caller gives up (cancelled, or out of time) a sent ENCODE is withdrawn
        from the server."""
        transport = await self.open()
        timeout = self.core.timeout
        request_id = transport.book.new_id()
        try:
            frames = self.core.frames(command, request_id, header, texts)
            withdraw = self.core.cancel_frames(request_id) if command == ENCODE else None
            return await transport.exchange(request_id, frames, time.monotonic() + timeout / 1000, withdraw)
        except TimedOut as exc:
            queue = "" if exc.sent else " (the send queue stayed full)"
            raise self.core.timeout_error(f"{what} {request_id}{queue}", transport.refusal(), timeout) from None
        except ProtocolError as exc:
            raise self.core.malformed(exc) from exc
        except zmq.ZMQError as exc:
            if self.closed:
                raise ClientClosedError("this AsyncBertClient was closed while the call was sent") from None
            raise self.core.zmq_failed(exc) from exc

    # -- closing -----------------------------------------------------------------------

    def close(self) -> None:
        """Fail the calls in flight with :class:`ClientClosedError` and close the sockets;
        calling it again does nothing."""
        if self.state is _State.CLOSED:
            return
        self.state = _State.CLOSED
        if self.transport is not None:
            self.transport.close("this AsyncBertClient was closed while the call waited for its answer")

    async def wait_closed(self) -> None:
        """Wait for the reader task to end, after :meth:`close`."""
        if self.transport is not None:
            await self.transport.wait_closed()
