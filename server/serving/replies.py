"""How the sink's replies reach their clients: published by topic, or routed by key.

Every reply starts with the client id it is addressed to (``frames[0]``). Two sockets can
carry it, chosen once at start by :func:`open_replies`:

- :class:`Published`, without CURVE: an ``XPUB`` with ``XPUB_MANUAL``. Clients ``SUB`` to
  their own id; the sink applies a subscription only if its topic is 1 to 64 bytes (never
  the empty topic that reads every reply). Nothing is authenticated here: the server trusts
  every process that can reach it, and binds to loopback by default. bert-as-service's own
  client, which only speaks SUB, is answered on this path.
- :class:`Routed`, under CURVE: a ``ROUTER``. A client connects a ``DEALER`` with a random
  16-byte routing id and sends ``[ANNOUNCE, topic]``; the sink reads that message's
  authenticated ``User-Id`` and adds a route from the topic to that connection only if the
  topic is a client id of the announcing key (``<key>:<suffix>``). A reply goes to the
  connections whose announced topic is a prefix of its client id. Each route is taken from
  one message's own routing id and ``User-Id``: nothing is paired by the order of messages,
  so what any other peer sends, on any socket, cannot move a reply to another key. (libzmq's
  ``XPUB_MANUAL`` applies ``SUBSCRIBE`` to the pipe of the last *subscription* read, and
  other upstream messages shift that pairing: it cannot carry a per-key check.)

Both bound what they hold: a subscriber's or a connection's queue holds at most
``reply_hwm`` replies (a client that does not read loses its own replies), the route table
has a bound per key (one key's announcements evict only its own routes), and a reply whose
client has not connected yet waits at most :data:`HOLD_S`, within a byte budget.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import zmq
from bertserve.client import protocol as p
from bertserve.client.security import CURVE_KEY_LENGTH

from ..config import ServerConfig
from ..logs import Refusals
from ..security import (
    MAX_TOPIC_BYTES,
    CurveServerKeys,
    handle_subscription,
    make_curve_server,
    message_user_id,
    route_allowed,
)
from . import legacy

logger = logging.getLogger("bertserve.sink.replies")

HOLD_S = legacy.HOLD_S
"""Longest a reply waits for its client's connection (subscription or route) to reach the sink."""

MAX_INBOUND_BYTES = 1024
"""Largest frame a client may send on the reply port: a subscription or an announcement is
at most 65 bytes, so a larger frame (and the connection that sent it) is dropped unread.
libzmq applies the limit to the handshake's messages too, and CURVE's INITIATE with a
DEALER's metadata (its socket type and 16-byte routing id) is past 256 bytes."""

MAX_ROUTES_PER_KEY = 4096
"""Topics remembered per CURVE key; past it that key's oldest routes are forgotten."""

MAX_CONNECTIONS_PER_TOPIC = 8
"""Connections remembered per topic (one client's reconnections, clients sharing an id)."""

ROUTE_ID_BYTES = 16
"""A client's routing id on the reply port: random, so no other peer can take it over."""

_MAX_HELD = 1000
_MAX_HELD_BYTES = 64 << 20  # replies waiting for their client's connection, all together
_REFUSAL_LOG_S = 1.0


class Replies(Protocol):
    """What the sink needs of its reply socket."""

    socket: zmq.Socket  # poll it for POLLIN: subscriptions or announcements

    def read(self) -> None:
        """Handle every subscription or announcement waiting on :attr:`socket`."""

    def send(self, frames: list[Any], *, held: bool = False) -> None:
        """Send one reply, addressed to ``frames[0]``, or drop it if its client cannot be reached;
        ``held``: it waits for its client's subscription (see :mod:`.legacy`)."""

    def release_due(self, now: float) -> None:
        """Send or drop the held replies that waited :data:`HOLD_S`."""

    def flush(self) -> None:
        """Send what is held, as the sink stops."""

    def close(self) -> None: ...


def open_replies(config: ServerConfig, context: zmq.Context, keys: CurveServerKeys | None) -> Replies:
    """The reply socket of ``config`` (``Routed`` under CURVE, else ``Published``), bound
    to ``config.port_out``; ``keys`` are the server's CURVE keys, with an authenticator
    already running in ``context``."""
    replies: Replies = Published(context, config) if keys is None else Routed(context, config, keys)
    try:
        replies.socket.bind(f"tcp://{config.bind}:{config.port_out}")
    except BaseException:
        replies.close()
        raise
    return replies


