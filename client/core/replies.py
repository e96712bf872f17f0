"""Which reply answers which request, for one client's connection, sans-IO.

A :class:`ReplyBook` numbers the requests, keeps the ones whose replies someone awaits (each
with a tag its driver chooses: what to make of the reply, or the future to hand it to), and
reads each message that comes in: a malformed one is logged and ignored, one addressed to
another client (whose id starts with ours, as the ``SUB`` filter is a prefix) is ignored, and
a reply frees its request's place in the :class:`~bertserve.client.core.window.ReplyWindow`.

The sync driver waits for one of a few requests at a time: a reply to another awaited request
that comes meanwhile is held for later (:meth:`ReplyBook.match`). The asyncio driver hands
each reply to the future of its request (:meth:`ReplyBook.claim`). Either way a reply nobody
awaits any more (its caller gave up) is dropped.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from ..protocol import ProtocolError, Reply, decode_reply
from .window import ReplyWindow

logger = logging.getLogger("bertserve.client")

TagT = TypeVar("TagT")


class ReplyBook(Generic[TagT]):
    """The requests of the client ``identity`` to the server at ``address`` whose replies are
    awaited, each with a tag, and the :attr:`window` of those the server may still answer.

    With ``shared`` the connection is shared by many client ids, each ``identity`` and a
    suffix (the HTTP front end's callers, one id a principal): a reply to any of them is
    read, and its request id, unique over the connection, says which request it answers."""

    def __init__(self, identity: bytes, address: str, *, shared: bool = False) -> None:
        self.identity = identity
        self.shared = shared
        self.address = address
        self.window = ReplyWindow()  # sized by the server's CONFIG once the handshake is done
        self._ids = itertools.count(1)
        self._awaited: dict[int, TagT] = {}
        self._held: dict[int, Reply] = {}  # replies to awaited requests that came while waiting for others

    def new_id(self) -> int:
        """A request id this client has not used."""
        return next(self._ids)

    @property
    def awaited(self) -> Mapping[int, TagT]:
        """The requests whose replies are awaited, with their tags (read-only)."""
        return MappingProxyType(self._awaited)

    def expect(self, request_id: int, tag: TagT) -> None:
        """Await the reply to ``request_id``, tagged ``tag``."""
        self._awaited[request_id] = tag

    def take(self, request_id: int) -> TagT:
        """Stop awaiting ``request_id``, whose reply was collected; its tag."""
        return self._awaited.pop(request_id)

    def give_up(self, request_ids: Iterable[int], now: float) -> None:
        """Stop awaiting ``request_ids``: their replies, if they come, are dropped (each keeps
        its place in :attr:`window` until it does, or its grace from ``now`` runs out)."""
        for request_id in request_ids:
            self._awaited.pop(request_id, None)
            self._held.pop(request_id, None)
            self.window.abandoned(request_id, now)

    def clear(self) -> list[TagT]:
        """Stop awaiting every request (the connection is closing); their tags."""
        tags = list(self._awaited.values())
        self._awaited.clear()
        self._held.clear()
        return tags

    def read(self, frames: Sequence[Any]) -> Reply | None:
        """The reply in the message ``frames``, its place in :attr:`window` freed; ``None`` for
        a malformed message or one addressed to another client."""
        try:
            reply = decode_reply(frames)
        except ProtocolError as exc:
            logger.warning("ignoring a malformed reply from %s: %s", self.address, exc)
            return None
        if not self._ours(reply.client_id):  # another client whose id starts with ours
            return None
        self.window.answered(reply.request_id)
        return reply

    def _ours(self, client_id: bytes) -> bool:
        return client_id.startswith(self.identity) if self.shared else client_id == self.identity

    # -- one wait at a time (the sync driver) ------------------------------------------

    def held(self, wanted: Collection[int]) -> Reply | None:
        """A reply to one of ``wanted`` that came while waiting for another, if any."""
        for request_id in sorted(wanted):
            if request_id in self._held:
                return self._held.pop(request_id)
        return None

    def match(self, reply: Reply, wanted: Collection[int]) -> Reply | None:
        """``reply`` if it answers one of ``wanted``; else ``None``, and it is held for later if
        its request is awaited, or dropped."""
        if reply.request_id in wanted:
            return reply
        if reply.request_id in self._awaited:
            self._held[reply.request_id] = reply
        else:
            logger.debug("dropping a reply nobody waits for: request %d", reply.request_id)
        return None

    # -- a tag per waiter (the asyncio driver) -----------------------------------------

    def claim(self, reply: Reply) -> TagT | None:
        """The tag of the request ``reply`` answers, no longer awaited; ``None`` (and the reply
        dropped) if nobody awaits it."""
        tag = self._awaited.pop(reply.request_id, None)
        if tag is None:
            logger.debug("dropping a reply nobody waits for: request %d", reply.request_id)
        return tag
