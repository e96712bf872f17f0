"""One client's queued work in the scheduler (:mod:`.scheduler`): its small lane, short
requests first, and its bulk lane, each in arrival order."""

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