class _Held:
    """Replies whose client has not connected yet, each waiting at most :data:`HOLD_S`,
    at most ``_MAX_HELD`` of them and ``_MAX_HELD_BYTES`` in all."""

    def __init__(self) -> None:
        self.items: list[tuple[float, bytes, list[Any]]] = []  # (due, client id, frames), oldest first
        self.nbytes = 0

    def add(self, frames: list[Any], now: float | None = None) -> bool:
        size = _nbytes(frames)
        if len(self.items) >= _MAX_HELD or self.nbytes + size > _MAX_HELD_BYTES:
            return False
        self.items.append(((time.monotonic() if now is None else now) + HOLD_S, bytes(frames[0]), frames))
        self.nbytes += size
        return True

    def take(self, wanted: Callable[[float, bytes], bool]) -> list[list[Any]]:
        """The held replies for which ``wanted(due, client_id)`` holds, removed."""
        taken = [item for item in self.items if wanted(item[0], item[1])]
        if taken:
            self.items = [item for item in self.items if not wanted(item[0], item[1])]
            self.nbytes -= sum(_nbytes(frames) for _, _, frames in taken)
        return [frames for _, _, frames in taken]


def _nbytes(frames: list[Any]) -> int:
    """The bytes of a reply's frames (a frame may be an array's buffer, whose ``len`` is its rows)."""
    return sum(memoryview(frame).nbytes for frame in frames)


class Published:
    """Replies by topic on an ``XPUB_MANUAL``: the server without CURVE."""

    def __init__(self, context: zmq.Context, config: ServerConfig) -> None:
        self.socket = context.socket(zmq.XPUB)
        self.socket.linger = 1000
        self.socket.sndhwm = config.reply_hwm  # per subscriber: a client that does not read loses its own replies
        self.socket.maxmsgsize = MAX_INBOUND_BYTES
        self.socket.setsockopt(zmq.XPUB_MANUAL, 1)
        self._legacy = legacy.Publisher(self.socket)  # bert-as-service's client asks before it subscribes

    def read(self) -> None:
        for _ in range(1000):
            try:
                frame = self.socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if handle_subscription(self.socket, frame):  # logs what it refuses
                self._legacy.subscribed(frame.bytes[1:])

    def send(self, frames: list[Any], *, held: bool = False) -> None:
        if held:  # its client subscribes late (bert-as-service's): wait for the subscription
            self._legacy.send(frames)
        else:
            self.socket.send_multipart(frames, copy=False)

    def release_due(self, now: float) -> None:
        self._legacy.release_due(now)

    def flush(self) -> None:
        self._legacy.flush()

    def close(self) -> None:
        self.socket.close()


def _key_of(topic: bytes) -> bytes:
    """The key a routed topic belongs to: its first :data:`CURVE_KEY_LENGTH` bytes (a z85 key
    may itself hold a ``:``, so the topic is never split at its first colon)."""
    return topic[:CURVE_KEY_LENGTH]


