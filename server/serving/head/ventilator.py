"""The ventilator: moves frames between clients, the scheduler, the workers and the sink.

It is socket glue and dispatch. Policy lives elsewhere, each part the one owner of its
state: :mod:`..policy.admission` says whether a request is taken, :mod:`..policy.scheduler` what runs next,
:mod:`.registry` which worker holds which job, :mod:`.requests` the requests not yet seen
through, :mod:`.control` the answers to control commands, :mod:`..protocol.formats` how a reply is laid
out for its client. This module reads requests (checking, under CURVE, that a client id
belongs to the sender's key) and hands jobs to workers, without ever blocking on a send to
the sink (:mod:`.outbox`). What happens to a request, from admission to its end, is
:mod:`.requests`'. Workers on other machines reach it through
:mod:`.link` (``--worker-port``) and get jobs by the same credits; its own workers' READY and
DONE are parsed by the same schemas as theirs (:mod:`..protocol.link`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import zmq
from bertserve.client import __version__, protocol as p

from ... import metrics
from ...config.server import ServerConfig
from ...model.prompts import Prompts
from ..policy.scheduler import Scheduler
from ..protocol import link as link_schema, wire
from ..protocol.formats import ReplyFormat
from ..protocol.sockets import drain
from ..protocol.wire import Addresses
from .clients import Clients
from .control import Control, describe
from .dispatch import Dispatch
from .expiry import Expiry
from .gauges import HeadGauges
from .link import WorkerLink
from .models import HeadModel, ModelPool, Models, model_ready, model_status, model_summary, versions_status
from .outbox import SinkOutbox
from .registry import MAX_CREDITS, Registry, WorkerState
from .requests import Requests

logger = logging.getLogger("bertserve.ventilator")

_CLIENT_DRAIN_S = 0.05  # longest the loop reads clients before it looks at workers again
_GAUGE_INTERVAL_S = 0.5

_Command = Callable[[p.Request, bytes | None, ReplyFormat], None]


class Ventilator:
    def __init__(
        self,
        config: ServerConfig,
        context: zmq.Context,
        frontend: zmq.Socket,
        addresses: Addresses,
        models: Models | Scheduler,
        *,
        curve_admins: frozenset[bytes] | None = None,
        gateway_key: bytes | None = None,
        model_sha256: str = "",
        curve_keys: Any = None,
        prompts: Prompts | None = None,
    ) -> None:
        self.config = config
        if isinstance(models, Scheduler):  # one model: the whole server's
            models = Models.single(config, models, prompts=prompts or Prompts({}, None), sha256=model_sha256)
        self.models = models
        self.registry = Registry(
            job_timeout_s=config.workers.job_timeout_ms / 1000,
            heartbeat_timeout_s=config.workers.heartbeat_timeout_ms / 1000,
            max_credits=max(MAX_CREDITS, config.workers.prefetch_size),
        )
        self.curve = curve_admins is not None
        self.frontend = frontend  # PULL from clients, bound by the server
        self.backend = context.socket(zmq.ROUTER)
        self.backend.linger = 0
        self.backend.router_mandatory = True
        self.backend.bind(addresses.jobs)
        self.credit_socket = context.socket(zmq.PULL)
        self.credit_socket.linger = 0
        self.credit_socket.bind(addresses.credits)
        self.outbox = SinkOutbox(context, addresses.sink)
        self.requests = Requests(models, self.registry, self.outbox)
        self.control = Control(config, admins=curve_admins, remote_workers=config.ports.worker_port is not None)
        self.clients = Clients(
            config,
            self,
            registry=self.registry,
            requests=self.requests,
            outbox=self.outbox,
            control=self.control,
            curve=self.curve,
            gateway_key=gateway_key,
        )
        self.gauges = HeadGauges()
        self.accepting = True
        self.started = time.time()
        self.expiry = Expiry(self.requests)
        self.cancelled = 0  # requests their clients withdrew (CANCEL) while pending
        self._next_gauges = 0.0
        self.dispatch = Dispatch(models, self.registry, self.expiry, self._send_frames, self.requests.worker_lost)
        self.link: WorkerLink | None = None  # remote workers join here (--worker-port)
        if config.ports.worker_port is not None:
            self.link = WorkerLink(config, context, self, curve_keys)

    @property
    def scheduler(self) -> Scheduler:
        """The default model's queue."""
        return self.models.default.scheduler

    @property
    def prompts(self) -> Prompts:
        """The default model's prompts."""
        return self.models.default.prompts

    def pool(self, model: HeadModel) -> ModelPool:
        """The workers and queue of ``model``, as its version swap sees them."""
        return ModelPool(self, model)

    def close(self) -> None:
        for socket in (self.backend, self.credit_socket):
            socket.close()
        self.outbox.close()
        if self.link is not None:
            self.link.close()

    @property
    def in_flight(self) -> int:
        """Requests taken and not yet answered: queued, or running on a worker."""
        return len(self.requests)

    @property
    def idle(self) -> bool:
        return not self.requests and all(model.scheduler.empty for model in self.models) and not self.outbox

    @property
    def terminate_requested(self) -> bool:
        return self.control.terminate_requested

    def stop_accepting(self) -> None:
        """Shutdown's first stage: a new request is refused from now on (``shutdown``), and
        STATUS says the server is not ready."""
        self.accepting = False

    # -- the loop ------------------------------------------------------------------------

    def poll_once(self, timeout_ms: int = 100) -> None:
        poller = zmq.Poller()
        if not self.outbox.full:  # a stalled sink holds clients back
            poller.register(self.frontend, zmq.POLLIN)
        poller.register(self.backend, zmq.POLLIN)
        poller.register(self.credit_socket, zmq.POLLIN)
        if self.link is not None:
            poller.register(self.link.socket, zmq.POLLIN)
        if self.outbox:
            poller.register(self.outbox.socket, zmq.POLLOUT)
        events = dict(poller.poll(self._wait_ms(timeout_ms)))
        if self.backend in events:
            drain(self.backend, self._on_worker_message)
        if self.credit_socket in events:
            drain(self.credit_socket, self._on_credit)
        if self.link is not None and self.link.socket in events:
            drain(self.link.socket, self.link.handle, copy=False)
        if self.frontend in events:
            drain(self.frontend, self.clients.handle, copy=False, seconds=_CLIENT_DRAIN_S)
        self.outbox.flush()
        self.dispatch.run(time.monotonic())
        now = time.monotonic()
        if self.link is not None:
            self.link.tick(now)
        self.expiry.tick(now)
        if now >= self._next_gauges:
            self._next_gauges = now + _GAUGE_INTERVAL_S
            self.update_gauges()

    def _wait_ms(self, timeout_ms: int) -> int:
        """How long the loop may sleep: ``timeout_ms``, or, while small requests wait, until
        one falls due for a worker with a credit free, or a busy worker is about to be free
        (its next job goes then, :meth:`.registry.Registry.pick_ahead`)."""
        wait, now = timeout_ms, time.monotonic()
        for model in self.models:
            due = model.scheduler.wake_in(now)
            if due is None:  # no small request waits
                continue
            if self.registry.pick(model=model.name) is not None:
                wait = min(wait, int(due * 1000) + 1)
            free_at = self.registry.next_free_at(model.name, now)
            if free_at is not None:
                wait = min(wait, max(1, math.ceil((free_at - now) * 1000)))
        return wait

    def cancel(self, keys: set[str]) -> None:
        """Requests their clients withdrew: their queued work is dropped and each is answered
        as cancelled; rows a worker is computing are dropped by the sink when they come."""
        self.cancelled += len(keys)
        self.requests.fail(keys, "the client cancelled this request", p.CANCELLED)

    # -- the sink --------------------------------------------------------------------------

    def to_sink(self, frames: list[Any]) -> None:
        self.outbox.send(frames)

    # -- control commands (answered by .control) -------------------------------------------

    def describe(self, model: HeadModel | None = None) -> dict[str, Any]:
        """The CONFIG answer for ``model`` (default: the default model), with every model listed."""
        model = model or self.models.default
        info = self.registry.model_info(model.name, model.version)
        answer = describe(model.served_config, curve=self.curve, ready=self.model_ready(model), model=info)
        answer["model_version"] = model.model_version  # the head's: the options say what was asked
        answer.update(model.prompts.describe())
        answer.update(
            model_name=model.name,
            default_model=self.models.default.name,
            default_models=self.models.default_names(),
            models=[model_summary(served, self.registry) for served in self.models],
        )
        return answer

    def model_ready(self, model: HeadModel) -> bool:
        return model_ready(model, self.registry)

    def status(self) -> dict[str, Any]:
        queues = [model.scheduler.stats() for model in self.models]
        return {
            "server_version": __version__,
            "ready": self.ready and self.accepting,
            "stopping": not self.accepting,
            "uptime_s": round(time.time() - self.started, 3),
            **self.clients.stats(),
            "requests_pending": len(self.requests),
            "requests_cancelled": self.cancelled,
            "expired_sentences_dropped": self.expiry.sentences,
            "queued_bytes": self.requests.queued_bytes,
            **versions_status(self.models.default),
            **{key: sum(queue[key] for queue in queues) for key in queues[0]},
            **self.registry.stats(time.monotonic()),
            "models": {
                model.name: model_status(model, self.registry, queue, default=model is self.models.default)
                for model, queue in zip(self.models, queues, strict=True)
            },
            **({"worker_hosts": self.link.stats()} if self.link is not None else {}),
        }

    @property
    def ready(self) -> bool:
        """Every model has a worker."""
        return all(self.model_ready(model) for model in self.models)

    # -- workers -------------------------------------------------------------------------

    def _on_worker_message(self, frames: list[bytes]) -> None:
        identity = frames[0]
        try:
            ready = link_schema.local_ready(frames[1:])
        except p.ProtocolError as exc:
            logger.error("dropped a malformed message from %r: %s", identity[:64], exc)
            return
        model = self.models.get(ready.model_name)
        if model is None:
            logger.error(
                "dropped READY of worker %r: it runs model %r, which this head does not serve",
                identity[:64],
                ready.model_name,
            )
            return
        worker = self.registry.add(identity, ready, time.monotonic(), model=model.name)
        logger.debug(
            "worker %d (pid %d, model %s) ready with %d credits", worker.index, worker.pid, model.name, worker.credits
        )

    def _on_credit(self, frames: list[bytes]) -> None:
        try:
            message = link_schema.local_credit(frames)
        except p.ProtocolError as exc:
            logger.error("dropped a malformed credit message: %s", exc)
            return
        if isinstance(message, link_schema.Heartbeat):
            self.registry.heartbeat(message.worker, time.monotonic())
        else:
            self.requests.done(message.worker.encode(), message)

    def worker_lost(self, index: int, reason: str) -> None:
        """Worker ``index`` died or stopped answering: forget it, and run its jobs elsewhere,
        except a job that has now lost two workers: its requests get an error reply."""
        for worker in self.registry.by_index(index):
            self.requests.worker_lost(worker.identity, reason)

    def unresponsive_workers(self) -> list[tuple[int, int, str]]:
        """``(index, pid, reason)`` of local workers to kill: silent, or holding a job too long.
        They are forgotten at once and their jobs handed on; a remote one's host is told to
        kill it."""
        drain(self.credit_socket, self._on_credit)  # heartbeats that came while the loop was busy
        if self.link is not None:
            drain(self.link.socket, self.link.handle, copy=False)
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
            self.requests.worker_lost(worker.identity, f"{label} stopped answering ({reason})")
        return found

    def sink_lost(self) -> None:
        """The sink died and lost what it was assembling: every request still pending gets an
        error reply (through the new sink), and its queued work is dropped. A request whose
        rows were all computed was published by the old sink (it publishes as the last row
        arrives), so it is not answered again."""
        self.outbox.reconnect()  # what was queued for the dead sink (their registrations) must not reach the new one
        self.requests.sink_lost()

    # -- dispatch (.dispatch) ----------------------------------------------------------------

    def _send_frames(self, worker: WorkerState, frames: list[Any]) -> None:
        """``frames`` to ``worker``, local or remote; raises ``zmq.ZMQError`` if it cannot be reached."""
        if worker.host is None:
            self.backend.send_multipart([worker.identity, *frames], zmq.NOBLOCK)
        else:
            assert self.link is not None
            self.link.send_job(worker.host, worker.name, frames)

    def fail_everything(self, error: str) -> None:
        """Shutdown: every request still queued or in flight gets an error reply."""
        self.requests.fail_all(error)

    def stop_sink(self, timeout_s: float = 5.0) -> None:
        """Tell the sink to publish what is left and exit, after everything already queued for it."""
        self.outbox.send([wire.STOP])
        self.outbox.drain(timeout_s)

    def update_gauges(self) -> None:
        """Queue depths, requests in flight, workers and readiness, for ``/metrics``."""
        self.gauges.update(
            self.models,
            self.registry,
            in_flight=len(self.requests),
            queued_bytes=self.requests.queued_bytes,
            ready=self.ready and self.accepting,
        )

    # -- what a model's version swap sees (interfaces.WorkerPool, through models.ModelPool) --

    @property
    def local_workers(self) -> int:
        """Local workers registered (they loaded the model)."""
        return self.registry.local_count

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

    def serve_version(self, model: HeadModel, version: int | None, model_dir: str) -> None:
        """Pin ``model``'s new requests to ``version``, in ``model_dir`` (a swap's workers of it are ready)."""
        model.serve(version, model_dir)
        if model is self.models.default:
            metrics.MODEL_VERSION.set(model.version or 0)
        self.gauges.model_changed(model.name)  # labelled again with the new version's model by update_gauges

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
