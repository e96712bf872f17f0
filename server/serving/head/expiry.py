"""Deadlines on the head: the queued work of requests past their deadline is dropped before
any worker gets it, and counted. The sink answers those requests as expired; a worker skips
what it holds of a job whose requests are all past it (:mod:`..worker.worker`).

The one owner of the expiry count and of when the queues are next swept; what expiring a
request does is :meth:`.requests.Requests.expire`'s.
"""

from __future__ import annotations

from ... import metrics
from ..policy.jobs import Job
from .requests import Requests

SWEEP_INTERVAL_S = 0.25  # how often the queues are swept (dispatch checks each job too)


class Expiry:
    def __init__(self, requests: Requests) -> None:
        self.requests = requests
        self.sentences = 0  # queued inputs dropped unrun: their request's deadline had passed
        self._next_sweep = 0.0

    def tick(self, now: float) -> None:
        if now >= self._next_sweep:
            self.sweep(now)

    def sweep(self, now: float) -> None:
        """Forget the requests past their deadline, and drop their queued work."""
        self._next_sweep = now + SWEEP_INTERVAL_S
        self._count(self.requests.expire(now))

    def live(self, job: Job, now: float) -> bool:
        """Leave the pieces of requests past their deadline out of ``job``, so no worker runs
        work nobody awaits; whether anything is left."""
        dropped = job.drop_expired(now)
        if dropped:
            self._count(dropped)
            self.sweep(now)
        return bool(job.pieces)

    def _count(self, sentences: int) -> None:
        self.sentences += sentences
        metrics.EXPIRED_SENTENCES.inc(sentences)
