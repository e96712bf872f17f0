"""The memory and time HTTP request bodies may take: one budget for the whole HTTP process,
shared out per principal, and a pace every body must keep.

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

A body takes its part of the budget as its bytes arrive, never by the ``Content-Length`` it
declares: a caller that declares much and sends nothing holds nothing. One principal holds
at most its share (:attr:`BodyBudget.per_principal`), so another always finds room; and a
body that arrives slower than its :class:`BodyPace` allows is cut off, giving its part back.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """A count of what the bodies in flight hold, up to ``total`` in all and ``per_principal``
    (by default ``total``) for the bodies of one principal; one per HTTP process, used from its
    event loop only (so it needs no lock)."""

    def __init__(self, total: int, per_principal: int | None = None) -> None:
        self.total = total
        self.per_principal = min(total, per_principal if per_principal is not None else total)
        self.in_use = 0
        self._held: dict[str, int] = {}

    def fits(self, amount: int, principal: str = "") -> bool:
        """Whether ``amount`` more for ``principal`` fits both bounds now (nothing is taken)."""
        return self.in_use + amount <= self.total and self.held_by(principal) + amount <= self.per_principal

    def take(self, amount: int, principal: str = "") -> bool:
        """Take ``amount`` for ``principal`` if it fits both bounds; False (and nothing taken) if not."""
        if not self.fits(amount, principal):
            return False
        self.in_use += amount
        self._held[principal] = self.held_by(principal) + amount
        return True

    def give(self, amount: int, principal: str = "") -> None:
        """Give back ``amount`` that ``principal`` took earlier."""
        self.in_use = max(0, self.in_use - amount)
        left = self._held.get(principal, 0) - amount
        if left > 0:
            self._held[principal] = left
        else:
            self._held.pop(principal, None)

    def held_by(self, principal: str) -> int:
        """What the bodies of ``principal`` hold now."""
        return self._held.get(principal, 0)


@dataclass(frozen=True)
class BodyPace:
    """How fast a body must arrive: whole within ``timeout_s`` of its headers, and after a
    ``grace_s`` start at ``min_rate`` bytes a second or more on average (0: any rate).

    A caller that trickles a body holds a connection and its share of the budget; this bounds
    how long, without cutting a client that sends at any reasonable speed."""

    timeout_s: float = 60.0
    min_rate: int = 65_536
    grace_s: float = 2.0

    def deadline(self, started: float, received: int) -> float:
        """When a body begun at ``started`` (the event loop's clock) that has ``received``
        bytes so far is cut off unless more arrive."""
        if self.min_rate <= 0:
            return started + self.timeout_s
        return min(started + self.timeout_s, started + self.grace_s + received / self.min_rate)
