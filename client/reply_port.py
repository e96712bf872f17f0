"""Whether the server answers at the client's request port while its ``port_out`` is wrong.

A client sends its requests to the server's request port and reads the answers from its reply
port. With only ``port_out`` wrong, every request reaches the server and every answer goes
where the client does not listen: its handshake goes unanswered, as if no server ran. Once it
has waited :data:`~bertserve.client.probe.PROBE_AFTER_S`, a :class:`ReplyPortCheck` asks what
answers at each port (two :class:`~bertserve.client.probe.PeerProbe`), and the handshake says
that the server runs and what is at ``port_out`` instead of its reply port.
"""

from __future__ import annotations

import time

import zmq

from .probe import PROBE_AFTER_S, REPLY_PORT, REQUEST_PORT, PeerProbe, is_loopback

REPLY_REFUSED_FOR_S = 2.0
"""How long the reply port must accept no connection, while a bertserve server answers at the
request port, to tell that the client's port_out is wrong: a starting server binds its reply
port a second or so after its request port, and so does a sink that restarts."""

_SAYS_NOTHING = "something listens there but says nothing, as no ZeroMQ socket does"
_REPLY_TYPES = (None, "XPUB", "PUB")  # what a client's SUB may read replies from (None: not told, as under CURVE)


class ReplyPortCheck:
    """Tells whether a bertserve server answers at ``address`` (on ``host``) while nothing, or
    something else, answers at ``address_out``, where its client reads the replies.

    Once a handshake has waited :data:`~bertserve.client.probe.PROBE_AFTER_S`, it opens a
    context of its own (the client's sockets belong to its transport) and a ``PeerProbe`` of
    each address. A server answers at the request port if a ZeroMQ socket that may be a
    ``PULL`` does there (its type is told under NULL security only); a reply port answers if
    one that may be an ``XPUB`` or a ``PUB`` does, and then there is no verdict. Anything else
    at the reply port is the verdict at once; nothing there is the verdict once nothing
    accepted a connection for :data:`REPLY_REFUSED_FOR_S`. :meth:`close` is idempotent.
    """

    def __init__(self, host: str, address: str, address_out: str) -> None:
        self._ipv6, self._local = ":" in host, is_loopback(host)
        self._addresses = (address, address_out)
        self._context: zmq.Context | None = None
        self._probes: list[PeerProbe] = []  # of the request port, then of the reply port
        self._started = 0.0
        self._server: bool | None = None  # whether a bertserve server answers at the request port
        self._found: str | None = None  # what answers at the reply port instead, as far as told
        self.deciding = True  # until it has its verdict, or knows it has none
        self.verdict: str | None = None

    def look(self, waited_s: float) -> str | None:
        """The :attr:`verdict`, asked by a client that has waited ``waited_s`` for an answer:
        what answers at the reply port instead of a server's reply port (``nothing listens
        there``, say), once told for sure while a server answers at the request port."""
        if self.deciding and waited_s >= PROBE_AFTER_S:
            now = time.monotonic()
            if self._context is None:
                self._context, self._started = zmq.Context(), now
                self._probes = [self._probe(address, now) for address in self._addresses]
            else:
                self._advance(now)
        return self.verdict

    def final(self) -> str | None:
        """The verdict as far as told, for a handshake that was never answered: what answers at
        the reply port, if a server answers at the request port and no reply port answers."""
        if not self.deciding or not self._server:
            return self.verdict
        if self._found is None and self._probes[1].connected:
            return _SAYS_NOTHING  # so far
        return self._found or ("nothing listens there" if self._local else "nothing accepted a connection there")

    def close(self) -> None:
        """Stop looking and close the sockets; calling it again does nothing."""
        self.deciding = False
        probes, self._probes = self._probes, []
        for probe in probes:
            probe.close()
        context, self._context = self._context, None
        if context is not None:
            context.term()

    def _probe(self, address: str, now: float) -> PeerProbe:
        assert self._context is not None
        return PeerProbe(self._context, address, ipv6=self._ipv6, now=now)

    def _advance(self, now: float) -> None:
        request, reply = self._probes
        request.advance(now)
        reply.advance(now)
        if request.done and self._server is None:
            peer = request.peer
            self._server = peer is not None and peer.zeromq and peer.instead_of(REQUEST_PORT) is None
        ended = reply.done and (reply.connected or now - self._started >= REPLY_REFUSED_FOR_S)
        a_reply_port = False
        if reply.done and reply.connected:
            peer = reply.peer
            a_reply_port = peer is not None and peer.zeromq and peer.socket_type in _REPLY_TYPES
            if not a_reply_port:
                self._found = peer.instead_of(REPLY_PORT) if peer is not None else _SAYS_NOTHING
        elif reply.done and not ended:  # nothing there yet: look again
            self._probes[1] = self._probe(self._addresses[1], now)
        if a_reply_port or self._server is False or (self._server and ended):
            verdict = None if a_reply_port else self.final()
            self.close()
            self.verdict = verdict
