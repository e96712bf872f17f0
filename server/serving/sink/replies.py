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
``reply_hwm`` replies, the route table has a bound per key (one key's announcements evict
only its own routes), and a reply whose client has not connected yet waits at most
:data:`~.held.HOLD_S`, within a budget per key and one in all (:mod:`.held`). Our clients keep at most
``reply_hwm`` requests unanswered (the ``CONFIG`` answer says how many), so a client that
reads, however late, never finds its queue full. A reply that cannot be queued (its client
stopped reading, or no room was left to hold it) is never dropped in silence: its client is
owed an error naming why (:mod:`.owed`), sent as soon as its connection takes one more
message. Without CURVE the ``XPUB`` is ``XPUB_NODROP``, so a full subscriber makes the send
fail (and be told) rather than vanish; a subscriber that does not read then stalls the
replies on every topic it subscribes to, which the loopback trust model (every local process
is trusted) allows.
"""

from __future__ import annotations

import enum
import logging
from collections import OrderedDict
from typing import Any, Protocol

import zmq
from bertserve.client import protocol as p
from bertserve.client.security import CURVE_KEY_LENGTH

from ...config.server import ServerConfig
from ...logs import Refusals
from ...security import (
    MAX_TOPIC_BYTES,
    CurveServerKeys,
    handle_subscription,
    make_curve_server,
    message_user_id,
    route_allowed,
)
from ..protocol import formats, legacy
from ..protocol.formats import ReplyFormat
from .held import HOLD_S, Held, key_of
from .owed import Owed

logger = logging.getLogger("bertserve.sink.replies")

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

_REFUSAL_LOG_S = 1.0


def socket_hwm(reply_hwm: int) -> int:
    """The reply socket's ``SNDHWM`` that queues ``reply_hwm`` replies for a connection for sure.

    libzmq's sender learns what its peer read only every ``(hwm + 1) // 2`` messages, so a
    queue of ``hwm`` can look full with just over half of it really queued. At
    ``2 * reply_hwm + 1`` it never looks full while ``reply_hwm`` or fewer are.
    """
    return 2 * reply_hwm + 1


def _unread_why(hwm: int) -> str:
    return (
        f"its client's connection already held {hwm} replies it had not read (the server's --reply-hwm); "
        "read replies as they come, or keep fewer requests in flight"
    )


class _Sent(enum.Enum):
    SENT = "sent"
    FULL = "full"  # every connection of its client already holds reply_hwm replies
    NO_ROUTE = "no route"  # its client has not announced a connection


class Replies(Protocol):
    """What the sink needs of its reply socket."""

    socket: zmq.Socket  # poll it for POLLIN: subscriptions or announcements

    def read(self) -> None:
        """Handle every subscription or announcement waiting on :attr:`socket`."""

    def send(self, frames: list[Any], fmt: ReplyFormat = formats.NATIVE) -> None:
        """Send one reply, addressed to ``frames[0]`` and laid out by ``fmt``; if it cannot be
        queued for its client, owe that client an error instead (``fmt.held``: it waits for its
        client's subscription, see :mod:`..protocol.legacy`)."""

    def release_due(self, now: float) -> None:
        """Send or drop the held replies that waited :data:`HOLD_S`, and send the errors owed
        to clients whose connections have room again."""

    def flush(self) -> None:
        """Send what is held, as the sink stops."""

    def close(self) -> None: ...


def open_replies(config: ServerConfig, context: zmq.Context, keys: CurveServerKeys | None) -> Replies:
    """The reply socket of ``config`` (``Routed`` under CURVE, else ``Published``), bound
    to ``config.ports.out``; ``keys`` are the server's CURVE keys, with an authenticator
    already running in ``context``."""
    replies: Replies = Published(context, config) if keys is None else Routed(context, config, keys)
    try:
        replies.socket.bind(f"tcp://{config.ports.bind}:{config.ports.out}")
    except BaseException:
        replies.close()
        raise
    return replies


class Published:
    """Replies by topic on an ``XPUB_MANUAL``: the server without CURVE."""

    def __init__(self, context: zmq.Context, config: ServerConfig) -> None:
        self.socket = context.socket(zmq.XPUB)
        self.socket.linger = 1000
        self.socket.sndhwm = socket_hwm(config.limits.reply_hwm)  # per subscriber
        self.socket.maxmsgsize = MAX_INBOUND_BYTES
        self.socket.setsockopt(zmq.XPUB_MANUAL, 1)
        self.socket.setsockopt(zmq.XPUB_NODROP, 1)  # a full subscriber fails the send, so its client is told
        self._unread_why = _unread_why(config.limits.reply_hwm)
        self._owed = Owed()
        self._refusals = Refusals(logger, _REFUSAL_LOG_S)
        # bert-as-service's client asks before it subscribes
        self._legacy = legacy.Publisher(self.socket, on_full=lambda frames: self._owe(frames, formats.LEGACY))

    def read(self) -> None:
        for _ in range(1000):
            try:
                frame = self.socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if handle_subscription(self.socket, frame):  # logs what it refuses
                self._legacy.subscribed(frame.bytes[1:])

    def send(self, frames: list[Any], fmt: ReplyFormat = formats.NATIVE) -> None:
        if fmt.held:  # its client subscribes late (bert-as-service's): wait for the subscription
            self._legacy.send(frames)
        elif not self._try(frames):
            self._owe(frames, fmt)

    def _try(self, frames: list[Any]) -> bool:
        """Queue ``frames`` for their subscribers; ``False`` if one of them is full (nothing sent)."""
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True

    def _owe(self, frames: list[Any], fmt: ReplyFormat) -> None:
        self._refusals.log("dropped a reply to %r: %s", bytes(frames[0])[:MAX_TOPIC_BYTES], self._unread_why)
        self._owed.add(frames, fmt, self._unread_why)

    def release_due(self, now: float) -> None:
        self._legacy.release_due(now)
        self._owed.pay(self._try, now)

    def flush(self) -> None:
        self._legacy.flush()

    def close(self) -> None:
        self.socket.close()


class Routed:
    """Replies routed to the connections of the key that owns them, on a CURVE ``ROUTER``."""

    def __init__(self, context: zmq.Context, config: ServerConfig, keys: CurveServerKeys) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 1000
        self.socket.sndhwm = socket_hwm(config.limits.reply_hwm)  # per connection
        self._unread_why = _unread_why(config.limits.reply_hwm)
        self._owed = Owed(key_of=key_of)  # one key's owed errors cannot push out another's
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
        self._held = Held()
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
            self._refusals.log(
                "ignoring a message on the reply port that is not an announcement (%d frames)", len(frames)
            )
            return
        topic = frames[2].bytes
        user_id = message_user_id(frames[2])
        if len(route) != ROUTE_ID_BYTES or route[0] == 0:
            self._refusals.log(
                "refused an announcement from a connection without a random %d-byte routing id", ROUTE_ID_BYTES
            )
            return
        if not route_allowed(user_id, topic):
            self._refusals.log(
                "refused an announcement of %r from %s", topic[:MAX_TOPIC_BYTES], user_id or "an unknown key"
            )
            return
        self._add_route(key_of(topic), topic, route)
        for frames, fmt in self._held.take(lambda _, client_id: client_id.startswith(topic)):
            self._deliver(frames, fmt, self._unread_why)

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
                key = key_of(topic)
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

    def send(self, frames: list[Any], fmt: ReplyFormat = formats.NATIVE) -> None:
        # bert-as-service's client has no keys, so under CURVE it never gets this far.
        sent = self._route(frames)
        if sent is _Sent.NO_ROUTE:
            why = self._held.add(frames, fmt)
            if why is not None:
                self._owe(frames, fmt, why)
        elif sent is _Sent.FULL:
            self._owe(frames, fmt, self._unread_why)

    def _deliver(self, frames: list[Any], fmt: ReplyFormat, why_not: str) -> None:
        """Send a reply that waited; owe its client an error (``why_not``) if it cannot go."""
        if self._route(frames) is not _Sent.SENT:
            self._owe(frames, fmt, why_not)

    def _owe(self, frames: list[Any], fmt: ReplyFormat, why: str) -> None:
        self._refusals.log("dropped a reply to %r: %s", bytes(frames[0])[:MAX_TOPIC_BYTES], why)
        self._owed.add(frames, fmt, why)

    def _route(self, frames: list[Any]) -> _Sent:
        """Send ``frames`` to every connection of their client that has room."""
        routes = self.routes_to(bytes(frames[0]))
        sent = False
        for route in routes:
            try:
                self.socket.send_multipart([route, *frames], zmq.NOBLOCK, copy=False)
                sent = True
            except zmq.Again:  # that connection's queue is full: its client does not read
                pass
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                self._forget_route(route)
        if sent:
            return _Sent.SENT
        return _Sent.FULL if any(route in self._topics_of_route for route in routes) else _Sent.NO_ROUTE

    def release_due(self, now: float) -> None:
        if self._held.items and self._held.items[0][0] <= now:
            never = f"its client's connection did not reach the server within {HOLD_S:g} s"
            for frames, fmt in self._held.take(lambda due, _: due <= now):
                self._deliver(frames, fmt, never)
        self._owed.pay(lambda frames: self._route(frames) is _Sent.SENT, now)

    def flush(self) -> None:
        self.release_due(float("inf"))

    def close(self) -> None:
        self.socket.close()
