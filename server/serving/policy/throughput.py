"""What the workers get through, and whether one more bulk request can be served in time.

Bulk admission (``--bulk-slowdown``) asks: if this request is taken now, does it, and does
every bulk request taken before it, still finish within S times what it takes an idle
server? The answer rests on what is measured here:

- **capacity**: sentences per second of one worker's busy time on bulk jobs (the time it lent
  to small jobs left out), smoothed, times the workers serving;
- **small work's share**: of the workers' busy time over the last seconds, what small jobs
  took. Small jobs go first, except that bulk work, while it waits, keeps at least
  :data:`BULK_SHARE` of the workers' time;
- **small work's load**: of all the workers' time over the last seconds, idle time included,
  what small jobs took. Bulk work gets what small work leaves, and at least its share, so it
  is planned at the capacity times the larger of ``1 - load`` and :data:`BULK_SHARE`. Time,
  not sentences, is what is shared: small jobs run fewer sentences per second than bulk ones.

What is measured can still be wrong about what comes: small work arriving after a bulk
request was taken takes more of the time than the share measured then. So the finish time of
each bulk request taken is projected when it is taken and compared with when it is done (or
expires): bulk work is planned at the measured rate divided by the **lag**, how much longer
than projected recent bulk requests took, smoothed (quick to rise, slow to fall).

Turns are round-robin between clients, each client's bulk requests in the order it sent them,
so a bulk request whose client has ``ahead`` sentences of bulk work up to and including it
finishes once those have run and, of each other client's bulk work, at most as much
(:func:`late_bulk`). Taking a request of another client adds to that only where the other
client's bulk work was less than ``ahead``.

Everything takes the time as an argument, so tests drive it with a fake clock.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

_WINDOW_S = 10
"""Seconds of the workers' recent time the small work's share is taken over."""

LEAST_BOUND_S = 1.0
"""No bulk request is refused for a projected time under this: the projection counts model
time only, and below a second the messages around each job weigh as much."""

BULK_SHARE = 0.25
"""The least share of the workers' time bulk work gets while it waits, however much small
work comes: small jobs go first otherwise."""

LAG_LIMITS = (0.75, 4.0)
"""The least and the most the lag is taken to be: one late request never stops bulk work."""

_EXPECTED_MAX = 1024
"""Projections kept at most: those of requests that ended otherwise (cancelled, failed) go first."""


@dataclass
class Throughput:
    """The measured speed of the workers, and how their time is shared between small and bulk work."""

    per_worker: float | None = None  # sentences per busy second of one worker on bulk jobs, smoothed
    workers: int = 0  # workers serving
    held: int = 0  # sentences of the jobs the workers hold now: they run before anything queued
    lag: float = 1.0  # how much longer than projected bulk requests take, smoothed
    _busy: deque[list[float]] = field(default_factory=deque)  # [second, small seconds, bulk seconds] of worker time
    _expected: OrderedDict[str, tuple[float, float]] = field(default_factory=OrderedDict)  # key: (taken at, seconds)

    def serving(self, workers: int, held: int) -> None:
        """The workers serving now, and the sentences of the jobs they hold (told by dispatch)."""
        self.workers, self.held = workers, held

    def job_done(self, sentences: int, seconds: float, *, bulk: bool, now: float) -> None:
        """A worker ran ``sentences`` of a job in ``seconds`` of its own time (time lent to
        small jobs that overtook it left out: they report their own)."""
        if bulk and sentences > 0 and seconds > 0:
            rate = sentences / seconds
            self.per_worker = rate if self.per_worker is None else 0.8 * self.per_worker + 0.2 * rate
        second = float(int(now))
        if not self._busy or self._busy[-1][0] != second:
            self._busy.append([second, 0.0, 0.0])
        self._busy[-1][2 if bulk else 1] += max(0.0, seconds)
        while self._busy and self._busy[0][0] <= second - _WINDOW_S:
            self._busy.popleft()

    def small_share(self, now: float) -> float:
        """The share of the workers' busy time small jobs took over the last ten seconds."""
        since = now - _WINDOW_S
        small = sum(entry[1] for entry in self._busy if entry[0] > since)
        bulk = sum(entry[2] for entry in self._busy if entry[0] > since)
        return small / (small + bulk) if small + bulk > 0 else 0.0

    def small_load(self, now: float) -> float:
        """The share of all the workers' time (idle time too) small jobs took over the last ten seconds."""
        if not self.workers:
            return 0.0
        since = now - _WINDOW_S
        return min(1.0, sum(entry[1] for entry in self._busy if entry[0] > since) / (self.workers * _WINDOW_S))

    def bulk_due(self, now: float) -> bool:
        """Whether waiting bulk work goes before small work: it has had less than its least share."""
        return 1.0 - self.small_share(now) < BULK_SHARE

    def capacity(self) -> float | None:
        """Sentences per second all the workers get through on bulk work; ``None`` until measured."""
        if self.per_worker is None or not self.workers:
            return None
        return self.per_worker * self.workers

    def bulk_rate(self, now: float) -> float | None:
        """What bulk work gets of the capacity: what small work leaves of the workers' time (idle
        time included), and at least its least share; divided by the lag."""
        capacity = self.capacity()
        if capacity is None:
            return None
        return capacity * max(BULK_SHARE, 1.0 - self.small_load(now)) / self.lag

    def describe(self, now: float) -> dict[str, float | None]:
        """What bulk admission plans with, for STATUS."""
        capacity, rate = self.capacity(), self.bulk_rate(now)
        return {
            "capacity_sentences_per_s": None if capacity is None else round(capacity, 1),
            "small_share": round(self.small_share(now), 3),
            "small_load": round(self.small_load(now), 3),
            "bulk_lag": round(self.lag, 3),
            "bulk_sentences_per_s": None if rate is None else round(rate, 1),
        }

    def expect(self, key: str, seconds: float, now: float) -> None:
        """Bulk request ``key``, taken at ``now``, is projected to be done in ``seconds`` (at :meth:`bulk_rate`)."""
        self._expected[key] = (now, max(seconds / self.lag, LEAST_BOUND_S))  # as if the lag were 1
        while len(self._expected) > _EXPECTED_MAX:
            self._expected.popitem(last=False)

    def finished(self, key: str, now: float) -> None:
        """Request ``key`` is done or expired: if it is a bulk request projected, the lag learns from it."""
        taken = self._expected.pop(key, None)
        if taken is None:
            return
        ratio = min(max((now - taken[0]) / taken[1], LAG_LIMITS[0]), LAG_LIMITS[1])
        self.lag += (0.5 if ratio > self.lag else 0.1) * (ratio - self.lag)


