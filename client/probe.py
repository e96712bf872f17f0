"""Whether anything listens where a client looks for its server, and what.

A ZeroMQ socket whose connection is refused retries in silence, every 100 ms, so a client
with no server to talk to would wait out its whole timeout. On this machine a refusal is
news worth telling at once: nothing listens on that port. :class:`ServerProbe` connects a
``STREAM`` socket to the request port (plain TCP: it sends no ZeroMQ greeting, so a server
never takes it for a client) and reads its monitor. ``EVENT_CONNECTED`` means something
listens, and the client goes on waiting within its timeout; only ``EVENT_CONNECT_RETRIED``
(refused, and tried again) for :data:`REFUSED_FOR_S`, with never a connection, means
nothing does. Waiting that long lets a server that is binding its ports right now be found.

A client starts the probe only once its handshake has gone unanswered for
:data:`PROBE_AFTER_S` (the first ask is often lost while the client's subscription reaches
the server, and the second answered), so a server that is up is connected to exactly as fast
as without it, and sees no probe; an address on another machine is never probed, since a
refusal there may be a firewall's or a restart's.

What listens may still not be a bertserve server's request port: the server's HTTP port, say,
or its reply port. ZeroMQ retries such a handshake in silence too, or never completes it.
Once a handshake has failed (:class:`~bertserve.client.security.HandshakeWatch` tells when),
a :class:`PeerProbe` asks what answers there, on this machine or another. A ZeroMQ socket
greets first (ZMTP 3: ``0xFF``, 8 bytes, ``0x7F``, its version, its security mechanism at a
fixed offset) and, under NULL security, names its socket type in its READY command: a
bertserve server's reply port is an ``XPUB``, its request port a ``PULL``. A peer that says
nothing at first is asked ``HEAD /``, which an HTTP server answers with its status line. What
cannot be told (the socket type behind CURVE, a peer that never says a word) is no verdict.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

PROBE_AFTER_S = 0.3
"""How long a handshake goes unanswered before the client looks whether anything listens."""
REFUSED_FOR_S = 0.4
"""How long connections must have been refused, and never accepted, to tell that nothing listens."""

_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine: ``localhost``, 127.0.0.0/8 or ::1."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ServerProbe:
    """Tells whether anything listens at ``address`` (on ``host``), for a client whose
    sockets belong to ``context``; it opens no socket until first asked, and never one for a
    host other than this machine. :meth:`close` is idempotent; closing the context's sockets
    another way (``destroy``) closes the probe's too."""

    def __init__(self, context: zmq.Context, host: str, address: str) -> None:
        self._context = context
        self._address = address
        self._ipv6 = ":" in host
        self._local = is_loopback(host)
        self._sockets: tuple[zmq.Socket, zmq.Socket] | None = None  # the STREAM and its monitor
        self._started = 0.0
        self._connected = False
        self._refusals = 0

    def nobody_listens(self, waited_s: float) -> bool:
        """Whether the address is on this machine and nothing listens there, asked by a client
        that has waited ``waited_s`` for an answer. The first call after :data:`PROBE_AFTER_S`
        starts probing and says ``False``; later ones say ``True`` once connections have been
        refused for :data:`REFUSED_FOR_S`, and never accepted."""
        if not self._local or self._connected or waited_s < PROBE_AFTER_S:
            return False
        if self._sockets is None:
            self._open()
            return False
        self._drain()
        if self._connected:
            self.close()  # something listens: nothing more to learn
            return False
        return self._refusals >= 2 and time.monotonic() - self._started >= REFUSED_FOR_S

    def close(self) -> None:
        """Stop probing and close its sockets; calling it again does nothing."""
        sockets, self._sockets = self._sockets, None
        if sockets is None:
            return
        stream, monitor = sockets
        if not stream.closed:
            stream.disable_monitor()
        monitor.close(linger=0)
        stream.close(linger=0)

    def _open(self) -> None:
        stream = self._context.socket(zmq.STREAM)
        try:
            stream.setsockopt(zmq.LINGER, 0)
            stream.setsockopt(zmq.IPV6, self._ipv6)
            monitor = stream.get_monitor_socket(_EVENTS)
        except BaseException:
            stream.close(linger=0)
            raise
        monitor.setsockopt(zmq.LINGER, 0)
        self._sockets = (stream, monitor)
        self._started = time.monotonic()
        try:
            stream.connect(self._address)
        except BaseException:
            self.close()
            raise

    def _drain(self) -> None:
        if self._sockets is None:
            return
        monitor = self._sockets[1]
        while monitor.poll(0):
            event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
            if event == zmq.EVENT_CONNECTED:
                self._connected = True
            elif event == zmq.EVENT_CONNECT_RETRIED:
                self._refusals += 1


