"""``bertserve worker``: worker processes on another machine, joined to a head over tcp.

A *host* process runs this machine's worker processes exactly as a head runs its local ones
(the same :func:`..worker.worker.run_worker`, on ipc sockets the host binds) and relays between them
and the head over one DEALER connected to the head's ``--worker-port`` (:mod:`..protocol.link`, which
draws the messages):

- It joins with HELLO, naming the sha256 of its model files; the head answers with the
  model options every worker runs (WELCOME), or says why not (REFUSED: the host exits, code 2).
  The workers start once the head has answered, worker 0 first (it builds the graph cache).
- Jobs go to the worker the head chose; results, credits and heartbeats go back, each result
  before its job's credit (a credit that overtakes its result, on its other socket, waits).
- Heartbeats both ways: a head silent for its ``heartbeat_timeout_ms``, a send the link cannot
  take, or a BYE from the head (it stopped, or does not know this host) makes the host drop
  the connection and join again, for as long as it runs; its workers keep running meanwhile
  and register again.
- A worker that dies is reported (GONE), so the head runs its jobs elsewhere at once, and is
  restarted with the head's backoff rules; one the head forgot (FORGET: it stopped
  answering) is killed first.
- SIGTERM or Ctrl-C: the host asks the head for nothing new (DRAIN), lets its workers finish
  what they hold for the stop budget's drain (``--stop-timeout``), hands back the rest (BYE),
  and stops them, killing one still in a model run (Ctrl-C again: now).

``--health-port`` serves container probes (:mod:`.probes`). The workers are
:class:`..process.children.Children`, restarted by :mod:`..process.restarts`' rule, as the head's are.

What the head says is checked before it is used (:mod:`..protocol.link`), since only CURVE tells
a host that its head is the real one: with ``--server-key`` (and ``--client-cert``) the link
is a CURVE client that talks only to the holder of that key's secret; without it, whatever
answers on the head's address is taken for the head, and the host warns at start unless the
head is on loopback. Either way the model options of a WELCOME are held to
:class:`.config.HostConfig`'s rules (plain file names inside the model directory; a
model class only if this host's own ``--model-class`` names it), and one that breaks them is
refused: the host says why and exits (code 2), as for REFUSED. With a server key or not, a
frame past :data:`..protocol.link.MAX_FRAME_BYTES` drops the link unread (the host joins again).

Over 400 lines: :class:`WorkerHost` is one relay whose three sides (the link to the head, the
workers' sockets and the worker processes) act on one state: which workers run, which are
registered with the head, which results wait for their credits. Each side is a section of the
class; split into modules, each would reach into the others' fields.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import platform
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

import zmq
from bertserve.client import __version__, protocol as p

from ...config.server import ServerConfig
from ...config.stopping import StopPlan
from ...config.telemetry import Telemetry
from ...config.workers import HEARTBEAT_INTERVAL_MS
from ...errors import ConfigError, StartupError
from ...logs import Refusals
from ...security import loopback_only
from ..process.children import Children, worker_index, worker_name
from ..process.lifecycle import ExitFlags
from ..process.restarts import Fate
from ..protocol import link as schema, link_bodies as bodies, wire
from ..protocol.sockets import bound, drain
from ..protocol.wire import Addresses
from ..worker.worker import run_worker
from .config import HostConfig
from .probes import serve_probes

logger = logging.getLogger("bertserve.host")

_HELLO_INTERVAL_S = 1.0
_WAITING_NOTICE_S = 10.0  # how often "no answer from the head yet" is logged


@dataclass
class _Held:
    """A job a worker of this host holds: who, and whether its result went to the head."""

    worker: bytes
    result_sent: bool = False
    done: Any = None  # its DONE, if that came before the result


class WorkerHost(ExitFlags):
    def __init__(self, config: HostConfig, *, telemetry: Telemetry | None = None) -> None:
        from ...model.checksum import tree_sha256

        self.config = config
        self.telemetry = telemetry or Telemetry()
        super().__init__()
        self.exit_code = 0
        self.hostname = platform.node()
        try:
            self.model_sha256 = tree_sha256(config.model_dir, config.tuned_model_dir)
        except OSError as exc:
            raise StartupError(f"cannot read the model files: {exc}") from None
        self.children = Children(config.workers.max_restarts, logger)  # this machine's workers
        self.server_config: ServerConfig | None = None
        self.welcome_options: bodies.Welcome | None = None
        self._refusals = Refusals(logger, level=logging.ERROR)
        self.ready: dict[bytes, bytes] = {}  # worker identity -> its READY, to register again with a new head
        self.held: dict[bytes, _Held] = {}  # job id -> who holds it
        self.link: zmq.Socket | None = None
        self.watch: Any = None
        self.joined = False
        self.last_head = 0.0
        self.next_hello = 0.0
        self.next_beat = 0.0
        self.waiting_since = time.monotonic()
        self.next_notice = 0.0
        self.loop_at = time.monotonic()  # the loop's last turn, for /health
        self.addresses: Addresses | None = None

    # -- running -------------------------------------------------------------------------

    def run(self) -> int:
        """Serve the head until told to stop; returns the exit code."""
        self.context = zmq.Context()
        ipc_dir = tempfile.mkdtemp(prefix="bertserve-worker-")
        self.addresses = Addresses(f"ipc://{ipc_dir}/jobs", f"ipc://{ipc_dir}/credits", f"ipc://{ipc_dir}/sink")
        self.jobs = bound(self.context, zmq.ROUTER, self.addresses.jobs)
        self.jobs.router_mandatory = True
        self.credits = bound(self.context, zmq.PULL, self.addresses.credits)
        self.results = bound(self.context, zmq.PULL, self.addresses.sink)
        health = None
        if self.config.health_port is not None:
            health = serve_probes(self.config.health_bind, self.config.health_port, self._probe_state)
        try:
            self._connect()
            logger.info(
                "joining the head at %s (%d worker(s), model sha256 %s...)",
                self.config.address,
                self.config.workers.num_worker,
                self.model_sha256[:16],
            )
            if self.config.server_key is None and not loopback_only(self.config.server):
                logger.warning(
                    "no --server-key: nothing tells this worker that %s is the real head, and whoever answers there "
                    "gets its workers; run the link under CURVE (the head's --curve-dir) and give --server-key and "
                    "--client-cert",
                    self.config.address,
                )
            while not self.should_exit.is_set():
                self._poll(100)
                now = time.monotonic()
                self.loop_at = now
                self._keep_link(now)
                self._supervise(now)
            self._leave()
        finally:
            if health is not None:
                health.shutdown()
                health.server_close()
            self._stop_workers()
            self._close_link()
            for sock in (self.jobs, self.credits, self.results):
                sock.close(linger=0)
            self.context.term()
            shutil.rmtree(ipc_dir, ignore_errors=True)
        logger.info("bertserve worker stopped")
        return self.exit_code

    # -- the link to the head ---------------------------------------------------------------

    def _connect(self) -> None:
        """A fresh DEALER to the head, under a new routing id: nothing queued for the old
        connection is delivered to the head, and the head sees a new host."""
        from bertserve.client.security import HandshakeWatch, load_public_key, load_secret_cert

        link = self.context.socket(zmq.DEALER)
        link.linger = 0
        link.immediate = True  # a send with no connection fails at once rather than queueing
        link.sndhwm = 10_000
        link.maxmsgsize = schema.MAX_FRAME_BYTES  # with a server key or without: a larger frame drops the connection
        link.identity = f"h-{uuid.uuid4().hex[:12]}".encode()
        public = None
        if self.config.client_cert is not None and self.config.server_key is not None:
            public, secret = load_secret_cert(self.config.client_cert)
            link.curve_publickey, link.curve_secretkey = public, secret
            link.curve_serverkey = load_public_key(self.config.server_key)
        self.watch = HandshakeWatch({self.config.address: link}, public_key=public, keys_dir="workers/")
        link.connect(self.config.address)
        self.link = link
        self.joined = False
        self.next_hello = 0.0

    def _close_link(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        if self.link is not None:
            self.link.close(linger=0)
            self.link = None

    def _rejoin(self, why: str) -> None:
        logger.warning("%s; joining it again", why)
        self._close_link()
        self.held.clear()  # the head takes those jobs back, or has forgotten them
        self.waiting_since = time.monotonic()
        self._connect()

    def _to_head(self, frames: list[Any], *, copy: bool = True) -> bool:
        """Send to the head; a link that cannot take it is dropped and joined again."""
        assert self.link is not None
        try:
            self.link.send_multipart(frames, zmq.NOBLOCK, copy=copy)
            return True
        except zmq.Again:
            if self.joined:
                self._rejoin(f"lost the connection to the head at {self.config.address}")
            return False

    def _keep_link(self, now: float) -> None:
        if self.joined:
            if now - self.last_head > self._head_timeout_s():
                self._rejoin(f"the head at {self.config.address} sent nothing for {now - self.last_head:.1f} s")
            elif now >= self.next_beat:
                self.next_beat = now + HEARTBEAT_INTERVAL_MS / 1000
                self._to_head([wire.HEARTBEAT])
            return
        if now >= self.next_hello:
            self.next_hello = now + _HELLO_INTERVAL_S
            hello = {
                "link": wire.LINK_VERSION,
                "version": __version__,
                "hostname": self.hostname,
                "model_sha256": self.model_sha256,
                "workers": self.config.workers.num_worker,
                "model_name": self.config.model_name,
            }
            self._to_head([wire.HELLO, p.dumps(hello)])
        if now < self.next_notice or self.watch is None:
            return
        # A refused key is told at once; silence only after a while (the head may be starting).
        waited = now - self.waiting_since > _WAITING_NOTICE_S
        error = self.watch.error(certain_only=not waited)
        if error is not None or waited:
            self.next_notice = now + _WAITING_NOTICE_S
            if error is not None:
                logger.error("cannot join the head: %s", error)
            else:
                logger.warning(
                    "no answer from the head at %s for %.0f s: is it running with --worker-port %d, and reachable?",
                    self.config.address,
                    now - self.waiting_since,
                    self.config.worker_port,
                )

    def _head_timeout_s(self) -> float:
        config = self.server_config
        return (config.workers.heartbeat_timeout_ms if config is not None else 10_000) / 1000

    def _poll(self, timeout_ms: int) -> None:
        assert self.link is not None
        poller = zmq.Poller()
        for sock in (self.link, self.jobs, self.credits, self.results):
            poller.register(sock, zmq.POLLIN)
        if self.watch is not None:
            for monitor in self.watch.monitors:
                poller.register(monitor, zmq.POLLIN)
        events = dict(poller.poll(timeout_ms))
        if self.watch is not None and any(m in events for m in self.watch.monitors):
            self.watch.drain()
        # Results before credits: a job's result must reach the head before its credit.
        for sock, handle in (
            (self.link, self._on_head),
            (self.jobs, self._on_ready),
            (self.results, self._on_result),
            (self.credits, self._on_credit),
        ):
            if sock in events:
                drain(sock, functools.partial(self._handle, handle), copy=False, seconds=0.05)

    def _handle(self, handle: Callable[[list[zmq.Frame]], None], frames: list[zmq.Frame]) -> None:
        try:
            handle(frames)
        except (p.ProtocolError, KeyError, TypeError, ValueError, IndexError) as exc:
            self._refusals.log("dropped a malformed message: %s", exc)

    # -- what the head sends ---------------------------------------------------------------

    def _on_head(self, frames: list[zmq.Frame]) -> None:
        try:
            message = schema.from_head(frames)
        except schema.LinkError as exc:
            if exc.kind == wire.WELCOME:  # the head's options cannot be read: this host cannot run for it
                self._refuse_head(str(exc))
                return
            raise
        self.last_head = time.monotonic()
        if isinstance(message, schema.JobFor):
            worker, job_id = message.worker, message.job_id
            self.held[job_id] = _Held(worker)
            try:
                self.jobs.send_multipart([worker, wire.JOB, *message.frames], zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:  # that worker is gone: the head hears so, and runs the job elsewhere
                self.held.pop(job_id, None)
                self._to_head([wire.GONE, worker, b"it is not running on this host"])
        elif isinstance(message, schema.Heartbeat):
            pass
        elif isinstance(message, bodies.Welcome):
            self._on_welcome(message)
        elif isinstance(message, bodies.Refused):
            error = bodies.printable(message.error, 1000)
            logger.error("the head at %s refused this worker: %s", self.config.address, error)
            self.exit_code = 2
            self.should_exit.set()
        elif isinstance(message, schema.Forget):
            self._kill(message.worker, message.reason)
        elif isinstance(message, schema.Bye) and self.joined:
            self._rejoin(f"the head at {self.config.address} stopped, or forgot this host")

    def _refuse_head(self, why: str) -> None:
        logger.error("refused the WELCOME of the head at %s: %s", self.config.address, why)
        self.exit_code = 2
        self.should_exit.set()

    def _on_welcome(self, welcome: bodies.Welcome) -> None:
        try:
            config = self.config.server_config(welcome)
        except (ConfigError, TypeError, ValueError) as exc:
            self._refuse_head(f"cannot run its model options: {exc}")
            return
        self.joined = True
        self.last_head = time.monotonic()
        logger.info("joined the head at %s", self.config.address)
        previous = self.welcome_options
        if previous is not None and (welcome.model, welcome.model_class) != (previous.model, previous.model_class):
            logger.warning("the head now serves other model options; restarting the workers")
            self._stop_workers()
            self.children.clear()
            self.ready.clear()
        self.welcome_options = welcome
        self.server_config = config
        if not self.children:
            self._start_worker(0)
        for identity, info in self.ready.items():
            self._to_head([wire.READY, identity, info])

    def _kill(self, identity: bytes, reason: str) -> None:
        for index, process in self.children.workers().items():
            if _identity(index, process) == identity and process.is_alive():
                logger.error("the head forgot worker %d (pid %s): %s; killing it", index, process.pid, reason)
                process.kill()

    # -- what the workers send -------------------------------------------------------------

    def _on_ready(self, frames: list[zmq.Frame]) -> None:
        identity, kind = frames[0].bytes, frames[1].bytes
        if kind != wire.READY or len(frames) != 3:
            raise p.ProtocolError(f"unexpected message {kind[:16]!r} from worker {identity!r}")
        self.ready[identity] = schema.declared_ready(frames[2].bytes)  # the head takes only declared model fields
        if self.joined:
            self._to_head([wire.READY, identity, self.ready[identity]])

    def _on_result(self, frames: list[zmq.Frame]) -> None:
        kind, job_id = frames[0].bytes, frames[1].bytes
        held = self.held.get(job_id)
        if held is None or not self.joined:
            return  # a job of an earlier connection: that head has taken it back
        if not self._to_head([kind, held.worker, *frames[1:]], copy=False):
            return
        held.result_sent = True
        if held.done is not None:
            self._send_done(job_id, held.done)

    def _on_credit(self, frames: list[zmq.Frame]) -> None:
        message = schema.local_credit(frames)
        if isinstance(message, schema.Heartbeat):
            if self.joined:
                self._to_head([wire.HEARTBEAT, message.worker])
            return
        raw = frames[1].bytes
        job_id = message.job.encode()
        held = self.held.get(job_id)
        if held is None:
            return
        if held.result_sent:
            self._send_done(job_id, raw)
        else:
            held.done = raw  # its result is still on the way here

    def _send_done(self, job_id: bytes, raw: bytes) -> None:
        self.held.pop(job_id, None)
        if self.joined:
            self._to_head([wire.DONE, raw])

    # -- the worker processes ----------------------------------------------------------------

    def _start_worker(self, index: int) -> None:
        assert self.server_config is not None and self.addresses is not None
        args = (self.server_config, index, self.addresses, self.telemetry)
        self.children.start(worker_name(index), run_worker, args, f"bertserve-worker-{index}")

    def _supervise(self, now: float) -> None:
        if self.server_config is None:
            return
        if self.ready and len(self.children) < self.config.workers.num_worker:
            for index in range(self.config.workers.num_worker):  # worker 0 built the graph: the rest load it
                if worker_name(index) not in self.children:
                    self._start_worker(index)
        for name in self.children.due(now):
            self._start_worker(_index(name))
        for name, process in self.children.dead():
            self._worker_died(_index(name), process, now)
        self.children.forgive(now)

    def _worker_died(self, index: int, process: BaseProcess, now: float) -> None:
        identity = _identity(index, process)
        logger.error("worker %d died (exit code %s); restarting it", index, process.exitcode)
        self.ready.pop(identity, None)
        for job_id in [job for job, held in self.held.items() if held.worker == identity]:
            del self.held[job_id]
        if self.joined:
            self._to_head([wire.GONE, identity, f"it died with exit code {process.exitcode}".encode()])
        verdict = self.children.exited(worker_name(index), now)
        if verdict.fate is Fate.GIVE_UP:
            logger.critical(
                "worker %d failed %d times in a row; stopping (see the errors above)", index, verdict.failures
            )
            self.exit_code = 3
            self.should_exit.set()

    # -- stopping ------------------------------------------------------------------------

    def _leave(self) -> None:
        """Ask for nothing new, let the workers finish what they hold, hand back the rest."""
        if not self.joined or self.link is None:
            return
        self._to_head([wire.DRAIN])
        plan = self._stop_plan()
        if self.held and not self.force_exit:
            logger.info(
                "finishing %d job(s) before leaving, for up to %.1f s (Ctrl-C again to hand them back now)",
                len(self.held),
                plan.left(plan.drain_until, time.monotonic()),
            )
        while self.held and self.joined and not self.force_exit and time.monotonic() < plan.drain_until:
            self._poll(50)
        if self.joined and self.link is not None:
            if self.held:
                logger.warning("handing %d unfinished job(s) back to the head", len(self.held))
            self._to_head([wire.BYE])

    def _stop_plan(self) -> StopPlan:
        return self.config.stop_budget.plan(self.began_stopping())

    def _stop_workers(self) -> None:
        """Tell the workers to stop; one still in a model run at its share of the stop budget
        is killed (its jobs went back to the head), and every one by the budget's end."""
        for index, process in self.children.workers().items():
            with contextlib.suppress(zmq.ZMQError):
                self.jobs.send_multipart([_identity(index, process), wire.STOP], zmq.NOBLOCK)
        plan, hurry = self._stop_plan(), (lambda: self.force_exit)
        self.children.join(seconds=plan.left(plan.workers_until, time.monotonic()), hurry=hurry, warn=False)
        self.children.join(seconds=plan.left(plan.end, time.monotonic()), hurry=hurry)

    def _probe_state(self) -> dict[str, Any]:
        alive = time.monotonic() - self.loop_at < 10.0
        return {"alive": alive, "joined": self.joined, "workers_ready": len(self.ready)}


def _identity(index: int, process: BaseProcess) -> bytes:
    """The identity a worker process registers under (see :class:`..worker.worker.Worker`)."""
    return f"w{index}-{process.pid}".encode()


def _index(name: str) -> int:
    index = worker_index(name)
    assert index is not None  # a host's children are its workers
    return index
