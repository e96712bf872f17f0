"""The one owner of a request's lifecycle in the head: queued once admitted, its rows done, its worker lost,
failed, expired, or ended by shutdown or by a sink that died.

Each of these is written here once. A request that ends early ends the same way whatever
ended it (:meth:`Requests._end`): its queued work leaves every model's queue and it leaves the
book of admitted requests (:mod:`.admitted`); then the sink is told what the request is owed,
in a declared message (:mod:`..protocol.sink`). The clients' side (:mod:`.clients`), the worker
link (:mod:`.link`), the deadline sweep (:mod:`.expiry`) and the ventilator call these methods;
none of them writes the book, a queue's requests or the jobs a worker holds.

A request's deadline is computed once, as it is admitted (:func:`.intake.admit`): the time it
arrived plus its timeout, both ``time.monotonic()`` instants. Its queue, its jobs (each worker skips what is
past it) and the sink (in REGISTER) all carry that one instant: see :mod:`..protocol.sink`
for why one clock serves both processes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from bertserve.client import protocol as p
from pydantic import ValidationError

from ... import metrics, tracing
from ..policy.admission import Refusal
from ..policy.jobs import Job
from ..policy.scheduler import Scheduler
from ..protocol import sink
from ..protocol.formats import ReplyFormat
from ..protocol.link_bodies import Done
from .admitted import Admitted, AdmittedRequests
from .intake import Taken
from .models import HeadModel, Models
from .outbox import SinkOutbox
from .registry import Registry

logger = logging.getLogger("bertserve.ventilator")

SINK_LOST = "the server's sink process failed while this request was in flight; please retry"


class Requests:
    """The requests the head has taken and not yet seen through, and every way one ends."""

    def __init__(self, models: Models, registry: Registry, outbox: SinkOutbox) -> None:
        self.models = models
        self.registry = registry
        self.outbox = outbox
        self.book = AdmittedRequests()
        self.spans: dict[str, Any] = {}  # the head's span of each traced request, until it ends

    def __len__(self) -> int:
        return len(self.book)

    def __contains__(self, key: object) -> bool:
        return key in self.book

    @property
    def queued_bytes(self) -> int:
        """What the texts of the requests hold in memory, at most ``max_queued_bytes``."""
        return self.book.queued_bytes

    def pending(self, wire_key: str) -> bool:
        """Whether the client's request of this id is admitted and not yet answered."""
        return self.book.pending(wire_key)

    def key_of(self, wire_key: str) -> str | None:
        """The key of the client's pending request of this id."""
        return self.book.key_of(wire_key)

    # -- queued ----------------------------------------------------------------------------

    def queue(self, request: p.Request, fmt: ReplyFormat, model: HeadModel, who: bytes, taken: Taken) -> Refusal | None:
        """Plan ``request``, admitted (:func:`.intake.admit`), and queue it on ``model``: its
        key and the REGISTER that tells the sink to expect it, checked at the edge (a REGISTER
        the sink would refuse is a refused request, and nothing is queued); then its texts go
        to the scheduler, it joins the book, and the sink gets the REGISTER."""
        options, texts, now = taken.options, taken.texts, taken.now
        key = self.book.new_key(request.key)
        span = tracing.start(
            "bertserve.head.request",
            parent=options.trace,
            attributes={"bertserve.model": model.name, "bertserve.inputs": len(texts), "bertserve.request": key},
            caller=not _from_http(request.client_id, who),  # a ZeroMQ client's context: sampled as decided here
        )
        trace = tracing.recorded_traceparent(span)
        try:
            register = sink.Register(
                key=key,
                client=request.client_id.hex(),
                request_id=request.request_id,
                count=len(texts),
                deadline=taken.deadline,
                admitted=now,
                show_tokens=options.show_tokens,
                version=model.version,
                format=fmt.name.decode(),
                model=model.name,
                dimensions=options.dimensions,
                normalize=options.normalize,
                trace=trace,
            )
        except ValidationError as exc:
            refusal = Refusal(f"malformed request: {exc.errors(include_url=False)[0]['msg']}", "protocol")
            tracing.end(span, error=refusal.message)
            return refusal
        model.scheduler.queue(
            key,
            who,
            texts,
            is_tokenized=options.is_tokenized,
            show_tokens=options.show_tokens,
            now=now,
            chunk=options.chunk,
            version=model.version,
            deadline=taken.deadline,
            truncation=options.truncation,
            trace=trace,
            adapter=options.adapter,
            task=options.task,
            reads=options.reads,
            slot=taken.slot,
        )
        if span is not None:
            self.spans[key] = span
        deadline, nbytes = taken.deadline, taken.nbytes
        admitted = Admitted(
            request.client_id, request.request_id, request.key, len(texts), deadline, fmt, nbytes, model.name
        )
        self.book.add(key, admitted)
        self.outbox.send(register.frames())
        return None

    # -- its rows done -----------------------------------------------------------------------

    def done(self, identity: bytes, done: Done) -> None:
        """Worker ``identity``'s DONE: its credit is free again, and the rows it computed are counted."""
        queue = self.queue_of(identity)
        worker = self.registry.workers.get(identity)
        worker_model = worker.model if worker is not None else ""
        now = time.monotonic()
        job = self.registry.done(identity, done, now)
        if job is None:
            logger.debug("ignored DONE of job %s from %r: it is no longer that worker's", done.job, identity)
            return
        _count_job(job.size, done, worker_model)
        ran = job.size if done.sentences is None else done.sentences
        queue.throughput.job_done(ran, done.seconds, bulk=job.bulk, now=now)
        for piece in job.pieces:
            self.book.rows_done(piece.key, len(piece.rows))
            if piece.key not in self.book:  # its last rows
                tracing.end(self.spans.pop(piece.key, None))
                if job.bulk:  # is it as late as projected?
                    queue.throughput.finished(piece.key, now)

    # -- its worker lost ---------------------------------------------------------------------

    def worker_lost(self, identity: bytes, reason: str) -> None:
        """Worker ``identity`` died, stopped answering or broke the rules: its jobs run
        elsewhere, except a job that has now lost two workers: its requests get an error."""
        queue = self.queue_of(identity)
        retry, poisoned = self.registry.lose(identity)
        if retry or poisoned:
            logger.warning("%s: it held %d job(s); handing them to others", reason, len(retry) + len(poisoned))
        for job in retry:
            self._retry(queue, job)
        for job in poisoned:
            keys = {key for key in job.keys if key in self.book}
            logger.error("job %s lost %d workers (%s); failing its requests %s", job.job_id, job.failures, reason, keys)
            error = (
                f"the request was running when its worker failed, {job.failures} times ({reason}); it is not "
                "retried: an input in it may crash the model"
            )
            self.fail(keys, error, "worker")

    def hand_back(self, identity: bytes) -> None:
        """A worker is leaving and returns what it holds: its jobs run elsewhere, and count as never run."""
        queue = self.queue_of(identity)
        for job in self.registry.remove(identity):
            self._retry(queue, job)

    def _retry(self, queue: Scheduler, job: Job) -> None:
        job.pieces = [piece for piece in job.pieces if piece.key in self.book]  # not ended meanwhile
        if job.pieces:
            queue.retry(job)

    def queue_of(self, identity: bytes) -> Scheduler:
        """The queue of the model worker ``identity`` runs: where its jobs go back to."""
        worker = self.registry.workers.get(identity)
        model = self.models.get(worker.model) if worker is not None else None
        return (model or self.models.default).scheduler

    # -- ended early -------------------------------------------------------------------------

    def fail(self, keys: set[str], error: str, kind: str) -> None:
        """Answer the requests ``keys`` with an error (``kind``), and drop what is left of them."""
        ended, _ = self._end(keys, error)
        if ended:
            fail = sink.Fail(keys=sorted(ended), error=error[: sink.MAX_ERROR_TEXT], kind=kind)
            self.outbox.send(fail.frames())

    def expire(self, now: float) -> int:
        """Forget the requests past their deadline; the queued sentences dropped. The sink
        answers them as expired on its own: it holds the same deadline."""
        expired = self.book.expired(now)
        for model in self.models:  # a bulk request taken expected to be done before then
            for key in expired:
                model.scheduler.throughput.finished(key, now)
        return self._end(expired, "expired: past its deadline")[1]

    def fail_all(self, error: str) -> None:
        """Shutdown: every request still queued or in flight gets an error reply."""
        self.fail(set(self.book.requests), error, "shutdown")
        for model in self.models:
            model.scheduler.drain_keys()

    def sink_lost(self) -> None:
        """The sink died and lost what it was assembling: every request still pending gets an
        error reply, published through the new sink (the outbox was reconnected to it), and
        its queued work is dropped."""
        ended, _ = self._end(set(self.book.requests), SINK_LOST)
        for _, request in sorted(ended.items()):
            # Queued until the new sink binds; it lets clients subscribe again before it publishes.
            reply = request.format.error(request.client, request.request_id, SINK_LOST, "internal")
            self.outbox.publish(request.format, reply)
            metrics.REQUESTS.labels(metrics.path_of(request.client), "internal", request.model).inc()

    def _end(self, keys: set[str], error: str) -> tuple[dict[str, Admitted], int]:
        """The one way a request ends early: its queued work leaves every queue, it leaves the
        book, and its span ends with ``error``. Returns the requests of ``keys`` still pending,
        and the queued sentences dropped."""
        if not keys:
            return {}, 0
        for key in keys:
            tracing.end(self.spans.pop(key, None), error=error)
        dropped = 0
        for model in self.models:
            before = model.scheduler.queued
            model.scheduler.remove(keys)
            dropped += before - model.scheduler.queued
        ended = {key: request for key in keys if (request := self.book.finish(key)) is not None}
        return ended, dropped


def _count_job(size: int, done: Done, model: str) -> None:
    """A worker's DONE: its inputs, tokens and model time, for ``/metrics``."""
    metrics.SENTENCES.labels(model).inc(size if done.sentences is None else done.sentences)
    if done.skipped:
        metrics.SKIPPED_SENTENCES.inc(done.skipped)
    metrics.TOKENS.inc(done.tokens)
    metrics.TOKEN_SLOTS.inc(done.slots)
    metrics.JOB_SECONDS.labels(model).observe(done.seconds)


def _from_http(client_id: bytes, who: bytes) -> bool:
    """Whether a request came from this server's HTTP or gRPC process, whose trace context the
    head continues as it is: a front end's client id, and under CURVE sent with the front ends'
    own key (a request under any other key counts to that key: :func:`..policy.admission.principal`)."""
    return metrics.path_of(client_id) in ("http", "grpc") and not who.startswith(b"key:")
