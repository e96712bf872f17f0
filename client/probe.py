"""Whether anything listens where a client on this machine looks for its server.

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
"""

from __future__ import annotations

import ipaddress
import time

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