# -- what answers: a ZeroMQ socket of which kind, an HTTP server, something else ----------


@dataclass(frozen=True)
class Port:
    """One of a bertserve server's ports: what it is called, the flag that sets it, its
    default, and the type of the ZeroMQ socket that answers there under NULL security."""

    name: str
    flag: str
    default: str
    socket_type: str


REQUEST_PORT = Port("request port", "--port", "5555", "PULL")
REPLY_PORT = Port("reply port", "--port-out", "--port + 1", "XPUB")
WORKER_PORT = Port("worker port", "--worker-port", "none", "ROUTER")
_BY_SOCKET_TYPE = {port.socket_type: port for port in (REQUEST_PORT, REPLY_PORT, WORKER_PORT)}


@dataclass(frozen=True)
class Peer:
    """What answered a :class:`PeerProbe`: a ZeroMQ socket (``zeromq``), with its security
    ``mechanism`` and, under NULL security, its ``socket_type``, as far as they were told; or
    something else, which ``said`` a first line (an HTTP server's status line, say)."""

    zeromq: bool
    mechanism: str | None = None
    socket_type: str | None = None
    said: str = ""

    def instead_of(self, port: Port) -> str | None:
        """What answers where ``port`` should, in words; ``None`` if it may well be ``port``
        (a ZeroMQ socket of its type, or one whose type was not told)."""
        if self.zeromq:
            if self.socket_type is None or self.socket_type == port.socket_type:
                return None
            other = _BY_SOCKET_TYPE.get(self.socket_type)
            like = f", as a bertserve server's {other.name} ({other.flag}) does" if other is not None else ""
            return f"a ZeroMQ {self.socket_type} socket answers there{like}"
        if self.said.startswith("HTTP/"):
            return f"an HTTP server answers there ({self.said}), as a bertserve server's --http-port does"
        return f"something that does not speak ZeroMQ answers there: it said {self.said!r}"


PROBE_FOR_S = 1.0
"""How long a :class:`PeerProbe` waits for what answers to tell what it is."""
QUIET_S = 0.15
"""How long a peer says nothing after the connection before it is asked ``HEAD /``: a ZeroMQ
socket greets at once."""

_SIGNATURE = 10  # bytes: 0xFF, 8 bytes of padding, 0x7F
_GREETING = 64  # bytes: the signature, the version (2), the mechanism (20), as-server (1), filler (31)
# This probe's greeting, under NULL security. The signature and the major version go first: a
# ZeroMQ peer then sends the rest of its greeting, its mechanism with it, before it reads the
# rest of this one (which would end a CURVE peer's handshake before it told its mechanism).
_OUR_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)
_SAID_BYTES = 200  # what a peer that does not speak ZeroMQ says is read up to its first line, or this much
_MOST_HEARD = _GREETING + 512  # past a greeting and a READY: what more a peer sends is not read


