"""One client's queued work in the scheduler (:mod:`.scheduler`): its small lane, short
requests first, and its bulk lane, each in arrival order; and how a merged job shares its
rows among the clients' small lanes (:func:`merge_shares`)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .jobs import Job, Piece


@dataclass
class BulkRequest:
    """A bulk request in its client's queue; ``jobs`` is ``None`` until it is cut."""

    request: Piece
    jobs: deque[Job] | None = None
    due: float = float("inf")  # when it should be done (--bulk-slowdown)

    @property
    def rows(self) -> int:  # its sentences still queued
        return len(self.request.rows) if self.jobs is None else sum(job.size for job in self.jobs)


@dataclass
class ClientQueue:
    """One client's queued work: its small pieces (its short requests first) and its bulk
    requests, each in arrival order."""

    small: deque[Piece] = field(default_factory=deque)
    bulk: deque[BulkRequest] = field(default_factory=deque)
    sentences: int = 0  # in both lanes
    small_rows: int = 0  # in the small lane
    shorts: int = 0  # the pieces of short requests, at the front of the small lane

    @property
    def empty(self) -> bool:
        return not self.small and not self.bulk

    def add_small(self, piece: Piece, short: bool) -> None:
        if short:
            self.small.insert(self.shorts, piece)
            self.shorts += 1
        else:
            self.small.append(piece)

    def pop_small(self) -> Piece:
        self.shorts = max(0, self.shorts - 1)
        return self.small.popleft()

    def oldest_small(self) -> float:  # when the longest-waiting small piece arrived
        longer = self.small[self.shorts] if 0 < self.shorts < len(self.small) else self.small[0]
        return min(self.small[0].arrived, longer.arrived)

    def drop_small(self, keys: set[str]) -> list[Piece]:
        """Leave the pieces of requests ``keys`` out of the small lane; returns them."""
        self.shorts = sum(1 for i, piece in enumerate(self.small) if i < self.shorts and piece.key not in keys)
        gone = [piece for piece in self.small if piece.key in keys]
        self.small = deque(piece for piece in self.small if piece.key not in keys)
        return gone


def merge_shares(
    heads: dict[bytes, int], demands: dict[bytes, int], *, room: int, queued: int, short: int
) -> list[tuple[bytes, int]]:
    """The rows each client waiting gets in a merged job of at most ``room`` rows: ``heads``
    the rows of the request at the head of each client's small lane, in turn order (the first
    is the client whose turn it is), ``demands`` each client's small rows queued, ``queued``
    all small rows queued, ``short`` the most rows of a short request.

    First the short requests at the heads of the lanes go in whole, smallest first, so a
    request of a few sentences is answered by the next job; but the client whose turn it is
    keeps room for its share. Then, when what waits does not fit, each client gets an equal
    share, no larger than the lightest client's demand (but at least a quarter of an equal
    split): a client with 32 sentences queued beside one with 100,000 is not held up by the
    other's rows. A request larger than a share is split, the rest going in a later job; a
    short one waits whole."""
    waiting = list(heads)
    first = waiting[0]
    share = room
    if len(waiting) > 1 and queued > room:
        lightest = min(demands.values())
        share = max(1, min(room // len(waiting), max(lightest, room // (4 * len(waiting)))))
    limit = max(share, short)  # what goes in whole
    reserve = min(share, heads[first]) if heads[first] > limit else 0  # the turn's share
    whole, left = {}, room
    for client in sorted(waiting, key=heads.__getitem__):
        rows = heads[client]
        if rows > min(left - (reserve if client != first else 0), limit):
            break
        whole[client], left = rows, left - rows
    shares = [(c, max(share, whole[c])) for c in waiting if c in whole]  # in turn order
    rest = [c for c in waiting if c not in whole and (heads[c] > limit or not whole)]
    return shares + [(c, share) for c in rest]
