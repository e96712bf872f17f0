"""The head's worker link: remote workers join the ventilator over tcp.

One ROUTER socket on ``--worker-port`` carries everything between the head and each host of
remote workers (``bertserve worker``, :mod:`..remote.host`): the handshake, jobs, credits,
heartbeats both ways and results. A host connects one DEALER and speaks for the worker
processes on its machine; each of them enters the registry like a local worker, keyed
``<host routing id>/<its identity>``, and gets jobs by the same credits.

- **Handshake** (:mod:`.handshake`). A host's HELLO names its link version and the sha256 of
  its model files; the head answers WELCOME with the model options every worker must run, or
  REFUSED saying why. A message from a host the head does not know (it restarted, or forgot
  the host) is answered BYE: the host joins again.
- **Liveness.** The head sends each host a heartbeat every second; a host passes on its
  workers' heartbeats and sends its own. A host silent for ``heartbeat_timeout_ms`` is
  forgotten, and its workers' jobs go to other workers (the registry counts an attempt
  against each, as for a local worker that dies).
- **Leaving.** A host that stops sends DRAIN (its workers get nothing new, and finish what
  they hold), then BYE: the head takes back what they still hold, without counting it
  against the jobs.
- **Checked at the edge.** Every message is parsed by its schema (:mod:`..protocol.link`) before
  anything acts on it; one that does not follow it is dropped with one log line (at most one a
  second, counting the rest), from a joined host or not. A host has at most the workers its
  HELLO named; a worker gets at most :data:`~.registry.MAX_CREDITS` credits (or the head's
  ``--prefetch-size`` if larger): one asking for more is given that many, and the head says so
  once per host.
- **Nothing read from a peer that has not joined** but its HELLO (at most
  :data:`~..protocol.link.MAX_HELLO_BYTES`); anything else of it is answered BYE unread. A
  RESULT is read only for a job its worker holds, its header within what the job could need.
- **What a worker says of its model** is allow-listed
  (:class:`~..protocol.link_bodies.ModelInfo`), and kept with that worker only (:mod:`.registry`).
- **Results only for the job held.** A RESULT is passed to the sink only if its worker still
  holds the job (a late one is dropped, so nothing is counted twice) and its parts are exactly
  the job's (the same request keys, the same rows, in order), rebuilt from the parsed header;
  a JOB_ERROR fails the job's own requests (whatever parts it names), with its text cut short
  and its kind one of :data:`~..protocol.link_bodies.ERROR_KINDS` (else ``worker``). A worker
  that sends the result of a job it holds that does not fit it, a second result, or a DONE
  before the result, is broken: the head loses it (its jobs run elsewhere, an attempt counted
  against each) and tells its host to replace it (FORGET).

Under CURVE the socket is a CURVE server in the ZAP domain ``workers``: only keys in the key
directory's ``workers/`` may join. Without CURVE anyone who reaches the port may join, and
nothing tells a host that its head is the real one: see :mod:`..remote.host`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import zmq
from bertserve.client import protocol as p

from ...config.server import HEARTBEAT_INTERVAL_MS, ServerConfig
from ...logs import Refusals
from ..policy.jobs import Job
from ..protocol import link as schema, link_bodies as bodies, wire
from .handshake import Host, as_served, refusal, welcome_options
from .models import Models
from .registry import Registry
from .requests import Requests

logger = logging.getLogger("bertserve.link")

_REJOIN_INTERVAL_S = 1.0  # at most one BYE a second to a host the head does not know


class Head(Protocol):
    """What the link needs of the head (the ventilator): the registry its workers join, the
    owner of requests (told what happens to their jobs), and the line to the sink."""

    registry: Registry
    requests: Requests

    @property
    def models(self) -> Models: ...

    def to_sink(self, frames: list[Any]) -> None: ...


class WorkerLink:
    """The head's side of the worker link; the ventilator polls :attr:`socket` and calls
    :meth:`handle` with what it reads, and :meth:`tick` from its loop."""

    def __init__(self, config: ServerConfig, context: zmq.Context, head: Head, curve_keys: Any = None) -> None:
        assert config.ports.worker_port is not None
        self.config = config
        self.head = head
        self.hosts: dict[bytes, Host] = {}
        self.timeout_s = config.workers.heartbeat_timeout_ms / 1000
        self._next_beat = 0.0
        self._told_to_rejoin: dict[bytes, float] = {}
        self._refusals = Refusals(logger, level=logging.ERROR)
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.router_mandatory = True
        self.socket.maxmsgsize = schema.MAX_FRAME_BYTES
        if curve_keys is not None:
            from ...security import WORKER_DOMAIN, make_curve_server

            make_curve_server(self.socket, curve_keys)
            self.socket.zap_domain = WORKER_DOMAIN.encode()
        self.address = f"tcp://{config.ports.bind}:{config.ports.worker_port}"
        self.socket.bind(self.address)

    def close(self) -> None:
        self.socket.close()

    # -- what hosts send -------------------------------------------------------------------

    def handle(self, frames: list[zmq.Frame]) -> None:
        """One message from a host: ``[routing id, kind, ...]``. One that does not follow its
        schema is dropped with one log line; nothing a host sends raises past this method."""
        if not frames:
            return
        host_id = frames[0].bytes
        host = self.hosts.get(host_id)
        if host is None:
            self._from_stranger(host_id, frames[1:])
            return
        try:
            message = self._parse(host, frames[1:])
        except schema.LinkError as exc:
            self._on_malformed(host_id, frames, exc)
            return
        if message is None:
            return
        try:
            host.last_seen = time.monotonic()
            if isinstance(message, bodies.Hello):
                self._on_hello(host_id, message)
            else:
                self._dispatch(host, message)
        except Exception:  # a bug, not the peer's doing: logged in full, and the head goes on
            logger.exception("handling a %s from %s failed", type(message).__name__, self._who(host_id))

    def _from_stranger(self, host_id: bytes, frames: list[zmq.Frame]) -> None:
        """A peer that has not joined: its HELLO is read (a small frame); anything else is
        answered BYE unread, so a host the head forgot joins again."""
        if not schema.is_hello(frames):
            self._tell_to_rejoin(host_id)
            return
        try:
            hello = schema.hello(frames)
        except schema.LinkError as exc:
            self._refusals.log("dropped a message from %s: %s", self._who(host_id), exc)
            return
        try:
            self._on_hello(host_id, hello)
        except Exception:  # a bug, not the peer's doing
            logger.exception("handling a HELLO from %s failed", self._who(host_id))

    def _parse(self, host: Host, frames: list[zmq.Frame]) -> schema.FromHost | None:
        """A joined host's message, parsed; a RESULT's header only if its worker holds the job,
        and within what that job could need. ``None``: a late result, dropped unread."""
        target = schema.result_of(frames)
        if target is None:
            return schema.from_host(frames)
        worker, job_id = target
        job = self.head.registry.held(self._key(host, worker), job_id)
        if job is None:
            logger.debug("dropped a late result of job %s from %s: no worker holds it", job_id, host.hostname)
            return None
        tokens = any(piece.show_tokens for piece in job.pieces)
        bound = schema.result_header_bound(rows=job.size, parts=len(job.pieces), texts=job.texts if tokens else None)
        return schema.from_host(frames, result_header_bytes=bound)

    def _on_malformed(self, host_id: bytes, frames: list[zmq.Frame], exc: schema.LinkError) -> None:
        """Drop a message that does not follow its schema; a malformed result of a job its
        worker holds makes that worker broken (else the job would wait for its deadline)."""
        host = self.hosts.get(host_id)
        if host is not None and exc.kind in (wire.RESULT, wire.JOB_ERROR) and len(frames) >= 4:
            try:
                key, job_id = self._key(host, schema.name(frames[2])), schema.job_id(frames[3])
            except schema.LinkError:
                pass
            else:
                if self.head.registry.held(key, job_id) is not None:
                    self._broken(host, key, f"its result of job {job_id} is malformed ({exc})")
                    return
        self._refusals.log("dropped a message from %s: %s", self._who(host_id), exc)

    def _who(self, host_id: bytes) -> str:
        host = self.hosts.get(host_id)
        return f"host {host.hostname}" if host is not None else f"unjoined peer {host_id[:32]!r}"

    def _dispatch(self, host: Host, message: schema.FromHost) -> None:
        vent = self.head
        if isinstance(message, schema.Heartbeat):
            if message.worker:
                vent.registry.heartbeat(self._key(host, message.worker), time.monotonic())
        elif isinstance(message, bodies.Done):
            self._on_done(host, message)
        elif isinstance(message, schema.WorkerResult):
            self._on_result(host, message)
        elif isinstance(message, schema.WorkerError):
            self._on_job_error(host, message)
        elif isinstance(message, schema.WorkerReady):
            self._on_ready(host, message)
        elif isinstance(message, schema.Gone):
            vent.requests.worker_lost(
                self._key(host, message.worker), f"remote worker on {host.hostname}: {message.reason}"
            )
        elif isinstance(message, schema.Drain):
            host.draining = True
            for worker in vent.registry.of_host(host.routing_id):
                vent.registry.drain(worker.identity)
            logger.info("host %s is stopping: its workers finish what they hold and get nothing new", host.hostname)
        elif isinstance(message, schema.Bye):
            self._forget(host, None)
            logger.info("host %s left", host.hostname)
        else:  # a HELLO is handled before
            raise AssertionError(f"unexpected {message!r}")

    def _on_ready(self, host: Host, message: schema.WorkerReady) -> None:
        vent = self.head
        key = self._key(host, message.worker)
        known = key in vent.registry.workers
        if not known and len(vent.registry.of_host(host.routing_id)) >= host.workers:
            self._refusals.log(
                "refused worker %s of host %s: its HELLO named %d worker(s), all registered",
                message.worker.decode(),
                host.hostname,
                host.workers,
            )
            return
        served = vent.models.get(host.model)
        if served is None:  # not after a HELLO that named it
            return
        ready = as_served(message.ready, served, host.hostname)
        if known:  # registered again: what it held is not coming back
            vent.requests.hand_back(key)
        worker = vent.registry.add(key, ready, time.monotonic(), host=host.routing_id, model=served.name)
        if host.draining:
            vent.registry.drain(key)
        if worker.credits < ready.credits and not host.clamped:
            host.clamped = True
            logger.warning(
                "remote worker %d on %s asked for %d credits; a worker of this head gets at most %d",
                worker.index,
                worker.hostname,
                ready.credits,
                worker.credits,
            )
        logger.log(
            logging.DEBUG if known else logging.INFO,
            "remote worker %d on %s (%s) joined with %d credit(s)",
            worker.index,
            worker.hostname,
            worker.device or "?",
            worker.credits,
        )

    def _on_done(self, host: Host, done: bodies.Done) -> None:
        key = self._key(host, done.worker.encode())
        registry = self.head.registry
        if registry.held(key, done.job) is not None and not registry.answered(key, done.job):
            self._broken(host, key, f"it returned the credit of job {done.job} before its result")
            return
        self.head.requests.done(key, done)

    def _on_result(self, host: Host, message: schema.WorkerResult) -> None:
        key = self._key(host, message.worker)
        parts = [(part.key, part.rows) for part in message.header.parts]
        job = self._answered_job(
            host, key, message.job_id, lambda job: parts == [(piece.key, piece.rows.tolist()) for piece in job.pieces]
        )
        if job is not None:
            header = p.dumps(message.header.plain())
            self.head.to_sink([wire.RESULT, job.job_id.encode(), header, message.buffer])

    def _on_job_error(self, host: Host, message: schema.WorkerError) -> None:
        job = self._answered_job(host, self._key(host, message.worker), message.job_id)
        if job is None:
            return
        error = message.error
        header = {"parts": job.parts(), "error": error.safe_error, "kind": error.safe_kind}
        self.head.to_sink([wire.JOB_ERROR, job.job_id.encode(), p.dumps(header)])

    def _answered_job(
        self, host: Host, key: bytes, job_id: str, fits: Callable[[Job], bool] = lambda job: True
    ) -> Job | None:
        """The job a RESULT or JOB_ERROR answers, if worker ``key`` holds it, the answer
        ``fits`` it and is its first; else ``None`` (a late answer is dropped, a misfit or a
        second one makes the worker broken)."""
        registry = self.head.registry
        job = registry.held(key, job_id)
        if job is None:
            logger.debug("dropped a late answer of job %s from %r: the job is no longer its", job_id, key)
        elif not fits(job):
            self._broken(host, key, f"its result of job {job_id} names other requests or rows than the job's")
        elif not registry.answer(key, job_id):
            self._broken(host, key, f"it sent a second result of job {job_id}")
        else:
            return job
        return None

    def _broken(self, host: Host, key: bytes, reason: str) -> None:
        """A worker broke the link's rules: lose it (its jobs run elsewhere), and have its host replace it."""
        name = key.rpartition(b"/")[2]
        self._refusals.log("remote worker %s on %s is broken: %s; forgetting it", name.decode(), host.hostname, reason)
        self.head.requests.worker_lost(key, f"remote worker {name.decode()} on {host.hostname} is broken ({reason})")
        self.forget_worker(host.routing_id, name, reason)

    def _on_hello(self, host_id: bytes, hello: bodies.Hello) -> None:
        error = refusal(hello, self.head.models, joined=len(self.hosts), known=host_id in self.hosts)
        if error is not None:
            self._refusals.log("refused host %s: %s", hello.hostname, error)
            self._send([host_id, wire.REFUSED, p.dumps({"error": error})])
            return
        old = self.hosts.get(host_id)
        if old is not None:  # said HELLO again: what it had is gone
            self._forget(old, "it joined again")
        served = self.head.models.get(hello.model_name)
        assert served is not None  # checked by refusal
        self.hosts[host_id] = Host(host_id, hello.hostname, time.monotonic(), workers=hello.workers, model=served.name)
        self._told_to_rejoin.pop(host_id, None)
        logger.info(
            "host %s joined for model %s (bertserve %s, %d worker(s))",
            hello.hostname,
            served.name,
            hello.version,
            hello.workers,
        )
        self._send([host_id, wire.WELCOME, p.dumps(welcome_options(served.config))])

    def _tell_to_rejoin(self, host_id: bytes) -> None:
        now = time.monotonic()
        if now - self._told_to_rejoin.get(host_id, -_REJOIN_INTERVAL_S) >= _REJOIN_INTERVAL_S:
            if len(self._told_to_rejoin) > 10_000:
                self._told_to_rejoin.clear()
            self._told_to_rejoin[host_id] = now
            self._send([host_id, wire.BYE])

    @staticmethod
    def _key(host: Host, name: bytes) -> bytes:
        return host.routing_id + b"/" + name

    # -- what the head sends ---------------------------------------------------------------

    def send_job(self, host: bytes, name: bytes, frames: list[Any]) -> None:
        """``[JOB, job_id, header, payload]`` to worker ``name`` of ``host``; raises
        ``zmq.ZMQError`` if the host cannot be reached."""
        self.socket.send_multipart([host, frames[0], name, *frames[1:]], zmq.NOBLOCK)

    def forget_worker(self, host: bytes, name: bytes, reason: str) -> None:
        """The head forgot this worker (it stopped answering): its host kills and replaces it."""
        self._send([host, wire.FORGET, name, reason.encode()])

    def _send(self, frames: list[Any]) -> bool:
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # gone, or not taking more: its silence will tell
            return False

    def tick(self, now: float) -> None:
        """Heartbeats to every host, and forget hosts that fell silent."""
        if now < self._next_beat:
            return
        self._next_beat = now + HEARTBEAT_INTERVAL_MS / 1000
        for host in list(self.hosts.values()):
            silent = now - host.last_seen
            if silent > self.timeout_s:
                logger.error("host %s sent nothing for %.1f s; forgetting it and its workers", host.hostname, silent)
                self._forget(host, f"its host {host.hostname} sent nothing for {silent:.1f} s")
            else:
                self._send([host.routing_id, wire.HEARTBEAT])

    def _forget(self, host: Host, reason: str | None) -> None:
        """Forget ``host`` and its workers: their jobs run elsewhere. ``reason`` None: the host
        handed them back (they count as never run); else it was lost (an attempt each)."""
        self.hosts.pop(host.routing_id, None)
        for worker in self.head.registry.of_host(host.routing_id):
            if reason is None:
                self.head.requests.hand_back(worker.identity)
            else:
                self.head.requests.worker_lost(worker.identity, reason)

    def stop(self) -> None:
        """The head is stopping: every host is told to join again (a head that comes back)."""
        for host_id in list(self.hosts):
            with contextlib.suppress(zmq.ZMQError):
                self.socket.send_multipart([host_id, wire.BYE], zmq.NOBLOCK)
        self.hosts.clear()

    def stats(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [
            {
                "hostname": h.hostname,
                "draining": h.draining,
                "last_heartbeat_s": round(now - h.last_seen, 2),
                "workers": len(self.head.registry.of_host(h.routing_id)),
            }
            for h in self.hosts.values()
        ]