class PeerProbe:
    """Asks what answers at ``address``, over a ``STREAM`` socket of ``context`` that connects
    at once. :meth:`advance` moves it on without waiting; once :attr:`done`, :attr:`peer` is
    the answer (``None``: it could not tell), and the socket is closed. It speaks only to learn
    what the peer is: the start of a ZeroMQ greeting, or ``HEAD /``. :meth:`close` is idempotent."""

    def __init__(self, context: zmq.Context, address: str, *, ipv6: bool, now: float) -> None:
        self._host = address.removeprefix("tcp://")  # HEAD's Host header: host:port
        self._started = now
        self._id: bytes | None = None  # the STREAM's id of the connection, once made
        self._connected_at = 0.0
        self._heard = bytearray()
        self._sent = 0  # bytes of this probe's greeting sent
        self._asked = False  # HEAD / sent
        self._gone = False  # the peer closed the connection
        self.peer: Peer | None = None
        self.done = False
        self._stream: zmq.Socket | None = context.socket(zmq.STREAM)
        try:
            self._stream.setsockopt(zmq.LINGER, 0)
            self._stream.setsockopt(zmq.IPV6, ipv6)
            self._stream.connect(address)
        except BaseException:
            self.close()
            raise

    def advance(self, now: float) -> None:
        """Read what the peer said and answer it; done once it told what it is, or after
        :data:`PROBE_FOR_S` with what it told by then."""
        if self.done:
            return
        try:
            self._read(now)
            self._answer(now)
        except zmq.ZMQError:  # the connection went away under a send
            self._finish(None)
        if not self.done and now - self._started >= PROBE_FOR_S:
            heard = bytes(self._heard)
            self._finish(Peer(zeromq=True) if heard[:1] == b"\xff" else _said(heard) if heard else None)

    def close(self) -> None:
        """Close the probe's socket; calling it again does nothing."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close(linger=0)

    @property
    def connected(self) -> bool:
        """Whether anything accepted the connection."""
        return self._id is not None

    def _read(self, now: float) -> None:
        assert self._stream is not None
        while len(self._heard) < _MOST_HEARD and self._stream.poll(0):  # a peer that streams is heard so far only
            identity, data = self._stream.recv_multipart(zmq.NOBLOCK)
            if data:
                self._heard += data[: _MOST_HEARD - len(self._heard)]
            elif self._id is None:  # STREAM's notice of the connection
                self._id, self._connected_at = identity, now
            else:  # ... and of its end
                self._gone = True

    def _answer(self, now: float) -> None:
        heard = bytes(self._heard)
        if heard[:1] == b"\xff":  # a ZeroMQ greeting: no other protocol starts so
            self._greeted(heard)
            if not self.done and len(heard) >= _MOST_HEARD:  # a first command longer than any READY
                self._finish(Peer(zeromq=True))
        elif heard:
            if b"\n" in heard or len(heard) >= _SAID_BYTES or self._gone:
                self._finish(_said(heard))
        elif self._gone:
            self._finish(None)  # gone without a word: nothing to tell it by
        elif self._id is not None and not self._asked and now - self._connected_at >= QUIET_S:
            self._send(f"HEAD / HTTP/1.1\r\nHost: {self._host}\r\nConnection: close\r\n\r\n".encode())
            self._asked = True

    def _greeted(self, heard: bytes) -> None:
        """Go on with a ZeroMQ greeting, as far as ``heard`` has it."""
        if self._asked:  # a slow one, greeting after HEAD was sent: its handshake is spoilt
            self._finish(Peer(zeromq=True))
        elif len(heard) < _GREETING:
            if len(heard) >= _SIGNATURE and not self._sent:
                self._send(_OUR_GREETING[: _SIGNATURE + 1])
                self._sent = _SIGNATURE + 1
            if self._gone:
                self._finish(Peer(zeromq=True))
        elif (mechanism := _printable(heard[12:32].rstrip(b"\0"))) != "NULL":
            self._finish(Peer(zeromq=True, mechanism=mechanism))  # CURVE tells its socket type to keys only
        else:
            if self._sent < _GREETING:
                self._send(_OUR_GREETING[self._sent :])  # the peer's READY comes next
                self._sent = _GREETING
            command = _first_command(heard[_GREETING:])
            if command is not None or self._gone:
                self._finish(Peer(zeromq=True, mechanism=mechanism, socket_type=_socket_type(command or b"")))

    def _send(self, data: bytes) -> None:
        assert self._stream is not None and self._id is not None
        self._stream.send_multipart([self._id, data], zmq.NOBLOCK)

    def _finish(self, peer: Peer | None) -> None:
        self.peer, self.done = peer, True
        self.close()


def _said(heard: bytes) -> Peer:
    """A peer that does not speak ZeroMQ, by the first line of what it said."""
    return Peer(zeromq=False, said=_printable(heard.split(b"\n", 1)[0].strip(), 80))


def _printable(data: bytes, most: int = 40) -> str:
    """What a peer sent, as a message may quote it: ASCII, each other character a ``?``, cut short."""
    return "".join(c if c.isprintable() else "?" for c in data.decode("ascii", "replace"))[:most]


def _first_command(data: bytes) -> bytes | None:
    """The body of the ZMTP frame at the start of ``data`` (its flags, then its size in 1 byte,
    or in 8 with the "long" flag), if all of it is there; ``b""`` if it is not a command."""
    start = 9 if data[:1] and data[0] & 0x02 else 2
    if len(data) < start or len(data) < start + (size := int.from_bytes(data[1:start], "big")):
        return None
    return data[start : start + size] if data[0] & 0x04 else b""


def _socket_type(command: bytes) -> str | None:
    """The ``Socket-Type`` property of a READY command's body, if it has one: the command's
    name (its size in 1 byte), then properties, each a name (1 byte of size) and a value (4)."""
    if not command or command[1 : 1 + command[0]] != b"READY":
        return None
    at = 1 + command[0]
    while at < len(command):
        name = command[at + 1 : at + 1 + command[at]]
        at += 1 + command[at]
        size = int.from_bytes(command[at : at + 4], "big")
        value, at = command[at + 4 : at + 4 + size], at + 4 + size
        if name.lower() == b"socket-type":
            return _printable(value)
    return None
