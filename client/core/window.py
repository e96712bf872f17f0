"""How many requests a client keeps in flight: at most what the server's reply queue holds.

The server queues at most ``reply_hwm`` replies for one connection (its ``CONFIG`` says how
many) and drops what comes past that, so a client that reads its replies late, an asyncio
program busy elsewhere, say, loses replies if it has more requests in flight than that. A
client that never has more requests unanswered than the queue holds cannot lose one, however
late it reads: the queue always has room for every reply it can be sent.

:class:`ReplyWindow` counts the requests a client's connection may still be answered on, with
no sockets and the clock passed in. The sync transport reads replies while it is full;
:class:`~bertserve.client.aio.places.AsyncPlaces` queues the sends of an event loop (the
asyncio client's, the HTTP front end's) for its places, first come first.

A request holds its place from the moment it is sent until its reply arrives. One whose
caller gave up (out of time, or cancelled) still gets a reply from the server (its error, or
the vectors nobody reads), so it keeps its place until that reply comes, or for
:data:`ABANDONED_GRACE_S` if it never does (the server restarted and forgot it).
"""

from __future__ import annotations

from typing import Any

DEFAULT_SIZE = 100
"""The window before the server's ``CONFIG`` says otherwise: bertserve's default ``reply_hwm``."""
MAX_SIZE = 100_000
"""The largest window taken from a server's ``CONFIG``, whatever it says."""
ABANDONED_GRACE_S = 10.0
"""How long a request given up on keeps its place while its reply has not come."""


def window_size(config: dict[str, Any]) -> int:
    """The window a server's ``CONFIG`` answer asks for: its ``reply_hwm``, or the default
    when it names none or a value that is not a positive int."""
    size = config.get("reply_hwm")
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        return min(size, MAX_SIZE)
    return DEFAULT_SIZE


class ReplyWindow:
    """The places of one connection's requests that the server may still answer."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self._sent: set[int] = set()  # sent, reply not yet in
        self._abandoned: dict[int, float] = {}  # given up, reply not yet in: until when it keeps its place
        self._reserved = 0  # places promised to senders that have not sent yet

    def fit(self, config: dict[str, Any]) -> None:
        """Take the size a server's ``CONFIG`` answer asks for (:func:`window_size`)."""
        self.size = window_size(config)

    def __len__(self) -> int:
        return len(self._sent) + len(self._abandoned) + self._reserved

    def has_room(self, now: float) -> bool:
        """Whether one more request may be sent now (forgetting abandoned requests whose grace ran out)."""
        if len(self) >= self.size and self._abandoned:
            self._abandoned = {rid: until for rid, until in self._abandoned.items() if until > now}
        return len(self) < self.size

    def reserve(self) -> None:
        """Promise a place to a sender that will :meth:`sent` (or :meth:`unreserve`) later."""
        self._reserved += 1

    def unreserve(self) -> None:
        """Give back a place promised by :meth:`reserve` that was not used."""
        self._reserved = max(0, self._reserved - 1)

    def sent(self, request_id: int, *, reserved: bool = False) -> None:
        """``request_id`` went out (``reserved``: in a place :meth:`reserve` promised)."""
        if reserved:
            self.unreserve()
        self._sent.add(request_id)

    def answered(self, request_id: int) -> bool:
        """A reply to ``request_id`` came (or it was never sent): its place is free; whether it held one."""
        if request_id in self._sent:
            self._sent.discard(request_id)
            return True
        return self._abandoned.pop(request_id, None) is not None

    def abandoned(self, request_id: int, now: float) -> None:
        """The caller gave up on ``request_id``: it keeps its place until its reply comes, at
        most :data:`ABANDONED_GRACE_S` from ``now``."""
        if request_id in self._sent:
            self._sent.discard(request_id)
            self._abandoned[request_id] = now + ABANDONED_GRACE_S
