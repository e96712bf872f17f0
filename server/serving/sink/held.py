"""Replies whose client has not connected yet, held until it does: bounded in all and per key.

A reply can reach the sink before its client's connection does (a subscription, or under
CURVE an announcement). It waits here at most :data:`~.replies.HOLD_S`, within a budget per
CURVE key (so one key cannot fill the room others need) and one in all; a reply past either
bound is not held, and :mod:`.replies` owes its client an error instead.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from bertserve.client.security import CURVE_KEY_LENGTH

from ..protocol import legacy
from ..protocol.formats import ReplyFormat

HOLD_S = legacy.HOLD_S
"""Longest a reply waits for its client's connection (subscription or route) to reach the sink."""

MAX_HELD = 1000
MAX_HELD_BYTES = 64 << 20
"""Replies waiting for their clients' connections, all together."""
MAX_HELD_PER_KEY = 100
MAX_HELD_BYTES_PER_KEY = 8 << 20
"""Replies waiting for the connections of one CURVE key: one key cannot fill the shared room."""


def key_of(topic: bytes) -> bytes:
    """The key a routed topic belongs to: its first :data:`CURVE_KEY_LENGTH` bytes (a z85 key
    may itself hold a ``:``, so the topic is never split at its first colon)."""
    return topic[:CURVE_KEY_LENGTH]


class Held:
    """Replies whose client has not connected yet, each waiting at most :data:`HOLD_S`: at
    most :data:`MAX_HELD` of them and :data:`MAX_HELD_BYTES` in all, and at most
    :data:`MAX_HELD_PER_KEY` and :data:`MAX_HELD_BYTES_PER_KEY` for one key."""

    def __init__(self) -> None:
        self.items: list[tuple[float, bytes, list[Any], ReplyFormat]] = []  # (due, client id, frames, format)
        self.nbytes = 0
        self._count_of_key: Counter[bytes] = Counter()
        self._bytes_of_key: Counter[bytes] = Counter()

    def add(self, frames: list[Any], fmt: ReplyFormat, now: float | None = None) -> str | None:
        """Hold ``frames``; ``None`` if held, else why not."""
        size, client = _nbytes(frames), bytes(frames[0])
        key = key_of(client)
        if self._count_of_key[key] >= MAX_HELD_PER_KEY or self._bytes_of_key[key] + size > MAX_HELD_BYTES_PER_KEY:
            return (
                f"it came before its client's connection, and the replies of this key waiting for theirs "
                f"already filled the room one key has ({MAX_HELD_PER_KEY} replies, "
                f"{MAX_HELD_BYTES_PER_KEY >> 20} MiB)"
            )
        if len(self.items) >= MAX_HELD or self.nbytes + size > MAX_HELD_BYTES:
            return "it came before its client's connection, and no room was left to hold it until that came"
        self.items.append(((time.monotonic() if now is None else now) + HOLD_S, client, frames, fmt))
        self.nbytes += size
        self._count_of_key[key] += 1
        self._bytes_of_key[key] += size
        return None

    def take(self, wanted: Callable[[float, bytes], bool]) -> list[tuple[list[Any], ReplyFormat]]:
        """The held replies for which ``wanted(due, client_id)`` holds, removed."""
        taken = [item for item in self.items if wanted(item[0], item[1])]
        if not taken:
            return []
        self.items = [item for item in self.items if not wanted(item[0], item[1])]
        for _, client, frames, _ in taken:
            size, key = _nbytes(frames), key_of(client)
            self.nbytes -= size
            self._count_of_key[key] -= 1
            self._bytes_of_key[key] -= size
            if self._count_of_key[key] <= 0:
                del self._count_of_key[key], self._bytes_of_key[key]
        return [(frames, fmt) for _, _, frames, fmt in taken]


def _nbytes(frames: list[Any]) -> int:
    """The bytes of a reply's frames (a frame may be an array's buffer, whose ``len`` is its rows)."""
    return sum(memoryview(frame).nbytes for frame in frames)
