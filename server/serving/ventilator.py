"""The ventilator: moves frames between clients, the scheduler, the workers and the sink.

Policy lives elsewhere: :mod:`.scheduler` decides what runs next and what is refused,
:mod:`.registry` knows which worker holds which job. This module reads requests (checking,
under CURVE, that a client id belongs to the sender's key), answers control commands, hands
jobs to workers and tells the sink what to expect. It never blocks on a send: messages for
the sink that ZeroMQ cannot take at once wait in an outbox, in order. Workers on other
machines reach it through :mod:`.link` (``--worker-port``) and get jobs by the same credits.
Its own workers' READY and DONE are parsed by the same schemas as theirs (:mod:`.link_schema`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
from bertserve.client import __version__
from bertserve.client import protocol as p

from .. import metrics
from ..config import ServerConfig, parse_long_inputs
from ..model.chunking import chunk_refusal
from ..security import loopback_only, message_user_id, request_allowed
from . import legacy, link_schema, wire
from .interfaces import VersionsView
from .link import WorkerLink
from .registry import MAX_CREDITS, Registry, WorkerState
from .scheduler import Busy, Job, Scheduler, TooLarge
from .worker import Addresses

logger = logging.getLogger("bertserve.ventilator")

_MAX_OUTBOX = 10_000  # messages waiting for the sink before the ventilator stops reading clients
_CLIENT_DRAIN_S = 0.05  # longest the loop reads clients before it looks at workers again
_GAUGE_INTERVAL_S = 0.5


@dataclass
class _Request:
    client: bytes
    request_id: int
    wire_key: str
    rows: int  # rows not yet computed
    deadline: float
    legacy: bool = False  # answered in bert-as-service 1.x's layout
    nbytes: int = 0  # what its texts hold in memory, counted against max_queued_bytes


def held_bytes(texts: list[Any]) -> int:
    """What a request's decoded texts hold in this process: each ``str`` object (its header and
    its characters, at 1, 2 or 4 bytes each as Python stores them) and a list slot for it; a
    pre-tokenized input counts its list and each token."""
    total = sys.getsizeof(texts)
    for text in texts:
        total += sys.getsizeof(text)
        if isinstance(text, list):
            total += sum(map(sys.getsizeof, text))
    return total


class Ventilator:
    def __init__(
        self,
        config: ServerConfig,
        context: zmq.Context,
        frontend: zmq.Socket,
        addresses: Addresses,
        scheduler: Scheduler,
        *,
        curve_admins: frozenset[bytes] | None = None,
        gateway_key: bytes | None = None,
        model_sha256: str = "",
        curve_keys: Any = None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.registry = Registry(
            job_timeout_s=config.job_timeout_ms / 1000, heartbeat_timeout_s=config.heartbeat_timeout_ms / 1000,
            max_credits=max(MAX_CREDITS, config.prefetch_size),
        )  # fmt: skip
        self.curve = curve_admins is not None
        self.admins = curve_admins or frozenset()
        self.gateway_key = gateway_key  # under CURVE, the HTTP front end's key: its callers are principals
        self.frontend = frontend  # PULL from clients, bound by the server
        self.backend = context.socket(zmq.ROUTER)
        self.backend.linger = 0
        self.backend.router_mandatory = True
        self.backend.bind(addresses.jobs)
        self.credit_socket = context.socket(zmq.PULL)
        self.credit_socket.linger = 0
        self.credit_socket.bind(addresses.credits)
        self.context = context
        self.addresses = addresses
        self.sink = self._connect_sink()
        self.outbox: deque[list[Any]] = deque()
        self.requests: dict[str, _Request] = {}
        self.queued_bytes = 0  # what the texts of self.requests hold (held_bytes), at most max_queued_bytes
        self.accepting = True
        self.started = time.time()
        self.received = 0
        self.rejected: dict[str, int] = {}
        self.terminate_requested = False
        self.live: dict[str, str] = {}  # the wire key (client id and request id) -> the internal key
        self._serials = itertools.count()
        self._next_expiry = 0.0
        self._next_gauges = 0.0
        self._model_labelled = False
        self.refused_versions: list[dict[str, Any]] = []  # model versions refused (see .swap)
        self.version = config.version_number  # the model version new requests are pinned to
        self.registry.serving = self.version
        self.swap: dict[str, Any] = {}  # the state of the latest version swap, for status
        self.reload_requested: str | None = None  # "latest" or a version number, from RELOAD
        self.reloads = 0  # RELOAD commands taken, so a caller can tell when its own is answered
        self.versions_view: VersionsView | None = None  # the model versions' side of the status
        self.link: WorkerLink | None = None  # remote workers join here (--worker-port)
        if config.worker_port is not None:
            self.link = WorkerLink(config, context, self, model_sha256, curve_keys)
        self._commands: dict[bytes, Callable[[p.Request, bytes | None], None]] = {
            p.ENCODE: self._on_encode,
            p.CONFIG: self._on_config,
            p.STATUS: self._on_status,
            p.TERMINATE: self._on_terminate,
            p.RELOAD: self._on_reload,
        }

    def close(self) -> None:
        for socket in (self.backend, self.credit_socket, self.sink):
            socket.close()
        if self.link is not None:
            self.link.close()

    @property
    def ready(self) -> bool:
        return len(self.registry) > 0

    @property
    def idle(self) -> bool:
        return not self.requests and self.scheduler.empty and not self.outbox

    # -- the loop ------------------------------------------------------------------------

    def poll_once(self, timeout_ms: int = 100) -> None:
        poller = zmq.Poller()
        if self.accepting and len(self.outbox) < _MAX_OUTBOX:  # a stalled sink holds clients back
            poller.register(self.frontend, zmq.POLLIN)
        poller.register(self.backend, zmq.POLLIN)
        poller.register(self.credit_socket, zmq.POLLIN)
        if self.link is not None:
            poller.register(self.link.socket, zmq.POLLIN)
        if self.outbox:
            poller.register(self.sink, zmq.POLLOUT)
        wait = timeout_ms
        due = self.scheduler.wake_in(time.monotonic())
        if due is not None and self.registry.pick() is not None:
            wait = min(wait, int(due * 1000) + 1)  # a waiting small request falls due
        events = dict(poller.poll(wait))
        if self.backend in events:
            self._drain(self.backend, self._on_worker_message)
        if self.credit_socket in events:
            self._drain(self.credit_socket, self._on_credit)
        if self.link is not None and self.link.socket in events:
            self._drain(self.link.socket, self.link.handle, copy=False)
        if self.frontend in events:
            self._drain(self.frontend, self._on_client_message, copy=False, seconds=_CLIENT_DRAIN_S)
        self._flush()
        self._dispatch()
        now = time.monotonic()
        if self.link is not None:
            self.link.tick(now)
        if now >= self._next_expiry:
            self._expire(now)
        if now >= self._next_gauges:
            self._next_gauges = now + _GAUGE_INTERVAL_S
            self.update_gauges()

    @staticmethod
    def _drain(
        socket: zmq.Socket, handle: Callable[[list[Any]], None], *, copy: bool = True, seconds: float = 1.0
    ) -> None:
        """Handle what ``socket`` holds, for at most ``seconds`` so the other sockets get a turn."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK, copy=copy)
            except zmq.Again:
                return
            handle(frames)

    def _expire(self, now: float) -> None:
        """Drop the queued work of requests past their deadline: the sink has answered them."""
        self._next_expiry = now + 1.0
        expired = {key for key, request in self.requests.items() if request.deadline <= now}
        if expired:
            self.scheduler.remove(expired)
            for key in expired:
                self._finish(key)

    # -- the sink, without blocking --------------------------------------------------------

    def _connect_sink(self) -> zmq.Socket:
        socket = self.context.socket(zmq.PUSH)
        socket.linger = 2000
        socket.sndhwm = 100_000
        socket.connect(self.addresses.sink)
        return socket

    def to_sink(self, frames: list[Any]) -> None:
        if not self.outbox:
            try:
                self.sink.send_multipart(frames, zmq.NOBLOCK)
                return
            except zmq.Again:
                pass
        self.outbox.append(frames)

    def _flush(self) -> None:
        while self.outbox:
            try:
                self.sink.send_multipart(self.outbox[0], zmq.NOBLOCK)
            except zmq.Again:
                return
            self.outbox.popleft()

    def _publish(self, frames: list[Any]) -> None:
        self.to_sink([wire.PUBLISH, *frames])

    def _fail(self, keys: set[str], error: str, kind: str) -> None:
        """Answer the requests ``keys`` with an error and drop what is left of them."""
        if not keys:
            return
        self.scheduler.remove(keys)
        for key in keys:
            self._finish(key)
        self.to_sink([wire.FAIL, p.dumps({"keys": sorted(keys), "error": error, "kind": kind})])

    def _finish(self, key: str) -> None:
        request = self.requests.pop(key, None)
        if request is not None:
            self.live.pop(request.wire_key, None)
            self.queued_bytes -= request.nbytes

    # -- clients -------------------------------------------------------------------------

    def _on_client_message(self, frames: list[zmq.Frame]) -> None:
        user_id = message_user_id(frames[0]) if self.curve and frames else None
        raw = [frame.bytes for frame in frames]
        try:
            if self.config.legacy_clients and legacy.is_legacy(raw):  # bert-as-service 1.x's client
                request = legacy.decode_request(raw, show_tokens=self.config.show_tokens_to_client)
            else:
                request = p.decode_request(raw, payload=False)  # a busy server need not read the texts
        except p.ProtocolError as exc:
            self._count_rejection("protocol")
            client = p.decode_client_id(raw)
            if len(raw) > 1 and raw[1] == p.ENCODE:
                metrics.REQUESTS.labels(metrics.path_of(client or b""), "protocol").inc()
            logger.warning("rejected a malformed request from %r: %s", client, exc)
            if client is not None and len(raw) >= 3 and self._owns(user_id, client):
                request_id = int(raw[2]) if raw[2].isdigit() and len(raw[2]) <= 19 else -1
                self._publish(p.error_reply(client, request_id, f"malformed request: {exc}", "protocol"))
            return
        if not self._owns(user_id, request.client_id):
            # Its replies would go to another key's client: no answer, only a log line.
            self._count_rejection("spoofed")
            logger.warning("refused a request whose client id %r does not belong to key %s", request.client_id, user_id)
            return
        self._commands[request.command](request, user_id.encode() if user_id else None)

    def _owns(self, user_id: str | None, client_id: bytes) -> bool:
        return request_allowed(user_id, client_id, self.curve)

    def _count_rejection(self, kind: str) -> None:
        self.rejected[kind] = self.rejected.get(kind, 0) + 1
        metrics.REJECTIONS.labels(kind).inc()

    def _reject(self, request: p.Request, error: str, kind: str = "input") -> None:
        self._count_rejection(kind)
        if request.command == p.ENCODE:
            metrics.REQUESTS.labels(metrics.path_of(request.client_id), kind).inc()
        self._publish(legacy.reply_to(request, p.error_reply(request.client_id, request.request_id, error, kind)))

    def _on_encode(self, request: p.Request, user: bytes | None) -> None:
        # Under CURVE a key is the principal that bounds and turns apply to, whatever ids it uses.
        principal = b"key:" + user if user is not None and user != self.gateway_key else request.client_id
        self.received += 1
        is_tokenized = bool(request.header.get("is_tokenized", False))
        show_tokens = bool(request.header.get("show_tokens", False))
        chunk, refusal = self._chunking(request.header.get("long_inputs"))
        if refusal is not None:
            return self._reject(request, refusal)
        if request.count is not None and not self._room_for(request, principal, request.count):
            return None  # refused on the count its header declares, without reading the texts
        if not self._room_for_bytes(request, len(request.payload or b"") // 6):
            return None  # full: refused without reading the texts (a text takes at least a sixth of its JSON)
        try:
            texts = request.texts = p.decode_texts(request, request.payload)
        except p.ProtocolError as exc:
            return self._reject(request, f"malformed request: {exc}", "protocol")
        if request.count is None and not self._room_for(request, principal, len(texts)):
            return None
        nbytes = held_bytes(texts)
        if not self._room_for_bytes(request, nbytes):
            return None
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
        if request.key in self.live:
            return self._reject(
                request, f"request id {request.request_id} of this client is already pending; it was not queued "
                "again (the first request is unaffected)", "duplicate"
            )  # fmt: skip
        if not texts:
            return self._publish_empty(request)
        # The internal key is unique per admission, so nothing of an earlier request under the
        # same client and request id (a late result, say) can land in this one.
        key = f"{request.key}@{next(self._serials)}"
        now = time.monotonic()
        try:
            self.scheduler.admit(
                key, principal, texts, is_tokenized=is_tokenized, show_tokens=show_tokens, now=now, chunk=chunk,
                version=self.version,
            )  # fmt: skip
        except Busy as exc:
            return self._reject(request, str(exc), p.BUSY)
        except TooLarge as exc:
            return self._reject(request, str(exc), "limit")
        deadline = now + self.config.request_timeout_ms / 1000
        self.requests[key] = _Request(request.client_id, request.request_id, request.key, len(texts), deadline,
                                      legacy.is_legacy_request(request), nbytes)  # fmt: skip
        self.queued_bytes += nbytes
        self.live[request.key] = key
        register = {
            "key": key, "client": request.client_id.hex(),
            "request_id": request.request_id, "count": len(texts), "show_tokens": show_tokens,
            "version": self.version,
        }  # fmt: skip
        if legacy.is_legacy_request(request):
            register["legacy"] = True
        self.to_sink([wire.REGISTER, p.dumps(register)])
        return None

    def _chunking(self, long_inputs: object) -> tuple[bool, str | None]:
        """Whether a request's long inputs are chunked (its ``long_inputs``, else the
        server's), and why that cannot be, if it cannot."""
        if long_inputs is None:
            return self.config.model.long_inputs == "chunk", None
        try:
            if parse_long_inputs(long_inputs) == "truncate":
                return False, None
        except ValueError as exc:
            return False, str(exc)
        model = self.registry.model
        if model and not model.get("chunking"):
            refusal = chunk_refusal(model.get("pooling_strategy")) if "pooling_strategy" in model else None
            return False, refusal or "this server's model cannot encode long inputs in windows (long_inputs=chunk)"
        return True, None

    def _room_for(self, request: p.Request, principal: bytes, count: int) -> bool:
        """Whether ``count`` inputs fit the size limit and the queues; if not, the refusal is sent."""
        if count > self.config.request_size_limit:
            self._reject(
                request, f"the request has {count} inputs; this server takes at most "
                f"{self.config.request_size_limit} per request", "limit"
            )  # fmt: skip
            return False
        try:
            self.scheduler.check_room(principal, count)
        except Busy as exc:
            self._reject(request, str(exc), p.BUSY)
            return False
        except TooLarge as exc:
            self._reject(request, str(exc), "limit")
            return False
        return True

    def _room_for_bytes(self, request: p.Request, nbytes: int) -> bool:
        """Whether texts holding ``nbytes`` fit ``max_queued_bytes`` beside the requests admitted;
        if not, the refusal is sent: ``limit`` if they never could, else ``busy``."""
        cap = self.config.max_queued_bytes
        if nbytes > cap:
            self._reject(
                request, f"the request's texts take {_mib(nbytes)} in memory; this server holds at most {_mib(cap)} "
                "of queued texts (--max-queued-bytes): send fewer or shorter texts per request", "limit"
            )  # fmt: skip
            return False
        if self.queued_bytes + nbytes > cap:
            self._reject(
                request, f"the server is busy: the texts of the requests it holds take {_mib(self.queued_bytes)} of "
                f"its {_mib(cap)} (--max-queued-bytes), and this request's {_mib(nbytes)}; retry when some are "
                "answered", p.BUSY
            )  # fmt: skip
            return False
        return True

    def _publish_empty(self, request: p.Request) -> None:
        model = self.registry.model
        dim = int(model.get("output_dim", 0))
        shape = [0, 0, dim] if model.get("token_level") else [0, dim]
        header: dict[str, Any] = {"dtype": model.get("output_dtype", "float32"), "shape": shape}
        if request.header.get("show_tokens"):
            header["tokens"] = []
        if self.version is not None:
            header["model_version"] = self.version
        metrics.REQUESTS.labels(metrics.path_of(request.client_id), "ok").inc()
        frames = p.encode_reply(request.client_id, request.request_id, True, header, b"")
        self._publish(legacy.reply_to(request, frames))

    def _on_config(self, request: p.Request, user: bytes | None) -> None:
        frames = p.encode_reply(request.client_id, request.request_id, True, self.describe())
        self._publish(legacy.reply_to(request, frames))

    def describe(self) -> dict[str, Any]:
        public = self.config.public()
        public.pop("curve_dir", None)  # where the server keeps its keys is nobody else's business
        return {
            "server_version": __version__,
            "protocol": p.PROTOCOL_VERSION,
            "ready": self.ready,
            "curve": self.curve,
            **public,
            "max_message_bytes": self.config.message_limit,
            **self.registry.model,
        }

    def _on_status(self, request: p.Request, user: bytes | None) -> None:
        status = self.status()
        if legacy.is_legacy_request(request):  # bert-as-service's status holds its config too
            status = {**self.describe(), **status, legacy.STATUS_MARK: True}
        self.to_sink([p.STATUS, request.client_id, str(request.request_id).encode(), p.dumps(status)])

    def status(self) -> dict[str, Any]:
        return {
            "server_version": __version__,
            "ready": self.ready,
            "uptime_s": round(time.time() - self.started, 3),
            "requests_received": self.received,
            "requests_rejected": sum(self.rejected.values()),
            "rejections": dict(sorted(self.rejected.items())),
            "requests_pending": len(self.requests),
            "queued_bytes": self.queued_bytes,
            **self._versions(),
            **self.scheduler.stats(),
            **self.registry.stats(time.monotonic()),
            **({"worker_hosts": self.link.stats()} if self.link is not None else {}),
        }

    def _versions(self) -> dict[str, Any]:
        if self.version is None:
            return {}
        if self.versions_view is None:
            return {"model_version": self.version, "refused_versions": self.refused_versions, "swap": self.swap}
        return {"model_version": self.version, **self.versions_view.version_status()}

    def serve_version(self, config: ServerConfig) -> None:
        """Pin new requests to ``config``'s model version (a swap's workers of it are ready)."""
        self.config = config
        self.version = self.registry.serving = config.version_number
        metrics.MODEL.clear()  # labelled again with the new version's model by update_gauges
        self._model_labelled = False
        metrics.MODEL_VERSION.set(self.version or 0)

    def _on_terminate(self, request: p.Request, user: bytes | None) -> None:
        if not self._is_admin(user, self.config.allow_terminate):
            why = "its key is not in the server's admins/" if self.curve else "it listens beyond loopback"
            return self._reject(request, f"this server does not accept TERMINATE from clients: {why}", "forbidden")
        frames = p.encode_reply(request.client_id, request.request_id, True, {"stopping": True})
        self._publish(legacy.reply_to(request, frames))
        self.terminate_requested = True
        return None

    def _on_reload(self, request: p.Request, user: bytes | None) -> None:
        """Check the model repository now (for ``version``, default the newest), and swap to
        what it finds; answered at once, the swap's progress is in the status."""
        if not self._is_admin(user):
            why = "its key is not in the server's admins/" if self.curve else "it listens beyond loopback"
            return self._reject(request, f"this server does not accept RELOAD from clients: {why}", "forbidden")
        wanted = str(request.header.get("version", "latest")).lower()
        if self.version is None:
            return self._reject(request, "this server serves a model directory, not a repository of numbered "
                                "versions (1/, 2/, ...): there is no other version to load")  # fmt: skip
        if self.link is not None:
            return self._reject(request, "this server takes remote workers (--worker-port), whose model files "
                                "it cannot swap; restart the head and the workers on the new version")  # fmt: skip
        if wanted != "latest" and not (wanted.isdigit() and len(wanted) <= 9):
            return self._reject(request, f"version must be latest or a version number, not {wanted[:32]!r}")
        self.reload_requested = wanted
        self.reloads += 1
        answer = {"reload": self.reloads, "wanted": wanted, "model_version": self.version}
        self._publish(p.encode_reply(request.client_id, request.request_id, True, answer))
        return None

    def _is_admin(self, user: bytes | None, allowed: bool | None = None) -> bool:
        """Whether a client may run an administrative command: ``allowed`` if set, else
        admin keys under CURVE, else anyone when the server listens on loopback only."""
        if allowed is not None:
            return allowed
        if self.curve:
            return user is not None and user in self.admins
        return loopback_only(self.config.bind)

    # -- workers -------------------------------------------------------------------------

    def _on_worker_message(self, frames: list[bytes]) -> None:
        identity = frames[0]
        try:
            ready = link_schema.local_ready(frames[1:])
        except p.ProtocolError as exc:
            logger.error("dropped a malformed message from %r: %s", identity[:64], exc)
            return
        worker = self.registry.add(identity, ready, time.monotonic())
        logger.debug("worker %d (pid %d) ready with %d credits", worker.index, worker.pid, worker.credits)

    def _on_credit(self, frames: list[bytes]) -> None:
        try:
            message = link_schema.local_credit(frames)
        except p.ProtocolError as exc:
            logger.error("dropped a malformed credit message: %s", exc)
            return
        if isinstance(message, link_schema.Heartbeat):
            self.registry.heartbeat(message.worker, time.monotonic())
        else:
            self.job_done(message.worker.encode(), message)

    def job_done(self, identity: bytes, done: link_schema.Done) -> None:
        """Worker ``identity``'s DONE: its credit is free again, and the rows it computed are counted."""
        job = self.registry.done(identity, done, time.monotonic())
        if job is None:
            logger.debug("ignored DONE of job %s from %r: it is no longer that worker's", done.job, identity)
            return
        _count_job(job.size, done)
        for piece in job.pieces:
            request = self.requests.get(piece.key)
            if request is not None:
                request.rows -= len(piece.rows)
                if request.rows <= 0:
                    self._finish(piece.key)

    def worker_lost(self, index: int, reason: str) -> None:
        """Worker ``index`` died or stopped answering: forget it, and run its jobs elsewhere,
        except a job that has now lost two workers: its requests get an error reply."""
        for worker in self.registry.by_index(index):
            self.lose_worker(worker.identity, reason)

    def hand_back(self, identity: bytes) -> None:
        """A worker is leaving and returns what it holds: its jobs run elsewhere, and count as
        never run."""
        for job in self.registry.remove(identity):
            job.pieces = [piece for piece in job.pieces if piece.key in self.requests]
            if job.pieces:
                self.scheduler.retry(job)

    def lose_worker(self, identity: bytes, reason: str) -> None:
        retry, poisoned = self.registry.lose(identity)
        if retry or poisoned:
            logger.warning("%s: it held %d job(s); handing them to others", reason, len(retry) + len(poisoned))
        for job in retry:
            job.pieces = [piece for piece in job.pieces if piece.key in self.requests]  # not failed meanwhile
            if job.pieces:
                self.scheduler.retry(job)
        for job in poisoned:
            keys = {key for key in job.keys if key in self.requests}
            logger.error("job %s lost %d workers (%s); failing its requests %s", job.job_id, job.failures, reason, keys)
            error = (
                f"the request was running when its worker failed, {job.failures} times ({reason}); it is not "
                "retried: an input in it may crash the model"
            )
            self._fail(keys, error, "worker")

    def unresponsive_workers(self) -> list[tuple[int, int, str]]:
        """``(index, pid, reason)`` of local workers to kill: silent, or holding a job too long.
        They are forgotten at once and their jobs handed on; a remote one's host is told to
        kill it."""
        self._drain(self.credit_socket, self._on_credit)  # heartbeats that came while the loop was busy
        if self.link is not None:
            self._drain(self.link.socket, self.link.handle, copy=False)
        found = []
        for worker, reason in self.registry.unresponsive(time.monotonic()):
            if worker.host is None:
                found.append((worker.index, worker.pid, reason))
                label = f"worker {worker.index}"
            else:
                if self.link is not None:
                    self.link.forget_worker(worker.host, worker.name, reason)
                label = f"remote worker {worker.index} on {worker.hostname}"
            logger.warning("%s (pid %d) stopped answering (%s)", label, worker.pid, reason)
            self.lose_worker(worker.identity, f"{label} stopped answering ({reason})")
        return found

    def sink_lost(self) -> None:
        """The sink died and lost what it was assembling: every request still pending gets an
        error reply (through the new sink), and its queued work is dropped. A request whose
        rows were all computed was published by the old sink (it publishes as the last row
        arrives), so it is not answered again."""
        # What was queued for the dead sink (registrations of these requests) must not reach the new one.
        self.sink.close(linger=0)
        self.sink = self._connect_sink()
        self.outbox.clear()
        keys = sorted(self.requests)
        self.scheduler.remove(set(keys))
        error = "the server's sink process failed while this request was in flight; please retry"
        for key in keys:
            request = self.requests[key]
            self._finish(key)
            # Queued until the new sink binds; it lets clients subscribe again before it publishes.
            reply = legacy.error_reply if request.legacy else p.error_reply
            self._publish(reply(request.client, request.request_id, error, "internal"))
            metrics.REQUESTS.labels(metrics.path_of(request.client), "internal").inc()

    # -- dispatch ------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Jobs to workers with free credits; a job runs only on a worker of its version (two
        run side by side only while a swap is under way, see :mod:`.swap`)."""
        now = time.monotonic()
        while (worker := self.registry.pick()) is not None:
            job = self.scheduler.next_job(now, idle=not worker.jobs)
            if job is None:
                return
            if job.version != worker.version and (worker := self.registry.pick(job.version)) is None:
                self.scheduler.put_back(job)  # its version's workers are all busy
                return
            self._send_job(worker, job, now)
        # Every credit is taken: small requests overtake, to workers that hold only bulk work.
        while self.scheduler.small_count and (worker := self.registry.pick_overtake()) is not None:
            job = self.scheduler.next_small_job(self.config.model.batch_size)
            if job is None:
                return
            if job.version != worker.version and (worker := self.registry.pick_overtake(job.version)) is None:
                self.scheduler.put_back(job)
                return
            self._send_job(worker, job, now)

    def _send_job(self, worker: WorkerState, job: Job, now: float) -> None:
        frames = [wire.JOB, job.job_id.encode(), p.dumps(job.header()), p.dumps(job.texts)]
        try:
            if worker.host is None:
                self.backend.send_multipart([worker.identity, *frames], zmq.NOBLOCK)
            else:
                assert self.link is not None
                self.link.send_job(worker.host, worker.name, frames)
        except zmq.ZMQError as exc:  # the worker vanished between READY and now
            logger.warning("could not reach worker %d: %s", worker.index, exc)
            self.scheduler.retry(job)  # never ran: not its fault
            self.lose_worker(worker.identity, f"worker {worker.index} became unreachable")
            return
        logger.debug("job %s (%d inputs%s) to worker %d", job.job_id, job.size, ", bulk" if job.bulk else "",
                     worker.index)  # fmt: skip
        metrics.JOB_SENTENCES.observe(job.size)
        self.registry.assign(worker, job, now)

    def fail_everything(self, error: str) -> None:
        """Shutdown: every request still queued or in flight gets an error reply."""
        self.scheduler.drain_keys()
        keys = set(self.requests)
        self.requests.clear()
        self.live.clear()
        self.queued_bytes = 0
        if keys:
            self.to_sink([wire.FAIL, p.dumps({"keys": sorted(keys), "error": error, "kind": "shutdown"})])

    def stop_sink(self, timeout_s: float = 5.0) -> None:
        """Tell the sink to publish what is left and exit, after everything already queued for it."""
        self.to_sink([wire.STOP])
        deadline = time.monotonic() + timeout_s
        while self.outbox and time.monotonic() < deadline:
            if self.sink.poll(50, zmq.POLLOUT):
                self._flush()

    def update_gauges(self) -> None:
        """Queue depths, requests in flight, workers and readiness, for ``/metrics``."""
        stats = self.scheduler.stats()
        small = stats["queued_small_sentences"]
        retries = sum(job.size for job in self.scheduler.retries)
        metrics.QUEUED.labels("small").set(small)
        metrics.QUEUED.labels("retry").set(retries)
        metrics.QUEUED.labels("bulk").set(max(0, stats["queued_sentences"] - small - retries))
        metrics.QUEUED_REQUESTS.labels("small").set(stats["queued_small_requests"])
        metrics.QUEUED_REQUESTS.labels("bulk").set(stats["queued_bulk_requests"])
        metrics.RUNNING_JOBS.set(self.registry.in_flight)
        workers = self.registry.workers.values()
        slots = sum(w.slots for w in workers)
        metrics.PADDING.set(1 - sum(w.tokens for w in workers) / slots if slots else 0.0)
        metrics.IN_FLIGHT.set(len(self.requests))
        metrics.QUEUED_BYTES.set(self.queued_bytes)
        metrics.WORKERS.set(len(self.registry))
        metrics.READY.set(1 if self.ready and self.accepting else 0)
        model = self.registry.model
        if model and not self._model_labelled:
            self._model_labelled = True
            metrics.MODEL.labels(
                model=self.config.model.model_dir, dtype=str(model.get("dtype")),
                pooling_strategy=str(model.get("pooling_strategy")), output_dim=str(model.get("output_dim")),
                max_seq_len=str(model.get("max_seq_len")),
            ).set(1)  # fmt: skip

    # -- what the version swap sees (interfaces.WorkerPool) ----------------------------------

    @property
    def serving_version(self) -> int | None:
        return self.version

    def queued_versions(self) -> set[int | None]:
        return self.scheduler.versions()

    def worker_ready(self, index: int) -> bool:
        return bool(self.registry.by_index(index))

    def worker_draining(self, index: int) -> bool:
        workers = self.registry.by_index(index)
        return bool(workers) and all(worker.draining for worker in workers)

    def worker_holds_jobs(self, index: int) -> bool:
        return any(worker.jobs for worker in self.registry.by_index(index))

    def drain_worker(self, index: int) -> None:
        for worker in self.registry.by_index(index):
            self.registry.drain(worker.identity)

    def attach_versions(self, view: VersionsView) -> None:
        """Where the status reads the refused versions and the swap's progress from."""
        self.versions_view = view

    def stop_accepting(self) -> None:
        """Shutdown's first stage: no request is read from now on."""
        self.accepting = False

    def take_reload(self) -> tuple[str, int] | None:
        wanted, self.reload_requested = self.reload_requested, None
        return None if wanted is None else (wanted, self.reloads)

    def stop_worker(self, index: int) -> None:
        """Tell local worker ``index`` to stop (it holds nothing: a swap drained it)."""
        for worker in self.registry.by_index(index):
            with contextlib.suppress(zmq.ZMQError):  # already gone: its exit is noticed anyway
                self.backend.send_multipart([worker.identity, wire.STOP], zmq.NOBLOCK)

    def stop_workers(self) -> None:
        """Local workers stop; remote hosts are told to join again (a head that comes back)."""
        for worker in list(self.registry.workers.values()):
            if worker.host is not None:
                continue
            with contextlib.suppress(zmq.ZMQError):  # a worker that is already gone needs no STOP
                self.backend.send_multipart([worker.identity, wire.STOP], zmq.NOBLOCK)
        if self.link is not None:
            self.link.stop()


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _count_job(size: int, done: link_schema.Done) -> None:
    """A worker's DONE: its inputs, tokens and model time, for ``/metrics``."""
    metrics.SENTENCES.inc(size)
    metrics.TOKENS.inc(done.tokens)
    metrics.TOKEN_SLOTS.inc(done.slots)
    metrics.JOB_SECONDS.observe(done.seconds)