@dataclass(frozen=True)
class QueuedBulk:
    """A bulk request in its client's lane: sentences still to run, and when it must be done."""

    client: bytes
    rows: int
    due: float


def bulk_seconds(lanes: dict[bytes, list[QueuedBulk]], new: QueuedBulk, *, extra: int, rate: float) -> float:
    """Seconds until ``new``, queued at the end of its client's lane, is done (as :func:`late_bulk` counts)."""
    ahead = sum(item.rows for item in lanes.get(new.client, [])) + new.rows
    shared = sum(min(sum(item.rows for item in items), ahead) for other, items in lanes.items() if other != new.client)
    return (extra + ahead + shared) / rate


def late_bulk(
    lanes: dict[bytes, list[QueuedBulk]], new: QueuedBulk, *, extra: int, rate: float, now: float
) -> QueuedBulk | None:
    """The first bulk request that would finish after its ``due`` time if ``new`` were queued
    at the end of its client's lane (``new`` itself, or one it makes later); ``None`` if none.

    ``lanes``: each client's queued bulk requests, in order. ``extra``: sentences that run
    before any of them (jobs handed back by lost workers). ``rate``: sentences per second
    that bulk work gets."""
    totals = {client: sum(item.rows for item in items) for client, items in lanes.items()}
    with_new = {**totals, new.client: totals.get(new.client, 0) + new.rows}
    queued = {**lanes, new.client: [*lanes.get(new.client, []), new]}
    for client, items in queued.items():
        ahead = 0
        for item in items:
            ahead += item.rows
            if item is not new and client == new.client:
                continue  # queued before it in its own lane: untouched by it
            shared = sum(min(rows, ahead) for other, rows in with_new.items() if other != client)
            if item is not new:
                before = sum(min(rows, ahead) for other, rows in totals.items() if other != client)
                if shared == before:
                    continue  # its client's share of the turns is not changed by the new request
            if now + (extra + ahead + shared) / rate > item.due:
                return item
    return None
