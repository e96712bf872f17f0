"""``bertserve worker``: worker processes on another machine, joined to a head over tcp.

A *host* process runs this machine's worker processes exactly as a head runs its local ones
(the same :func:`.worker.run_worker`, on ipc sockets the host binds) and relays between them
and the head over one DEALER connected to the head's ``--worker-port`` (:mod:`.link`, which
draws the messages):

- It joins with HELLO, naming the sha256 of its model files; the head answers with the
  model options every worker runs (WELCOME), or says why not (REFUSED: the host exits, code 2).
  The workers start once the head has answered, worker 0 first (it builds the graph cache).
- Jobs go to the worker the head chose; results, credits and heartbeats go back, each result
  before the credit of its job (the worker sends them on two sockets, so a credit that
  overtakes its result waits here).
- Heartbeats both ways: a head silent for its ``heartbeat_timeout_ms``, a send the link cannot
  take, or a BYE from the head (it stopped, or does not know this host) makes the host drop
  the connection and join again, for as long as it runs; its workers keep running meanwhile
  and register again.
- A worker that dies is reported (GONE), so the head runs its jobs elsewhere at once, and is
  restarted with the head's backoff rules; one the head forgot (FORGET: it stopped
  answering) is killed first.
- SIGTERM or Ctrl-C: the host asks the head for nothing new (DRAIN), lets its workers finish
  what they hold for up to 10 s, hands back the rest (BYE), and stops them. A second Ctrl-C
  skips the wait.

``--health-port`` serves ``GET /health`` (200 while the host loop runs) and ``GET /ready`` (200
while joined to a head with a worker ready) for container probes.

What the head says is checked before it is used (:mod:`.link_schema`), since only CURVE tells
a host that its head is the real one: with ``--server-key`` (and ``--client-cert``) the link
is a CURVE client that talks only to the holder of that key's secret; without it, whatever
answers on the head's address is taken for the head, and the host warns at start unless the
head is on loopback. Either way a WELCOME's file names (``vocab_name``, ``config_name``,
``ckpt_name``) must be plain relative names inside the model directory, and a model class is
imported only if this host's own ``--model-class`` names the same one: a head alone never
makes a host import code. A WELCOME that breaks these rules is refused: the host says why and
exits (code 2), as for REFUSED.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import multiprocessing
import os
import platform
import re
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

import zmq
from bertserve.client import __version__
from bertserve.client import protocol as p

from ..config import HEARTBEAT_INTERVAL_MS, ModelConfig, ServerConfig
from ..errors import ConfigError, StartupError
from ..logs import Refusals
from ..security import loopback_only
from . import link_schema as schema
from . import wire
from .lifecycle import DRAIN_SECONDS, JOIN_SECONDS, STABLE_SECONDS, ExitFlags, restart_delay
from .worker import Addresses, run_worker

logger = logging.getLogger("bertserve.host")

_HELLO_INTERVAL_S = 1.0
_WAITING_NOTICE_S = 10.0  # how often "no answer from the head yet" is logged


@dataclass(frozen=True, kw_only=True)
class HostConfig:
    """How ``bertserve worker`` runs: where the head is, and this machine's workers. The
    model options come from the head; the files from ``model_dir`` here."""

    server: str
    worker_port: int
    model_dir: str
    num_worker: int = 1
    tuned_model_dir: str | None = None
    graph_dir: str | None = None
    prefetch_size: int = 1
    cpu: bool = False
    device_map: tuple[int, ...] = ()
    gpu_memory_fraction: float | None = None
    threads_per_worker: int | None = None
    worker_nice: int = 5
    feed: str = "thread"
    model_class: str | None = None  # the only model class this host may import: the head must name the same
    client_cert: str | None = None
    server_key: str | None = None
    health_port: int | None = None
    health_bind: str = "127.0.0.1"
    max_restarts: int = 5

    def __post_init__(self) -> None:
        checks = [
            (bool(self.server.strip()), "server must name the head's host"),
            (1 <= self.worker_port <= 65535, "worker_port must be between 1 and 65535"),
            (self.num_worker >= 1, "num_worker must be at least 1"),
            (self.health_port is None or 1 <= self.health_port <= 65535, "health_port must be between 1 and 65535"),
            ((self.client_cert is None) == (self.server_key is None),
             "CURVE needs both client_cert (this worker's NAME.key_secret) and server_key (the head's public key)"),
            (self.max_restarts >= 1, "max_restarts must be at least 1"),
            (self.model_class is None or re.match(schema.MODEL_CLASS_PATTERN, self.model_class) is not None,
             f"model_class must be written package.module:Name, not {self.model_class!r}"),
        ]  # fmt: skip
        for ok, problem in checks:
            if not ok:
                raise ConfigError(problem)
        object.__setattr__(self, "device_map", tuple(int(d) for d in self.device_map))
        welcome = schema.Welcome(model=schema.WelcomeModel(), model_class=self.model_class, heartbeat_timeout_ms=10_000)
        self.server_config(welcome)  # the worker options, checked now

    @property
    def address(self) -> str:
        host = self.server.strip()
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 address
        return f"tcp://{host}:{self.worker_port}"

    def server_config(self, welcome: schema.Welcome) -> ServerConfig:
        """The configuration this host's workers run: the head's model options, this
        machine's files, devices and process settings. Raises ``ConfigError`` if the head
        names a model class this host was not given, or a file outside its model directory."""
        if welcome.model_class != self.model_class:
            if welcome.model_class is None:
                raise ConfigError(f"the head serves BERT from its model directory, but this worker was started with "
                                  f"--model-class {self.model_class}: leave it out")  # fmt: skip
            given = f"was started with --model-class {self.model_class}" if self.model_class else "was given none"
            raise ConfigError(
                f"the head serves the model class {welcome.model_class}, and this worker {given}: a worker imports "
                f"a model class only if its own command line names it; pass --model-class {welcome.model_class} "
                "if you trust that code"
            )
        options = welcome.model.options()
        for field in ("ckpt_name", "config_name", "vocab_name"):
            for directory in (self.model_dir, self.tuned_model_dir):
                if field in options and directory is not None and not _inside(directory, options[field]):
                    raise ConfigError(f"the head names {field} {options[field]!r}, which is not inside {directory}")
        model = ModelConfig(
            **options, model_dir=self.model_dir, tuned_model_dir=self.tuned_model_dir, graph_dir=self.graph_dir
        )
        return ServerConfig(
            model=model, num_worker=self.num_worker, prefetch_size=self.prefetch_size, cpu=self.cpu,
            device_map=self.device_map, gpu_memory_fraction=self.gpu_memory_fraction,
            threads_per_worker=self.threads_per_worker, worker_nice=self.worker_nice, feed=self.feed,
            model_class=self.model_class, heartbeat_timeout_ms=welcome.heartbeat_timeout_ms,
        )  # fmt: skip


def _inside(directory: str, name: str) -> bool:
    """Whether ``name`` joined to ``directory`` stays inside it (as written: links are not followed)."""
    base = os.path.normpath(os.path.abspath(directory))
    return os.path.normpath(os.path.join(base, name)).startswith(base.rstrip(os.sep) + os.sep)


@dataclass
class _Held:
    """A job a worker of this host holds: who, and whether its result went to the head."""

    worker: bytes
    result_sent: bool = False
    done: Any = None  # its DONE, if that came before the result


class WorkerHost(ExitFlags):
    def __init__(self, config: HostConfig, *, log_level: int = logging.INFO) -> None:
        from ..model.checksum import tree_sha256

        self.config = config
        self.log_level = log_level
        super().__init__()
        self.exit_code = 0
        self.hostname = platform.node()
        try:
            self.model_sha256 = tree_sha256(config.model_dir, config.tuned_model_dir)
        except OSError as exc:
            raise StartupError(f"cannot read the model files: {exc}") from None
        self._spawn = multiprocessing.get_context("spawn")
        self.processes: dict[int, BaseProcess] = {}
        self.failures: dict[int, int] = {}
        self.restart_at: dict[int, float] = {}
        self.started_at: dict[int, float] = {}
        self.server_config: ServerConfig | None = None
        self.welcome_options: schema.Welcome | None = None
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
        self.jobs = self._bind(zmq.ROUTER, self.addresses.jobs)
        self.jobs.router_mandatory = True
        self.credits = self._bind(zmq.PULL, self.addresses.credits)
        self.results = self._bind(zmq.PULL, self.addresses.sink)
        health = self._serve_health() if self.config.health_port is not None else None
        try:
            self._connect()
            logger.info("joining the head at %s (%d worker(s), model sha256 %s...)", self.config.address,
                        self.config.num_worker, self.model_sha256[:16])  # fmt: skip
            if self.config.server_key is None and not loopback_only(self.config.server):
                logger.warning(
                    "no --server-key: nothing tells this worker that %s is the real head, and whoever answers there "
                    "gets its workers; run the link under CURVE (the head's --curve-dir) and give --server-key and "
                    "--client-cert", self.config.address,
                )  # fmt: skip
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

    def _bind(self, kind: int, address: str) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.linger = 0
        sock.bind(address)
        return sock

    # -- the link to the head ---------------------------------------------------------------

    def _connect(self) -> None:
        """A fresh DEALER to the head, under a new routing id: nothing queued for the old
        connection is delivered to the head, and the head sees a new host."""
        from bertserve.client.security import HandshakeWatch, load_public_key, load_secret_cert

        link = self.context.socket(zmq.DEALER)
        link.linger = 0
        link.immediate = True  # a send with no connection fails at once rather than queueing
        link.sndhwm = 10_000
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
                "link": wire.LINK_VERSION, "version": __version__, "hostname": self.hostname,
                "model_sha256": self.model_sha256, "workers": self.config.num_worker,
            }  # fmt: skip
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
                    self.config.address, now - self.waiting_since, self.config.worker_port,
                )  # fmt: skip

    def _head_timeout_s(self) -> float:
        config = self.server_config
        return (config.heartbeat_timeout_ms if config is not None else 10_000) / 1000

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
            (self.link, self._on_head), (self.jobs, self._on_ready), (self.results, self._on_result),
            (self.credits, self._on_credit),
        ):  # fmt: skip
            if sock in events:
                self._drain(sock, handle)

    def _drain(self, sock: zmq.Socket, handle: Any) -> None:
        until = time.monotonic() + 0.05
        while time.monotonic() < until and not sock.closed:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
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
        elif isinstance(message, schema.Welcome):
            self._on_welcome(message)
        elif isinstance(message, schema.Refused):
            error = schema.printable(message.error, 1000)
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

    def _on_welcome(self, welcome: schema.Welcome) -> None:
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
            for state in (self.processes, self.ready, self.restart_at, self.failures):
                state.clear()
        self.welcome_options = welcome
        self.server_config = config
        if not self.processes:
            self._start_worker(0)
        for identity, info in self.ready.items():
            self._to_head([wire.READY, identity, info])

    def _kill(self, identity: bytes, reason: str) -> None:
        for index, process in self.processes.items():
            if _identity(index, process) == identity and process.is_alive():
                logger.error("the head forgot worker %d (pid %s): %s; killing it", index, process.pid, reason)
                process.kill()

    # -- what the workers send -------------------------------------------------------------

    def _on_ready(self, frames: list[zmq.Frame]) -> None:
        identity, kind = frames[0].bytes, frames[1].bytes
        if kind != wire.READY or len(frames) != 3:
            raise p.ProtocolError(f"unexpected message {kind[:16]!r} from worker {identity!r}")
        self.ready[identity] = frames[2].bytes
        if self.joined:
            self._to_head([wire.READY, identity, frames[2].bytes])

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
        args = (self.server_config, index, self.addresses, self.log_level)
        process = self._spawn.Process(target=run_worker, args=args, name=f"bertserve-worker-{index}", daemon=True)
        process.start()
        self.processes[index] = process
        self.started_at[index] = time.monotonic()

    def _supervise(self, now: float) -> None:
        if self.server_config is None:
            return
        if self.ready and len(self.processes) < self.config.num_worker:
            for index in range(self.config.num_worker):  # worker 0 built the graph: the rest load it
                if index not in self.processes:
                    self._start_worker(index)
        for index, process in list(self.processes.items()):
            if index in self.restart_at:
                if now >= self.restart_at[index]:
                    del self.restart_at[index]
                    self._start_worker(index)
            elif not process.is_alive():
                self._worker_died(index, process, now)
        for index, started in list(self.started_at.items()):
            if now - started > STABLE_SECONDS:
                self.failures.pop(index, None)

    def _worker_died(self, index: int, process: BaseProcess, now: float) -> None:
        identity = _identity(index, process)
        logger.error("worker %d died (exit code %s); restarting it", index, process.exitcode)
        self.ready.pop(identity, None)
        for job_id in [job for job, held in self.held.items() if held.worker == identity]:
            del self.held[job_id]
        if self.joined:
            self._to_head([wire.GONE, identity, f"it died with exit code {process.exitcode}".encode()])
        failures = self.failures[index] = self.failures.get(index, 0) + 1
        if failures > self.config.max_restarts:
            logger.critical("worker %d failed %d times in a row; stopping (see the errors above)", index, failures)
            self.exit_code = 3
            self.should_exit.set()
            return
        self.restart_at[index] = now + restart_delay(failures)

    # -- stopping ------------------------------------------------------------------------

    def _leave(self) -> None:
        """Ask for nothing new, let the workers finish what they hold, hand back the rest."""
        if not self.joined or self.link is None:
            return
        self._to_head([wire.DRAIN])
        if self.held and not self.force_exit:
            logger.info("finishing %d job(s) before leaving (Ctrl-C again to hand them back now)", len(self.held))
        deadline = time.monotonic() + DRAIN_SECONDS
        while self.held and self.joined and not self.force_exit and time.monotonic() < deadline:
            self._poll(50)
        if self.joined and self.link is not None:
            if self.held:
                logger.warning("handing %d unfinished job(s) back to the head", len(self.held))
            self._to_head([wire.BYE])

    def _stop_workers(self) -> None:
        for index, process in self.processes.items():
            with contextlib.suppress(zmq.ZMQError):
                self.jobs.send_multipart([_identity(index, process), wire.STOP], zmq.NOBLOCK)
        deadline = time.monotonic() + JOIN_SECONDS
        for process in self.processes.values():
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes.values():
            if process.is_alive():
                logger.warning("%s did not stop in time; killing it", process.name)
                process.kill()
                process.join(5)

    # -- probes --------------------------------------------------------------------------

    def _serve_health(self) -> http.server.ThreadingHTTPServer:
        host = self

        class Probe(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                alive = time.monotonic() - host.loop_at < 10.0
                state = {"alive": alive, "joined": host.joined, "workers_ready": len(host.ready)}
                if self.path.split("?")[0] == "/health":
                    ok = alive
                elif self.path.split("?")[0] == "/ready":
                    ok = alive and host.joined and bool(host.ready)
                else:
                    self.send_error(404)
                    return
                body = json.dumps(state).encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # probes every few seconds would drown the log

        assert self.config.health_port is not None
        try:
            server = http.server.ThreadingHTTPServer((self.config.health_bind, self.config.health_port), Probe)
        except OSError as exc:
            where = f"{self.config.health_bind}:{self.config.health_port}"
            raise StartupError(f"cannot serve health probes on {where}: {exc.strerror}") from None
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
        return server


def _identity(index: int, process: BaseProcess) -> bytes:
    """The identity a worker process registers under (see :class:`.worker.Worker`)."""
    return f"w{index}-{process.pid}".encode()
