"""The memory HTTP request bodies may hold at once: one budget for the whole HTTP process.

A body holds memory from its first byte until its response is sent: as bytes, then as the
Python objects its JSON parses into, then as the request sent on to the ventilator. The
objects can take far more than the bytes (a JSON list of two-letter strings takes about 14
times its size: each element is a 50-byte ``str`` and an 8-byte pointer, from 5 bytes of
JSON; a list of empty objects about 24 times), so a body is counted as its bytes plus
:data:`COMMA_COST` for each comma (every JSON value but the first follows one),
:data:`OBJECT_COST` for each ``{`` and :data:`ARRAY_COST` for each ``[``. Such characters
inside strings are counted too. Measured with ``tracemalloc`` against ``json.loads``, the
count is 1.1 to 4 times what parsing makes, for lists of strings, numbers, arrays and
objects nested as deep as one likes: an upper bound, with room for what the objects' owners
add.
"""

from __future__ import annotations

COMMA_COST = 64
"""What one JSON value can take once parsed, beyond its bytes (an empty list: 56 + 8)."""
OBJECT_COST = 232
"""What a JSON object takes once parsed beyond its entries (a small ``dict``)."""
ARRAY_COST = 88
"""What a JSON array takes once parsed beyond its elements (a ``list`` and its spare room)."""


def parse_cost(chunk: bytes) -> int:
    """What a piece of a body counts against the budget beyond its bytes."""
    return COMMA_COST * chunk.count(b",") + OBJECT_COST * chunk.count(b"{") + ARRAY_COST * chunk.count(b"[")


class BodyBudget:
    """A count of what the bodies in flight hold, up to ``total``; one per HTTP process, used
    from its event loop only (so it needs no lock)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.in_use = 0

    def take(self, amount: int) -> bool:
        """Take ``amount`` if it fits; False (and nothing taken) if it does not."""
        if self.in_use + amount > self.total:
            return False
        self.in_use += amount
        return True

    def give(self, amount: int) -> None:
        """Give back ``amount`` taken earlier."""
        self.in_use = max(0, self.in_use - amount)
