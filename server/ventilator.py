"""The ventilator: takes requests, cuts and merges them into mini-jobs, hands them out.

Small requests (fewer than ``max_batch_size`` sentences) wait at most ``max_latency_ms``
for company and are merged, across clients, into one mini-job; they go ahead of bulk work.
Large requests are sorted by length and cut into mini-jobs of at most ``max_batch_size``,
so each job pads little; several bulk requests take turns. A job goes to the worker with
the most free credits (the ZeroMQ guide's load-balancing pattern), and the ventilator
remembers which worker holds which job, so a dead worker's jobs go to another.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq
from bertserve.client import __version__
from bertserve.client import protocol as p

from .config import ServerConfig

logger = logging.getLogger("bertserve.ventilator")


@dataclass
class _Piece:
    """Rows of one request waiting to be put in a job."""

    key: str
    rows: np.ndarray
    texts: list[Any]
    is_tokenized: bool
    show_tokens: bool
    arrived: float


@dataclass
class _Job:
    job_id: bytes
    frames: list[bytes]  # [JOB, job_id, header, payload]
    keys: list[str]
    size: int
    bulk: bool = False  # cut from a large request (rather than merged from small ones)
    worker: bytes | None = None


@dataclass
class _WorkerState:
    identity: bytes
    index: int
    pid: int
    credits: int
    jobs: set[bytes] = field(default_factory=set)
    jobs_done: int = 0
    sentences: int = 0
    busy_seconds: float = 0.0
    tokens: int = 0
    slots: int = 0

    @property
    def free(self) -> int:
        return self.credits - len(self.jobs)


class Ventilator:
    def __init__(
        self, config: ServerConfig, context: zmq.Context, frontend: zmq.Socket, addresses: Any, tokenizer: Any = None
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer  # counts tokens so bulk jobs hold inputs of one length
        self.frontend = frontend  # PULL from clients, bound by the server
        self.backend = context.socket(zmq.ROUTER)
        self.backend.linger = 0
        self.backend.router_mandatory = True
        self.backend.bind(addresses.jobs)
        self.credit_socket = context.socket(zmq.PULL)
        self.credit_socket.linger = 0
        self.credit_socket.bind(addresses.credits)
        self.sink = context.socket(zmq.PUSH)
        self.sink.linger = 2000
        self.sink.connect(addresses.sink)
        self.workers: dict[bytes, _WorkerState] = {}
        self.model: dict[str, Any] = {}
        self.small: deque[_Piece] = deque()
        self.small_rows = 0
        self.bulk: deque[deque[_Job]] = deque()  # one queue of jobs per bulk request, taking turns
        self.jobs: dict[bytes, _Job] = {}
        self._job_ids = itertools.count()
        self.accepting = True
        self.started = time.time()
        self.received = 0
        self.rejected = 0
        self.terminate_requested = False
        self.recent_jobs: deque[tuple[float, int, bool]] = deque(maxlen=512)  # (seconds, sentences, bulk)
        self._commands: dict[bytes, Callable[[p.Request], None]] = {
            p.ENCODE: self._on_encode,
            p.CONFIG: self._on_config,
            p.STATUS: self._on_status,
            p.TERMINATE: self._on_terminate,
        }

    def close(self) -> None:
        for socket in (self.backend, self.credit_socket, self.sink):
            socket.close()

    @property
    def ready(self) -> bool:
        return bool(self.workers)

    @property
    def idle(self) -> bool:
        return not self.jobs and not self.small and not self.bulk

    # -- the loop ------------------------------------------------------------------------

    def poll_once(self, timeout_ms: int = 100) -> None:
        poller = zmq.Poller()
        if self.accepting:
            poller.register(self.frontend, zmq.POLLIN)
        poller.register(self.backend, zmq.POLLIN)
        poller.register(self.credit_socket, zmq.POLLIN)
        wait = timeout_ms
        if self.small and any(w.free > 0 for w in self.workers.values()):
            # Wake when the oldest small request has waited long enough; with every worker
            # busy there is nothing to dispatch until a credit returns, so do not spin.
            waited = (time.monotonic() - self.small[0].arrived) * 1000
            wait = int(max(0, min(wait, self.config.max_latency_ms - waited)))
        events = dict(poller.poll(wait))
        if self.backend in events:
            self._drain(self.backend, self._on_worker_message)
        if self.credit_socket in events:
            self._drain(self.credit_socket, self._on_credit)
        if self.frontend in events:
            self._drain(self.frontend, self._on_client_message, limit=1000)
        self._dispatch()

    @staticmethod
    def _drain(socket: zmq.Socket, handle: Callable[[list[bytes]], None], limit: int = 10_000) -> None:
        for _ in range(limit):
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            handle(frames)

    # -- clients -------------------------------------------------------------------------

    def _on_client_message(self, frames: list[bytes]) -> None:
        try:
            request = p.decode_request(frames)
        except p.ProtocolError as exc:
            self.rejected += 1
            client = p.decode_client_id(frames)
            logger.warning("rejected a malformed request from %r: %s", client, exc)
            if client is not None and len(frames) >= 3:
                request_id = int(frames[2]) if frames[2].isdigit() else -1
                self._publish(p.error_reply(client, request_id, f"malformed request: {exc}", "protocol"))
            return
        self._commands[request.command](request)

    def _publish(self, frames: list[Any]) -> None:
        self.sink.send_multipart([p.PUBLISH, *frames])

    def _reject(self, request: p.Request, error: str, kind: str = "input") -> None:
        self.rejected += 1
        self._publish(p.error_reply(request.client_id, request.request_id, error, kind))

    def _on_encode(self, request: p.Request) -> None:
        self.received += 1
        texts = request.texts
        is_tokenized = bool(request.header.get("is_tokenized", False))
        show_tokens = bool(request.header.get("show_tokens", False))
        if len(texts) > self.config.max_request_size:
            return self._reject(
                request, f"the request has {len(texts)} inputs; this server takes at most "
                f"{self.config.max_request_size} per request", "limit"
            )  # fmt: skip
        try:
            p.check_texts(texts, is_tokenized)
        except (TypeError, ValueError) as exc:
            return self._reject(request, str(exc))
        sizes = [len(t) if isinstance(t, str) else sum(map(len, t)) for t in texts]
        too_long = next((i for i, n in enumerate(sizes) if n > self.config.max_text_chars), None)
        if too_long is not None:
            return self._reject(
                request, f"texts[{too_long}] has {sizes[too_long]} characters; this server takes at most "
                f"{self.config.max_text_chars}", "limit"
            )  # fmt: skip
        if not texts:
            return self._publish_empty(request)
        register = {
            "key": request.key, "client": request.client_id.decode("ascii", "replace"),
            "request_id": request.request_id, "count": len(texts), "show_tokens": show_tokens,
        }  # fmt: skip
        self.sink.send_multipart([p.REGISTER, p.dumps(register)])
        now = time.monotonic()
        if len(texts) < self.config.max_batch_size:
            rows = np.arange(len(texts))
            self.small.append(_Piece(request.key, rows, texts, is_tokenized, show_tokens, now))
            self.small_rows += len(texts)
            return None
        # Bulk: sort by token count so each job pads little, then cut into jobs of similar cost.
        lengths = self._lengths(texts, is_tokenized, sizes)
        order = np.argsort(lengths, kind="stable")
        jobs = deque(
            self._make_job([_Piece(request.key, chunk, [texts[i] for i in chunk], is_tokenized, show_tokens, now)])
            for chunk in self._cut(order, lengths[order])
        )
        for job in jobs:
            job.bulk = True
        self.bulk.append(jobs)
        return None

    def _cut(self, order: np.ndarray, sorted_lengths: np.ndarray) -> list[np.ndarray]:
        """Cut length-sorted rows into jobs of at most max_batch_size rows and max_batch_tokens
        padded tokens (rows times the longest, which is the last)."""
        chunks, start = [], 0
        limit, budget = self.config.max_batch_size, self.config.max_batch_tokens
        for end in range(1, len(order) + 1):
            rows = end - start
            if rows > limit or (rows > 1 and rows * int(sorted_lengths[end - 1]) > budget):
                chunks.append(order[start : end - 1])
                start = end - 1
        chunks.append(order[start:])
        return chunks

    def _lengths(self, texts: list[Any], is_tokenized: bool, sizes: list[int]) -> np.ndarray:
        if self.tokenizer is None:
            return np.asarray(sizes)
        try:
            return np.asarray(self.tokenizer.count_tokens(texts, is_tokenized=is_tokenized))
        except Exception:  # the worker will report what is wrong with these texts
            logger.debug("could not count tokens; sorting by characters", exc_info=True)
            return np.asarray(sizes)

    def _publish_empty(self, request: p.Request) -> None:
        dim = int(self.model.get("output_dim", 0))
        shape = [0, 0, dim] if self.model.get("token_level") else [0, dim]
        header = {"dtype": self.model.get("output_dtype", "float32"), "shape": shape}
        if request.header.get("show_tokens"):
            header["tokens"] = []
        self._publish(p.encode_reply(request.client_id, request.request_id, True, header, b""))

    def _on_config(self, request: p.Request) -> None:
        self._publish(p.encode_reply(request.client_id, request.request_id, True, self.describe()))

    def describe(self) -> dict[str, Any]:
        return {
            "server_version": __version__,
            "protocol": p.PROTOCOL_VERSION,
            "ready": self.ready,
            **self.config.public(),
            **self.model,
        }

    def _on_status(self, request: p.Request) -> None:
        status = self.status()
        self.sink.send_multipart([p.STATUS, request.client_id, str(request.request_id).encode(), p.dumps(status)])

    def status(self) -> dict[str, Any]:
        slots = sum(w.slots for w in self.workers.values())
        tokens = sum(w.tokens for w in self.workers.values())
        return {
            "server_version": __version__,
            "ready": self.ready,
            "uptime_s": round(time.time() - self.started, 3),
            "requests_received": self.received,
            "requests_rejected": self.rejected,
            "queue_small_sentences": self.small_rows,
            "queue_bulk_jobs": sum(len(jobs) for jobs in self.bulk),
            "jobs_in_flight": len(self.jobs),
            "padding_fraction": round(1 - tokens / slots, 4) if slots else 0.0,
            "recent_jobs": self._recent_jobs(),
            "workers": [
                {
                    "index": w.index, "pid": w.pid, "jobs_done": w.jobs_done, "sentences": w.sentences,
                    "jobs_in_flight": len(w.jobs), "busy_s": round(w.busy_seconds, 3),
                    "tokens": w.tokens, "token_slots": w.slots,
                }
                for w in sorted(self.workers.values(), key=lambda w: w.index)
            ],
        }  # fmt: skip

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

    def _on_terminate(self, request: p.Request) -> None:
        if not self.config.allow_terminate:
            return self._reject(request, "this server does not accept TERMINATE from clients", "forbidden")
        self._publish(p.encode_reply(request.client_id, request.request_id, True, {"stopping": True}))
        self.terminate_requested = True
        return None

    # -- workers -------------------------------------------------------------------------

    def _on_worker_message(self, frames: list[bytes]) -> None:
        identity, rest = frames[0], frames[1:]
        try:
            _, (raw,) = p.split_message(rest, {p.READY: 1})
        except p.ProtocolError as exc:
            logger.error("dropped a malformed message from %r: %s", identity, exc)
            return
        info = p.loads(raw)
        self.model = info.get("model", self.model)
        self.workers[identity] = _WorkerState(identity, int(info["worker"]), int(info["pid"]), int(info["credits"]))
        logger.debug("worker %s ready with %s credits", info["worker"], info["credits"])

    def _on_credit(self, frames: list[bytes]) -> None:
        try:
            _, (raw,) = p.split_message(frames, {p.DONE: 1})
        except p.ProtocolError as exc:
            logger.error("dropped a malformed credit message: %s", exc)
            return
        info = p.loads(raw)
        job = self.jobs.pop(info["job"].encode(), None)
        if job is None or job.worker is None:
            return
        worker = self.workers.get(job.worker)
        if worker is None:
            return
        worker.jobs.discard(job.job_id)
        worker.jobs_done += 1
        worker.sentences += job.size
        worker.busy_seconds += float(info.get("seconds", 0.0))
        self.recent_jobs.append((float(info.get("seconds", 0.0)), job.size, job.bulk))
        worker.tokens += int(info.get("tokens", 0))
        worker.slots += int(info.get("slots", 0))

    def worker_lost(self, index: int) -> None:
        """A worker process died: forget it and give its jobs to the others."""
        for identity, worker in list(self.workers.items()):
            if worker.index != index:
                continue
            del self.workers[identity]
            orphaned = deque(self.jobs[j] for j in sorted(worker.jobs) if j in self.jobs)
            for job in orphaned:
                job.worker = None
                self.jobs.pop(job.job_id)
            if orphaned:
                logger.warning("worker %d died holding %d jobs; handing them to others", index, len(orphaned))
                self.bulk.appendleft(orphaned)

    # -- dispatch ------------------------------------------------------------------------

    def _make_job(self, pieces: list[_Piece]) -> _Job:
        job_id = str(next(self._job_ids)).encode()
        header = {
            "parts": [{"key": piece.key, "rows": piece.rows.tolist()} for piece in pieces],
            "is_tokenized": pieces[0].is_tokenized,
            "show_tokens": any(piece.show_tokens for piece in pieces),
        }
        texts = [text for piece in pieces for text in piece.texts]
        frames = [p.JOB, job_id, p.dumps(header), p.dumps(texts)]
        return _Job(job_id, frames, [piece.key for piece in pieces], len(texts))

    def _take_small(self) -> _Job:
        """Merge waiting small requests (of one input kind) into a job of at most max_batch_size."""
        room = self.config.max_batch_size
        pieces: list[_Piece] = []
        kind = self.small[0].is_tokenized
        while self.small and room and self.small[0].is_tokenized == kind:
            if pieces and not self.config.merge_requests:
                break
            piece = self.small[0]
            if len(piece.rows) <= room:
                self.small.popleft()
                pieces.append(piece)
            else:  # split it: the rest waits for the next job
                pieces.append(_Piece(piece.key, piece.rows[:room], piece.texts[:room], kind,
                                     piece.show_tokens, piece.arrived))  # fmt: skip
                piece.rows, piece.texts = piece.rows[room:], piece.texts[room:]
            room -= len(pieces[-1].rows)
            self.small_rows -= len(pieces[-1].rows)
        return self._make_job(pieces)

    def _next_job(self) -> _Job | None:
        if self.small:
            # A small request waits up to max_latency_ms for company, even with a worker idle:
            # clients that send again as soon as they are answered arrive a few ms apart.
            waited_ms = (time.monotonic() - self.small[0].arrived) * 1000
            # Bulk work waiting means the worker would be busy anyway: go now, ahead of it.
            if self.small_rows >= self.config.max_batch_size or waited_ms >= self.config.max_latency_ms or self.bulk:
                return self._take_small()
        if self.bulk:
            jobs = self.bulk.popleft()
            job = jobs.popleft()
            if jobs:
                self.bulk.append(jobs)  # the next bulk request takes the next turn
            return job
        return None

    def _dispatch(self) -> None:
        while self.workers:
            worker = max(self.workers.values(), key=lambda w: (w.free, -len(w.jobs)))
            if worker.free <= 0:
                return
            job = self._next_job()
            if job is None:
                return
            try:
                self.backend.send_multipart([worker.identity, *job.frames])
            except zmq.ZMQError as exc:  # the worker vanished between READY and now
                logger.warning("could not reach worker %d: %s", worker.index, exc)
                self.worker_lost(worker.index)
                self.bulk.appendleft(deque([job]))
                continue
            logger.debug("job %s (%d inputs%s) to worker %d", job.job_id.decode(), job.size,
                         ", bulk" if job.bulk else "", worker.index)  # fmt: skip
            job.worker = worker.identity
            worker.jobs.add(job.job_id)
            self.jobs[job.job_id] = job

    def fail_everything(self, error: str) -> None:
        """Shutdown: every request still queued or in flight gets an error reply."""
        keys = {piece.key for piece in self.small}
        keys.update(key for jobs in self.bulk for job in jobs for key in job.keys)
        keys.update(key for job in self.jobs.values() for key in job.keys)
        self.small.clear()
        self.bulk.clear()
        if keys:
            self.sink.send_multipart([p.FAIL, p.dumps({"keys": sorted(keys), "error": error, "kind": "shutdown"})])

    def stop_workers(self) -> None:
        for identity in list(self.workers):
            with contextlib.suppress(zmq.ZMQError):  # a worker that is already gone needs no STOP
                self.backend.send_multipart([identity, p.STOP], zmq.NOBLOCK)
