"""Dispatch: each served model's jobs to its own workers, by credits, small ones overtaking.

A job runs only on a worker of its model and version (two versions run side by side only
while a swap is under way, see :mod:`..versions.swap`). When every credit of a model's workers is
taken, small requests overtake: one model run's worth at a time, to workers that hold only
long jobs (see :mod:`.registry`). The models take turns at being served first, so none
has the first pick of the loop every time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import zmq
from bertserve.client import protocol as p

from ... import metrics, tracing
from ..policy.jobs import Job
from ..policy.scheduler import Scheduler
from ..protocol import wire
from .expiry import Expiry
from .models import HeadModel, Models
from .registry import ANY, Registry, WorkerState

logger = logging.getLogger("bertserve.ventilator")

SendFrames = Callable[[WorkerState, list[Any]], None]
"""Sends a job's frames to a worker; raises ``zmq.ZMQError`` if it cannot be reached."""


class Dispatch:
    def __init__(
        self,
        models: Models,
        registry: Registry,
        expiry: Expiry,
        send: SendFrames,
        lose_worker: Callable[[bytes, str], None],
    ) -> None:
        self.models = models
        self.registry = registry
        self.expiry = expiry
        self.send = send
        self.lose_worker = lose_worker  # a worker found unreachable: its jobs go elsewhere
        self._turn = 0  # which model is served first next time

    def run(self, now: float) -> None:
        """Every job that can go now, model by model."""
        models = list(self.models)
        self._turn = (self._turn + 1) % len(models)
        for model in models[self._turn :] + models[: self._turn]:
            self._model(model, now)

    def _model(self, model: HeadModel, now: float) -> None:
        queue, name = model.scheduler, model.name
        queue.throughput.serving(self.registry.serving_count(name), self.registry.held_rows(name))
        while (worker := self.registry.pick(model=name)) is not None:
            job = queue.next_job(now, idle=not worker.jobs, free_at=self.registry.free_at(worker))
            if job is None:
                break
            if not self.expiry.live(job, now):
                continue
            if job.version != worker.version and (worker := self.registry.pick(job.version, name)) is None:
                queue.put_back(job)  # its version's workers are all busy
                break
            self._send(worker, job, now, queue)
        # Every credit is taken: a worker about to finish its small jobs gets its next one now,
        # and small requests overtake, one model run's worth at a time, on workers that hold
        # only long jobs.
        rows = model.config.model.batch_size
        self._beyond_credits(queue, rows, now, lambda version: self.registry.pick_ahead(now, version, name))
        self._beyond_credits(queue, rows, now, lambda version: self.registry.pick_overtake(rows, version, name))

    def _beyond_credits(
        self, queue: Scheduler, rows: int, now: float, pick: Callable[[object], WorkerState | None]
    ) -> None:
        """Small requests merged, at most ``rows`` a job, each to a worker ``pick(ANY)`` finds
        (``pick(version)``: one of the job's version), beyond its credits."""
        while queue.small_count and (worker := pick(ANY)) is not None:
            job = queue.next_small_job(rows)
            if job is None:
                return
            if not self.expiry.live(job, now):
                continue
            if job.version != worker.version:
                worker = pick(job.version)
                if worker is None:
                    queue.put_back(job)  # its version's workers cannot take it yet
                    return
            self._send(worker, job, now, queue)

    def _send(self, worker: WorkerState, job: Job, now: float, queue: Scheduler) -> None:
        frames = [wire.JOB, job.job_id.encode(), p.dumps(job.header(now)), p.dumps(job.texts)]
        try:
            self.send(worker, frames)
        except zmq.ZMQError as exc:  # the worker vanished between READY and now
            logger.warning("could not reach worker %d: %s", worker.index, exc)
            queue.retry(job)  # never ran: not its fault
            self.lose_worker(worker.identity, f"worker {worker.index} became unreachable")
            return
        logger.debug(
            "job %s (%d inputs%s) to worker %d", job.job_id, job.size, ", bulk" if job.bulk else "", worker.index
        )
        metrics.JOB_SENTENCES.labels(worker.model).observe(job.size)
        self.registry.assign(worker, job, now)
        if tracing.enabled():
            _trace_waits(job, worker, now)


def _trace_waits(job: Job, worker: WorkerState, now: float) -> None:
    """Each traced piece's wait in the queue, from its request's admission until now, as a
    child of the head's span of its request."""
    for piece in job.pieces:
        if piece.trace is not None:
            attributes = {
                "bertserve.job": job.job_id,
                "bertserve.worker": worker.index,
                "bertserve.rows": len(piece.rows),
            }
            tracing.record(
                "bertserve.head.queue", [piece.trace], tracing.wall_ns(piece.arrived), tracing.wall_ns(now), attributes
            )