class Routed:
    """Replies routed to the connections of the key that owns them, on a CURVE ``ROUTER``."""

    def __init__(self, context: zmq.Context, config: ServerConfig, keys: CurveServerKeys) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 1000
        self.socket.sndhwm = config.reply_hwm  # per connection
        self.socket.maxmsgsize = MAX_INBOUND_BYTES
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone connection raises, so its routes go
        # A connection that died without closing is found within seconds, so the client's new
        # one (same routing id) is not refused as a duplicate for long.
        self.socket.heartbeat_ivl = 2000
        self.socket.heartbeat_timeout = 6000
        make_curve_server(self.socket, keys)
        # key -> {topic: None}, oldest first; topic -> {routing id: None}; routing id -> its topics
        self._topics_of_key: dict[bytes, OrderedDict[bytes, None]] = {}
        self._routes: dict[bytes, OrderedDict[bytes, None]] = {}
        self._topics_of_route: dict[bytes, set[bytes]] = {}
        self._held = _Held()
        self._refusals = Refusals(logger, _REFUSAL_LOG_S)

    # -- announcements -------------------------------------------------------------------

    def read(self) -> None:
        for _ in range(1000):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._on_message(frames)

    def _on_message(self, frames: list[zmq.Frame]) -> None:
        route = frames[0].bytes
        if len(frames) != 3 or frames[1].bytes != p.ANNOUNCE:
            self._refusals.log("ignoring a message on the reply port that is not an announcement (%d frames)",
                               len(frames))  # fmt: skip
            return
        topic = frames[2].bytes
        user_id = message_user_id(frames[2])
        if len(route) != ROUTE_ID_BYTES or route[0] == 0:
            self._refusals.log("refused an announcement from a connection without a random %d-byte routing id",
                               ROUTE_ID_BYTES)  # fmt: skip
            return
        if not route_allowed(user_id, topic):
            self._refusals.log("refused an announcement of %r from %s", topic[:MAX_TOPIC_BYTES],
                               user_id or "an unknown key")  # fmt: skip
            return
        self._add_route(_key_of(topic), topic, route)
        for held in self._held.take(lambda _, client_id: client_id.startswith(topic)):
            self._route(held)

    def _add_route(self, key: bytes, topic: bytes, route: bytes) -> None:
        topics = self._topics_of_key.setdefault(key, OrderedDict())
        topics[topic] = None
        topics.move_to_end(topic)
        while len(topics) > MAX_ROUTES_PER_KEY:
            self._forget_topic(topics.popitem(last=False)[0])
        routes = self._routes.setdefault(topic, OrderedDict())
        routes[route] = None
        routes.move_to_end(route)
        self._topics_of_route.setdefault(route, set()).add(topic)
        while len(routes) > MAX_CONNECTIONS_PER_TOPIC:
            old = routes.popitem(last=False)[0]
            self._unlink(old, topic)

    def _forget_topic(self, topic: bytes) -> None:
        for route in self._routes.pop(topic, {}):
            self._unlink(route, topic)

    def _unlink(self, route: bytes, topic: bytes) -> None:
        topics = self._topics_of_route.get(route)
        if topics is not None:
            topics.discard(topic)
            if not topics:
                del self._topics_of_route[route]

    def _forget_route(self, route: bytes) -> None:
        """A connection that is gone: drop every route to it."""
        for topic in self._topics_of_route.pop(route, set()):
            routes = self._routes.get(topic)
            if routes is None:
                continue
            routes.pop(route, None)
            if not routes:
                del self._routes[topic]
                key = _key_of(topic)
                if (topics := self._topics_of_key.get(key)) is not None:
                    topics.pop(topic, None)
                    if not topics:
                        del self._topics_of_key[key]

    def routes_to(self, client_id: bytes) -> list[bytes]:
        """The connections a reply to ``client_id`` goes to: those whose announced topic is
        a prefix of it (ZeroMQ's topic rule; at most 64 lookups)."""
        if client_id[CURVE_KEY_LENGTH : CURVE_KEY_LENGTH + 1] != b":":
            return []
        found: list[bytes] = []
        for end in range(CURVE_KEY_LENGTH + 2, min(len(client_id), MAX_TOPIC_BYTES) + 1):
            routes = self._routes.get(client_id[:end])
            if routes:
                found.extend(routes)
        return found

    # -- replies -------------------------------------------------------------------------

    def send(self, frames: list[Any], *, held: bool = False) -> None:
        # bert-as-service's client has no keys, so under CURVE it never gets this far.
        if not self._route(frames) and not self._held.add(frames):
            logger.debug("dropped a reply to %r: its client is not connected", bytes(frames[0])[:MAX_TOPIC_BYTES])

    def _route(self, frames: list[Any]) -> bool:
        """Send ``frames`` to every connection of their client; whether there was one."""
        routes = self.routes_to(bytes(frames[0]))
        for route in routes:
            try:
                self.socket.send_multipart([route, *frames], zmq.NOBLOCK, copy=False)
            except zmq.Again:  # that connection's queue is full: its client does not read
                logger.debug("dropped a reply to a connection that is not reading")
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                self._forget_route(route)
        return bool(routes)

    def release_due(self, now: float) -> None:
        if not self._held.items or self._held.items[0][0] > now:
            return
        for frames in self._held.take(lambda due, _: due <= now):
            if not self._route(frames):
                logger.debug("dropped a reply to %r: its client never connected", bytes(frames[0])[:MAX_TOPIC_BYTES])

    def flush(self) -> None:
        self.release_due(float("inf"))

    def close(self) -> None:
        self.socket.close()
