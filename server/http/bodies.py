"""The memory HTTP request bodies may hold at once: one budget for the whole HTTP process.

A body holds memory from its first byte until its response is sent: as bytes, then as the
Python objects its JSON parses into, then as the request sent on to the ventilator. The
objects can take far more than the bytes (a JSON list of two-letter strings takes about 14
times its size: each element is a 50-byte ``str`` and an 8-byte pointer, from 5 bytes of
JSON), so a body is counted as its bytes plus :data:`COMMA_COST` for each comma in it (every
JSON value but the first follows a comma). A comma inside a string is counted too: the
count is an upper bound, never an underestimate of what parsing makes.
"""

from __future__ import annotations

COMMA_COST = 64
"""What one JSON value can take once parsed, beyond its bytes (an empty list: 56 + 8)."""


def parse_cost(chunk: bytes) -> int:
    """What a piece of a body counts against the budget beyond its bytes: its commas."""
    return COMMA_COST * chunk.count(b",")


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
