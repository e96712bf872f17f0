"""Which workers there are and what each holds: credits, jobs, heartbeats and statistics.

A worker registers with READY (its identity names one incarnation of one worker process,
so a restarted worker is a new entry), takes jobs while it has free credits, returns a
credit with each DONE and sends a heartbeat every second. READY and DONE come parsed
(:mod:`..protocol.link`), and a worker holds at most ``max_credits`` credits, whatever it asks:
a worker that asks for more gets ``max_credits``. The registry says who gets the
next job (the most free credits), which workers have gone silent or hold a job past its
deadline, and which jobs a lost worker held: each loss counts an attempt against a job, and a
job that has lost two workers is not to be retried. A DONE from a worker that was forgotten, or
for a job it no longer holds, is ignored: its job went to another worker.

A remote worker (on a ``bertserve worker`` host, reached over the worker link) is an entry like
any other, keyed ``<host routing id>/<its identity on the host>``; ``host`` and ``name`` say
where to send its jobs. A draining worker (its host is stopping, or it is being retired for
another model version) keeps what it holds and gets nothing new. Each worker runs one model
(of the several a head may serve, :mod:`.models`) in one version, and gets only jobs of that
model pinned to that version (see :mod:`..versions.swap`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..policy.jobs import Job
from ..protocol.link_bodies import Done, Ready

MAX_CREDITS = 8
"""The most credits (jobs held at once) a worker gets, unless the head's own ``--prefetch-size``
is larger: a worker on the link cannot claim every job by asking for more."""
HAND_OFF_S = 0.002
HAND_OFF_SHARE = 0.15
"""A busy worker's next small job is sent this long before its job in hand should end (the
larger of the two): time for it to arrive and be tokenized. Measured with all-MiniLM-L6-v2 on a
2-core AMD EPYC under 32 one-sentence clients, a worker given its next job only when the last
ended sat idle 7-9% of the time, between jobs of about 80 ms."""
LATE_SHARE = 0.5
"""A worker later than this share of a small job (at least twice :data:`HAND_OFF_S`) past when it
should have been free is not on time: it may be stopped or stuck, so nothing more goes to it
ahead of its credits."""


@dataclass
class WorkerState:
    identity: bytes
    index: int
    pid: int
    credits: int
    joined: float
    last_seen: float
    host: bytes | None = None  # routing id of its host on the worker link; None: a local worker
    name: bytes = b""  # its identity on that host
    hostname: str = ""
    device: str = ""
    draining: bool = False
    version: int | None = None  # the model version it runs (None: not from a model repository)
    model: str = ""  # the served model it runs
    description: dict[str, Any] | None = None  # what it said of its model (its READY's ModelInfo)
    jobs: dict[str, tuple[Job, float]] = field(default_factory=dict)  # job id -> (job, dispatched at)
    answered: set[str] = field(default_factory=set)  # jobs held whose result came over the link
    jobs_done: int = 0
    sentences: int = 0  # inputs the model ran
    skipped: int = 0  # inputs of jobs it held but did not run: their requests were past their deadline
    busy_seconds: float = 0.0
    tokens: int = 0
    slots: int = 0
    short_seconds: float | None = None  # a small job's run time on it, smoothed (Registry.free_at)
    small_jobs: int = 0  # small jobs it has run: the first is not learned from
    last_done: float = 0.0  # when its last job's credit came back

    @property
    def free(self) -> int:
        return self.credits - len(self.jobs)


ANY = object()  # any model, any version: what a pick or a lookup is not narrowed to


class Registry:
    def __init__(
        self, *, job_timeout_s: float, heartbeat_timeout_s: float, max_failures: int = 2, max_credits: int = MAX_CREDITS
    ) -> None:
        self.job_timeout_s = job_timeout_s
        self.max_credits = max_credits
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.max_failures = max_failures  # workers a job may lose before it is not retried
        self.workers: dict[bytes, WorkerState] = {}
        self.recent_jobs: deque[tuple[float, int, bool]] = deque(maxlen=512)  # (seconds, sentences, bulk)
        self.models: dict[tuple[str, int | None], dict[str, Any]] = {}  # what each model version's local workers said

    def __len__(self) -> int:
        return len(self.workers)

    def add(
        self, identity: bytes, ready: Ready, now: float, *, host: bytes | None = None, model: str = ""
    ) -> WorkerState:
        """Register a worker of served model ``model``; it gets ``ready.credits``, at most
        :attr:`max_credits`."""
        credits = min(ready.credits, self.max_credits)
        worker = WorkerState(identity, ready.worker, ready.pid, credits, now, now)
        worker.host = host
        worker.name = identity.rpartition(b"/")[2] if host is not None else identity
        worker.hostname = ready.hostname
        worker.device = ready.device
        worker.version = ready.version
        worker.model = model
        worker.description = ready.model.public() if ready.model is not None else None
        self.workers[identity] = worker
        if worker.description is not None and host is None:
            self.models[(model, worker.version)] = worker.description
        return worker

    def model_info(self, model: str, version: int | None) -> dict[str, Any]:
        """What the workers of ``model`` in ``version`` (else in any version) said of it: a
        local worker's word first, else that of the remote worker of it that joined first;
        ``{}`` before any has said."""
        return (
            self.models.get((model, version))
            or self._remote_description(model, version)
            or next((info for (name, _), info in self.models.items() if name == model), None)
            or self._remote_description(model, ANY)
            or {}
        )

    def _remote_description(self, model: str, version: object) -> dict[str, Any] | None:
        """What the longest-joined remote worker of ``model`` (in ``version``) said of it."""
        remote = [w for w in self.workers.values() if w.host is not None and w.description is not None]
        speakers = sorted((w for w in remote if _runs(w, model, version)), key=lambda w: w.joined)
        return speakers[0].description if speakers else None

    def held_rows(self, model: str) -> int:
        """Sentences of the jobs the workers of ``model`` hold."""
        return sum(job.size for w in self.workers.values() if w.model == model for job, _ in w.jobs.values())

    def serving_count(self, model: object = ANY) -> int:
        """Workers (of ``model``, if given) taking new jobs (not draining)."""
        return sum(1 for w in self.workers.values() if not w.draining and (model is ANY or w.model == model))

    @property
    def local_count(self) -> int:
        return sum(1 for w in self.workers.values() if w.host is None)

    def heartbeat(self, identity: bytes, now: float) -> None:
        worker = self.workers.get(identity)
        if worker is not None:
            worker.last_seen = now

    def pick(self, version: object = ANY, model: object = ANY) -> WorkerState | None:
        """The worker (of ``model`` and ``version``, if given) with the most free credits and
        the fewest jobs, if any has a free credit."""
        open_ = [w for w in self.workers.values() if not w.draining and _runs(w, model, version)]
        if not open_:
            return None
        worker = max(open_, key=lambda w: (w.free, -len(w.jobs)))
        return worker if worker.free > 0 else None

    def pick_overtake(self, rows: int, version: object = ANY, model: object = ANY) -> WorkerState | None:
        """A worker (of ``model`` and ``version``, if given) whose credits are all taken by long jobs (bulk,
        or of more than ``rows`` sentences: several model runs) and that holds no short one, so
        a short job sent to it beyond its credits runs between two model runs of its long work;
        the one that holds the fewest jobs."""
        busy = [
            w
            for w in self.workers.values()
            if w.jobs and not w.draining and _only_long(w, rows) and _runs(w, model, version)
        ]
        return min(busy, key=lambda w: len(w.jobs), default=None)

    def assign(self, worker: WorkerState, job: Job, now: float) -> None:
        worker.jobs[job.job_id] = (job, now)

    def holds(self, identity: bytes, job_id: str) -> bool:
        return self.held(identity, job_id) is not None

    def held(self, identity: bytes, job_id: str) -> Job | None:
        """The job ``job_id`` if worker ``identity`` holds it, else ``None``."""
        worker = self.workers.get(identity)
        entry = worker.jobs.get(job_id) if worker is not None else None
        return entry[0] if entry is not None else None

    def answer(self, identity: bytes, job_id: str) -> bool:
        """Note that the result (or error) of a job the worker holds has come; ``False`` if it
        had come already (the worker holds the job: see :meth:`held`)."""
        worker = self.workers[identity]
        if job_id in worker.answered:
            return False
        worker.answered.add(job_id)
        return True

    def answered(self, identity: bytes, job_id: str) -> bool:
        worker = self.workers.get(identity)
        return worker is not None and job_id in worker.answered

    def done(self, identity: bytes, done: Done, now: float) -> Job | None:
        """Record a finished job; ``None`` if this worker does not hold it (any more)."""
        worker = self.workers.get(identity)
        if worker is None or done.job not in worker.jobs:
            return None
        job, _ = worker.jobs.pop(done.job)
        worker.answered.discard(done.job)
        worker.last_seen = now
        worker.jobs_done += 1
        worker.sentences += job.size if done.sentences is None else done.sentences
        worker.skipped += done.skipped
        worker.busy_seconds += done.seconds
        worker.tokens += done.tokens
        worker.slots += done.slots
        self.recent_jobs.append((done.seconds, job.size, job.bulk))
        worker.last_done = now
        if not job.bulk:
            # a worker's first small job pays what its first runs cost once (TensorFlow optimizing
            # the graph, the tokenizer's caches): it says nothing of the next, and is not learned
            worker.small_jobs += 1
            before = worker.short_seconds
            if worker.small_jobs > 1:
                worker.short_seconds = done.seconds if before is None else 0.7 * before + 0.3 * done.seconds
        return job

    def free_at(self, worker: WorkerState) -> float | None:
        """When ``worker``, busy with small jobs, should be sent its next one: its jobs in hand
        each taking its smoothed small job's time from when the one before ended, less a
        hand-off (:data:`HAND_OFF_S`, or :data:`HAND_OFF_SHARE` of a job) for the job to reach
        it and be tokenized. ``None`` when it holds nothing or bulk work, or before it has run
        a small job: the scheduler's ``max_latency_ms`` decides then."""
        seconds = worker.short_seconds
        if not worker.jobs or seconds is None or any(job.bulk for job, _ in worker.jobs.values()):
            return None
        end = worker.last_done
        for _, sent in sorted(worker.jobs.values(), key=lambda item: item[1]):
            end = max(end, sent) + seconds
        return end - max(HAND_OFF_S, HAND_OFF_SHARE * seconds)

    @staticmethod
    def _lateness(worker: WorkerState) -> float:
        """How late past :meth:`free_at` a worker may be and still be sent a job ahead."""
        seconds = worker.short_seconds or 0.0
        return max(HAND_OFF_S, HAND_OFF_SHARE * seconds) + max(2 * HAND_OFF_S, LATE_SHARE * seconds)

    def next_free_at(self, model: str, now: float) -> float | None:
        """The soonest :meth:`free_at` of the workers of ``model`` not yet sent a job beyond
        their credits, nor late (see :meth:`pick_ahead`)."""
        times = []
        for worker in self.workers.values():
            if worker.model == model and worker.free >= 0 and not worker.draining:
                free_at = self.free_at(worker)
                if free_at is not None and now <= free_at + self._lateness(worker):
                    times.append(free_at)
        return min(times, default=None)

    def pick_ahead(self, now: float, version: object = ANY, model: object = ANY) -> WorkerState | None:
        """A worker (of ``model`` and ``version``, if given) whose credits are all taken by small
        jobs, none beyond them, and that should be about to be free (:meth:`free_at` is past,
        and it is not late by more than :data:`LATE_SHARE` of a job): its next small job goes
        now, beyond its credits, to be there and tokenized as the last ends. The one that
        should be free soonest."""
        ready = []
        for worker in self.workers.values():
            if worker.free == 0 and not worker.draining and _runs(worker, model, version):
                free_at = self.free_at(worker)
                if free_at is not None and free_at <= now <= free_at + self._lateness(worker):
                    ready.append((free_at, worker))
        return min(ready, key=lambda item: item[0])[1] if ready else None

    def remove(self, identity: bytes) -> list[Job]:
        """Forget a worker; returns the jobs it held, oldest first."""
        worker = self.workers.pop(identity, None)
        if worker is None:
            return []
        return [job for job, _ in sorted(worker.jobs.values(), key=lambda item: item[1])]

    def lose(self, identity: bytes) -> tuple[list[Job], list[Job]]:
        """Forget a worker that died or hung, counting an attempt against each job it held;
        returns ``(to_retry, poisoned)``: a job that has now lost ``max_failures`` workers is
        not to be run again."""
        jobs = self.remove(identity)
        for job in jobs:
            job.failures += 1
        return [j for j in jobs if j.failures < self.max_failures], [j for j in jobs if j.failures >= self.max_failures]

    def drain(self, identity: bytes) -> None:
        """Worker ``identity`` gets nothing new from now on, and finishes what it holds."""
        worker = self.workers.get(identity)
        if worker is not None:
            worker.draining = True

    def by_index(self, index: int) -> list[WorkerState]:
        """The local worker(s) of process slot ``index``."""
        return [w for w in self.workers.values() if w.index == index and w.host is None]

    def of_host(self, host: bytes) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.host == host]

    def unresponsive(self, now: float) -> list[tuple[WorkerState, str]]:
        """Workers that fell silent or hold a job past its deadline, with the reason."""
        found = []
        for worker in self.workers.values():
            silent = now - worker.last_seen
            if silent > self.heartbeat_timeout_s:
                found.append((worker, f"no heartbeat for {silent:.1f} s"))
                continue
            oldest = min((started for _, started in worker.jobs.values()), default=now)
            if now - oldest > self.job_timeout_s:
                found.append((worker, f"a job has run for {now - oldest:.1f} s"))
        return found

    @property
    def in_flight(self) -> int:
        return sum(len(w.jobs) for w in self.workers.values())

    def in_flight_keys(self) -> set[str]:
        return {key for w in self.workers.values() for job, _ in w.jobs.values() for key in job.keys}

    def stats(self, now: float) -> dict[str, Any]:
        slots = sum(w.slots for w in self.workers.values())
        tokens = sum(w.tokens for w in self.workers.values())
        return {
            "jobs_in_flight": self.in_flight,
            "padding_fraction": round(1 - tokens / slots, 4) if slots else 0.0,
            "recent_jobs": self._recent_jobs(),
            "workers": [
                {
                    "index": w.index,
                    "pid": w.pid,
                    "host": w.hostname,
                    "device": w.device,
                    "remote": w.host is not None,
                    "state": _state(w),
                    "model": w.model,
                    "version": w.version,
                    "credits": w.credits,
                    "jobs_done": w.jobs_done,
                    "sentences": w.sentences,
                    "skipped_sentences": w.skipped,
                    "jobs_in_flight": len(w.jobs),
                    "busy_s": round(w.busy_seconds, 3),
                    "tokens": w.tokens,
                    "token_slots": w.slots,
                    "up_s": round(now - w.joined, 1),
                    "last_heartbeat_s": round(now - w.last_seen, 2),
                }
                for w in sorted(self.workers.values(), key=lambda w: (w.host is not None, w.hostname, w.index))
            ],
        }

    def _recent_jobs(self) -> dict[str, float]:
        """Run time and size of the last jobs the workers finished (bulk ones on their own too)."""
        jobs = list(self.recent_jobs)
        bulk = [seconds for seconds, _, is_bulk in jobs if is_bulk]
        return {
            "count": len(jobs),
            "median_seconds": round(float(np.median([j[0] for j in jobs])), 5) if jobs else 0.0,
            "median_sentences": float(np.median([j[1] for j in jobs])) if jobs else 0.0,
            "max_sentences": max((j[1] for j in jobs), default=0),
            "bulk_count": len(bulk),
            "bulk_median_seconds": round(float(np.median(bulk)), 5) if bulk else 0.0,
        }


def _state(worker: WorkerState) -> str:
    if worker.draining:
        return "draining"
    return "busy" if worker.jobs else "idle"


def _runs(worker: WorkerState, model: object, version: object) -> bool:
    return (model is ANY or worker.model == model) and (version is ANY or worker.version == version)


def _only_long(worker: WorkerState, rows: int) -> bool:
    return all(job.bulk or job.size > rows for job, _ in worker.jobs.values())
