"""The HTTP front end's way into the server: an asyncio ZeroMQ client of the ventilator.

It speaks the same protocol as ``BertClient``, over one PUSH and one reply socket shared by
every HTTP request in flight: each request gets its own request id, and a reader that the
event loop calls when the reply socket's file descriptor signals hands each reply straight to
the request waiting for it (one loop turn, no task in between). HTTP principals (an API key's
name, or without keys a peer address: :mod:`.principals`) are told apart by their client id,
``<prefix>.<caller hash>``, so the ventilator's per-client bounds and turns apply to each
principal; the reply socket subscribes to the prefix (under CURVE: announces it) and so
reads the replies of them all. Under CURVE the prefix starts with the front end's own public
key, which the server generated for it and allows. Like every client, it keeps at most as many
requests unanswered as the server queues replies for its connection (:mod:`bertserve.client.core.window`),
so no HTTP caller's reply is dropped while the event loop is busy elsewhere; the others wait
their turn, within their deadlines.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
from bertserve.client import __version__, protocol as p
from bertserve.client.aio.places import AsyncPlaces
from bertserve.client.core.requests import check_size
from bertserve.client.core.window import ReplyWindow
from bertserve.client.security import HandshakeWatch, announce, reply_socket

from ..metrics import HTTP_ID_MARK

logger = logging.getLogger("bertserve.http.gateway")

_HANDSHAKE_RESEND_S = 0.2
_STATUS_TTL_S = 0.25  # readiness probes and /status share one answer this long
_SEND_RETRY_S = 0.005
_ANNOUNCE_EVERY_S = 1.0  # while requests wait, the route is announced again this often (CURVE)


@dataclass(frozen=True)
class GatewayKeys:
    """The CURVE keys of the front end's connection: the server's public key and its own pair."""

    server_public: bytes
    public: bytes
    secret: bytes


class GatewayError(Exception):
    """The ventilator could not be reached, or did not answer in time."""


class FrameTooLarge(ValueError):
    """A request's frame is larger than the head takes (its ``max_message_bytes``): the head's
    socket would drop it unread, so it is never sent."""


class Gateway:
    """One connection to the ventilator, shared by every request of the HTTP process."""

    def __init__(self, host: str, port: int, port_out: int, *, keys: GatewayKeys | None = None) -> None:
        token = os.urandom(3).hex().encode()  # a restarted front end never reads its predecessor's replies
        self.prefix = (keys.public + b":" if keys else b"") + HTTP_ID_MARK + token
        bracketed = f"[{host}]" if ":" in host else host
        self.address = f"tcp://{bracketed}:{port}"
        self._context = zmq.Context()
        self._push = self._context.socket(zmq.PUSH)
        self._replies = reply_socket(self._context, self.prefix + b".", routed=keys is not None)
        for sock in (self._push, self._replies):
            sock.linger = 0
            sock.ipv6 = ":" in host
            if keys is not None:
                sock.curve_serverkey = keys.server_public
                sock.curve_publickey = keys.public
                sock.curve_secretkey = keys.secret
        # Until the server first answers: what a failed handshake says, if the wait runs out.
        reply_address = f"tcp://{bracketed}:{port_out}"
        sockets = {self.address: self._push, reply_address: self._replies}
        self._watch: HandshakeWatch | None = HandshakeWatch(sockets, public_key=keys.public if keys else None)
        self._push.connect(self.address)
        self._replies.connect(reply_address)
        self._ids = itertools.count(1)
        self._waiting: dict[tuple[bytes, int], asyncio.Future[p.Reply]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._announcer: asyncio.TimerHandle | None = None
        self._status: tuple[float, dict[str, Any]] | None = None
        self._window = ReplyWindow()  # sized by the head's CONFIG answer at start
        self._places = AsyncPlaces(self._window)
        self._closed = False
        self.config: dict[str, Any] = {}  # the head's CONFIG answer at start: its default model's

    def client_id(self, caller: str) -> bytes:
        """The client id of one HTTP caller: ``key:NAME`` (an API key's principal), ``address:HOST``
        (without keys), or ``bertserve`` (the front end's own questions)."""
        return self.prefix + b"." + hashlib.blake2b(caller.encode(), digest_size=5).hexdigest().encode()

    async def start(self, timeout_s: float) -> None:
        """Start reading replies, and ask for the server's configuration until it answers
        (the subscription takes a moment to reach the server)."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._replies.fileno(), self._read)
        self._keep_announced()
        deadline = time.monotonic() + timeout_s
        caller = self.client_id("bertserve")
        while True:
            try:
                reply = await self.request(caller, p.CONFIG, timeout_s=_HANDSHAKE_RESEND_S)
            except GatewayError:
                if time.monotonic() >= deadline:
                    failure = self._watch.error() if self._watch is not None else None
                    raise GatewayError(
                        f"no bertserve server answered at {self.address} within {timeout_s:g} s"
                        + (f": {failure}" if failure is not None else "")
                    ) from None
                continue
            self._close_watch()
            if not reply.ok:
                raise GatewayError(f"the server refused its configuration: {reply.header.get('error')}")
            self.config = reply.header
            self._window.fit(reply.header)
            return

    def _keep_announced(self) -> None:
        """While requests wait, announce the route again every second: under CURVE a restarted
        sink knows no route until it is told, and an announcement is cheap."""
        if self._waiting:
            announce(self._replies, self.prefix + b".")
            self._read()  # the send can take the descriptor's edge for a reply already in
        assert self._loop is not None
        self._announcer = self._loop.call_later(_ANNOUNCE_EVERY_S, self._keep_announced)

    def _close_watch(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    async def close(self) -> None:
        self._closed = True
        self._places.wake_all()
        self._close_watch()
        if self._announcer is not None:
            self._announcer.cancel()
        if self._loop is not None:
            self._loop.remove_reader(self._replies.fileno())
        for future in self._waiting.values():
            future.cancel()
        self._push.close(linger=0)
        self._replies.close(linger=0)
        self._context.term()

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
        An ENCODE whose wait ends without its reply, timed out or cancelled (its HTTP caller
        left), is withdrawn from the server: its queued work is dropped before it runs.
        """
        header: dict[str, Any] = {"client_version": __version__}
        if command == p.ENCODE:
            header.update(is_tokenized=is_tokenized, show_tokens=False, **(options or {}))
        if model is not None:
            header["model"] = model
        request_id = next(self._ids)
        frames = p.encode_request(client_id, command, request_id, header, texts)
        try:
            check_size(frames, self.config)
        except ValueError as exc:
            raise FrameTooLarge(str(exc)) from None
        key = (client_id, request_id)
        future: asyncio.Future[p.Reply] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        deadline = time.monotonic() + timeout_s
        announce(self._replies, self.prefix + b".")  # under CURVE: where the reply goes, as the sink may be new
        self._read()  # a send can take the descriptor's edge for a reply already in; read it now
        sent = False
        try:
            if not await self._places.take(deadline, lambda: self._closed):
                raise asyncio.TimeoutError
            try:
                await self._send(frames, deadline)
            except BaseException:
                self._places.give_back()
                raise
            self._window.sent(request_id, reserved=True)
            sent = True
            return await asyncio.wait_for(future, max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            if sent and command == p.ENCODE:
                self.cancel(client_id, request_id)
            raise GatewayError(f"no answer from the server within {timeout_s:g} s") from None
        except asyncio.CancelledError:  # wait_for cancels `future` too: a reply is a result
            if sent and command == p.ENCODE and (future.cancelled() or not future.done()):
                self.cancel(client_id, request_id)
            raise
        finally:
            self._waiting.pop(key, None)
            self._window.abandoned(request_id, time.monotonic())  # nothing if its reply came

    def cancel(self, client_id: bytes, request_id: int) -> None:
        """Withdraw a pending ENCODE (``CANCEL``); the server answers nothing anyone waits for.
        When the queue to the server is full the withdrawal is dropped: the request's deadline
        ends it instead."""
        frames = p.encode_request(client_id, p.CANCEL, request_id, {"client_version": __version__})
        try:
            self._push.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            logger.debug("could not withdraw request %d: the queue to the server is full", request_id)

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

    async def _send(self, frames: list[bytes], deadline: float) -> None:
        """ZeroMQ takes a message at once unless the queue to the server is full; then retry
        until ``deadline``."""
        while True:
            try:
                self._push.send_multipart(frames, zmq.NOBLOCK)
                return
            except zmq.Again:
                if time.monotonic() >= deadline:
                    raise asyncio.TimeoutError from None
                await asyncio.sleep(_SEND_RETRY_S)

    def _read(self) -> None:
        """Every reply waiting on the reply socket, each to its request. ZeroMQ's descriptor
        signals edges, so this drains until the socket says nothing is left."""
        while self._replies.poll(0, zmq.POLLIN):
            frames = self._replies.recv_multipart(zmq.NOBLOCK, copy=False)
            try:
                reply = p.decode_reply([frame.buffer for frame in frames])
            except p.ProtocolError as exc:
                logger.warning("ignoring a malformed reply: %s", exc)
                continue
            if self._window.answered(reply.request_id):
                self._places.hand_out()
            if not reply.ok and reply.header.get("kind") == "shutdown":
                self._status = None  # the server began to stop: a cached "ready" is stale
            future = self._waiting.pop((reply.client_id, reply.request_id), None)
            if future is not None and not future.done():
                future.set_result(reply)
