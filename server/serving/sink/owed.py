"""Errors owed to clients whose replies the sink had to drop, sent once they can be.

A reply is dropped when its client's connection already queues ``reply_hwm`` replies it has
not read (a client that stopped reading), or when it came before its client's connection did
and no room was left to hold it. The client is not left to wait out its timeout in silence:
the sink owes it a small error reply for that request, naming why, and sends it as soon as
the connection takes one more message (the client reads again, or connects). Our clients keep
at most ``reply_hwm`` requests unanswered (:mod:`bertserve.client.core.window`), so only a client
that stops reading, or another program on the protocol, ever meets this.

What is owed is bounded: at most :data:`MAX_PER_CLIENT` notices for one client id (past it,
its oldest are forgotten), :data:`MAX_PER_KEY` for one CURVE key (past it, that key's newest
are not kept, so one key cannot push out another's), and :data:`MAX_OWED` in all (past it,
the oldest are forgotten), each kept at most :data:`TTL_S`. And what paying costs is bounded:
each call tries at most :data:`CLIENTS_PER_PAY` clients, those not reached waiting their turn.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bertserve.client import protocol as p

from ..protocol.formats import ReplyFormat

MAX_PER_CLIENT = 1000
MAX_PER_KEY = 2000
MAX_OWED = 10_000
TTL_S = 600.0
CLIENTS_PER_PAY = 256


@dataclass(frozen=True)
class _Notice:
    request_id: int
    format: ReplyFormat
    why: str
    until: float  # forgotten after this

    def frames(self, client: bytes) -> list[Any]:
        return self.format.error(client, self.request_id, f"the server dropped this reply: {self.why}", p.DROPPED)


class Owed:
    """The error replies owed to clients, in the order their turns to be paid come;
    ``key_of``: the CURVE key a client id belongs to (none: no bound per key)."""

    def __init__(self, key_of: Callable[[bytes], bytes] | None = None) -> None:
        self._by_client: OrderedDict[bytes, deque[_Notice]] = OrderedDict()
        self._key_of = key_of
        self._count_of_key: Counter[bytes] = Counter()
        self.count = 0

    def add(self, frames: list[Any], fmt: ReplyFormat, why: str, now: float | None = None) -> None:
        """Owe the client of the dropped reply ``frames`` (laid out by ``fmt``) an error saying ``why``."""
        request_id = fmt.request_id_of(frames)
        if request_id is None:
            return  # not a reply to a request: nothing to tell
        client = bytes(frames[0])
        if self._key_of is not None and self._count_of_key[self._key_of(client)] >= MAX_PER_KEY:
            return
        notices = self._by_client.setdefault(client, deque())
        notices.append(_Notice(request_id, fmt, why, (time.monotonic() if now is None else now) + TTL_S))
        self._counted(client, 1)
        if len(notices) > MAX_PER_CLIENT:
            notices.popleft()
            self._counted(client, -1)
        while self.count > MAX_OWED:
            oldest = next(iter(self._by_client))
            self._by_client[oldest].popleft()
            self._counted(oldest, -1)
            if not self._by_client[oldest]:
                del self._by_client[oldest]

    def _counted(self, client: bytes, change: int) -> None:
        self.count += change
        if self._key_of is not None:
            key = self._key_of(client)
            self._count_of_key[key] += change
            if self._count_of_key[key] <= 0:
                del self._count_of_key[key]

    def pay(self, send: Callable[[list[Any]], bool], now: float | None = None) -> None:
        """Send what is owed to the next :data:`CLIENTS_PER_PAY` clients, each client's notices
        in order until ``send`` says its connection cannot take one (the rest wait, and that
        client's turn goes to the back)."""
        now = time.monotonic() if now is None else now
        for client in list(itertools.islice(self._by_client, CLIENTS_PER_PAY)):
            notices = self._by_client[client]
            while notices:
                notice = notices[0]
                if notice.until > now and not send(notice.frames(client)):
                    break
                notices.popleft()
                self._counted(client, -1)
            if notices:
                self._by_client.move_to_end(client)
            else:
                del self._by_client[client]
