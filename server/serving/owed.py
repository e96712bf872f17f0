"""Errors owed to clients whose replies the sink had to drop, sent once they can be.

A reply is dropped when its client's connection already queues ``reply_hwm`` replies it has
not read (a client that stopped reading), or when it came before its client's connection did
and no room was left to hold it. The client is not left to wait out its timeout in silence:
the sink owes it a small error reply for that request, naming why, and sends it as soon as
the connection takes one more message (the client reads again, or connects). Our clients keep
at most ``reply_hwm`` requests unanswered (:mod:`bertserve.client.window`), so only a client
that stops reading, or another program on the protocol, ever meets this.

What is owed is bounded: at most :data:`MAX_PER_CLIENT` notices for one client id and
:data:`MAX_OWED` in all (past either, the oldest are forgotten), each kept at most
:data:`TTL_S`.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bertserve.client import protocol as p

from .formats import ReplyFormat

MAX_PER_CLIENT = 1000
MAX_OWED = 10_000
TTL_S = 600.0


@dataclass(frozen=True)
class _Notice:
    request_id: int
    format: ReplyFormat
    why: str
    until: float  # forgotten after this

    def frames(self, client: bytes) -> list[Any]:
        return self.format.error(client, self.request_id, f"the server dropped this reply: {self.why}", p.DROPPED)


class Owed:
    """The error replies owed to clients, oldest client first."""

    def __init__(self) -> None:
        self._by_client: OrderedDict[bytes, deque[_Notice]] = OrderedDict()
        self.count = 0

    def add(self, frames: list[Any], fmt: ReplyFormat, why: str, now: float | None = None) -> None:
        """Owe the client of the dropped reply ``frames`` (laid out by ``fmt``) an error saying ``why``."""
        request_id = fmt.request_id_of(frames)
        if request_id is None:
            return  # not a reply to a request: nothing to tell
        client = bytes(frames[0])
        notices = self._by_client.setdefault(client, deque())
        notices.append(_Notice(request_id, fmt, why, (time.monotonic() if now is None else now) + TTL_S))
        self.count += 1
        if len(notices) > MAX_PER_CLIENT:
            notices.popleft()
            self.count -= 1
        while self.count > MAX_OWED:
            oldest = next(iter(self._by_client))
            self._by_client[oldest].popleft()
            self.count -= 1
            if not self._by_client[oldest]:
                del self._by_client[oldest]

    def pay(self, send: Callable[[list[Any]], bool], now: float | None = None) -> None:
        """Send what is owed, each client's notices in order, until ``send`` says a client's
        connection is full (the rest of that client's wait for the next call)."""
        now = time.monotonic() if now is None else now
        for client in list(self._by_client):
            notices = self._by_client[client]
            while notices:
                notice = notices[0]
                if notice.until > now and not send(notice.frames(client)):
                    break
                notices.popleft()
                self.count -= 1
            if not notices:
                del self._by_client[client]
