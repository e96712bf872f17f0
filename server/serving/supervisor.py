"""``BertServer``: starts the sink and the workers, runs the ventilator, keeps them alive,
shuts down cleanly.

Signal handlers only set flags; the main loop polls them. A worker that dies is restarted
and its jobs handed to another; one that stops answering (no heartbeat, or a job past
``job_timeout_ms``) is killed and replaced. A sink that dies is restarted and the requests
it held get error replies. Restarts of a process that keeps failing back off, and after
``max_restarts`` failures in a row the server stops with a message saying which process
failed. Shutdown runs in stages: stop accepting, drain what is in flight (with a deadline),
fail what is left with an error reply, stop the workers, then the sink; a process that does
not stop in time is killed. Remote workers (``--worker-port``) are not this process's to
start or stop: their hosts keep them alive (:mod:`.remote`) and join again when a head
comes back. With a repository of model versions, :mod:`.swap` rolls the workers to a new
version while serving.
"""

from __future__ import annotations

import logging
import multiprocessing
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import zmq

from .. import metrics
from ..config import ServerConfig
from ..errors import StartupError
from .lifecycle import DRAIN_SECONDS, JOIN_SECONDS, STABLE_SECONDS, ExitFlags, restart_delay
from .scheduler import Scheduler
from .sink import run_sink
from .swap import VersionSwap
from .ventilator import Ventilator
from .worker import Addresses, run_worker

if TYPE_CHECKING:
    from ..model.prepare import Preparation

logger = logging.getLogger("bertserve.server")

_RESUBSCRIBE_S = 1.0  # a restarted sink lets clients subscribe again before it publishes


class BertServer(ExitFlags):
    def __init__(self, config: ServerConfig, *, log_level: int = logging.INFO) -> None:
        self.config = config
        self.log_level = log_level
        super().__init__()
        self._spawn = multiprocessing.get_context("spawn")
        self.workers: dict[int, BaseProcess] = {}
        self.worker_config: dict[int, ServerConfig] = {}  # the config (model version) each worker runs
        self.retiring: set[int] = set()  # workers told to stop for a swap: not restarted
        self.addresses: Addresses | None = None
        self.repository = ""  # the base directory of model versions, if --model-dir is one
        self.follow_latest = True  # --model-version latest: newer versions are swapped in
        self.swap: VersionSwap | None = None
        self.sink: BaseProcess | None = None
        self.http: BaseProcess | None = None
        self.gateway_keys: Any = None  # the HTTP front end's CURVE keys, made at start
        self.principals: Any = None  # who may call the HTTP API (http.principals.Principals), read at start
        self.model_info: dict[str, Any] = {}
        self.model_sha256 = ""  # of the model files, which remote workers must share
        self.refused_versions: list[dict[str, Any]] = []  # each version refused, with why and when
        self.tokenizer: Any = None
        self.gave_up: str | None = None
        self.failures: dict[str, int] = {}  # process name -> failures in a row
        self.restart_at: dict[str, float] = {}  # process name -> when to start it again
        self.started_at: dict[str, float] = {}  # process name -> when it was last started

    # -- running -------------------------------------------------------------------------

    def run(self, on_ready: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Serve until told to stop (a signal, ``TERMINATE``, or ``should_exit``)."""
        if self.config.http_port is not None:
            self._load_principals()
        self._check_model()
        context = zmq.Context()
        ipc_dir = tempfile.mkdtemp(prefix="bertserve-")
        addresses = self.addresses = Addresses(
            f"ipc://{ipc_dir}/jobs", f"ipc://{ipc_dir}/credits", f"ipc://{ipc_dir}/sink"
        )
        frontend = context.socket(zmq.PULL)
        frontend.linger = 0
        frontend.maxmsgsize = self.config.message_limit  # a larger frame is dropped unread
        # Requests one connection may have waiting in this process, read but not yet taken: at most
        # ~64 MiB of them. ZeroMQ bounds this per connection only; the ventilator takes them as they
        # come, and refuses what does not fit --max-queued-bytes.
        frontend.rcvhwm = max(1, min(1000, 64 * 2**20 // self.config.message_limit))
        ventilator: Ventilator | None = None
        authenticator = None
        try:
            admins = None
            gateway_public = None
            curve_keys = None
            if self.config.curve_dir is not None:
                keys = curve_keys = self._curve_keys()
                if self.config.http_port is not None:
                    from ..http.gateway import GatewayKeys

                    gateway_public, secret = zmq.curve_keypair()
                    self.gateway_keys = GatewayKeys(keys.public, gateway_public, secret)
                authenticator = self._start_authenticator(context, keys)
                from ..security import make_curve_server

                make_curve_server(frontend, keys)
                admins = keys.admins
            else:
                self._warn_if_exposed()
            self._warn_if_http_exposed()
            self._bind(frontend, self.config.port)
            assert self.config.port_out is not None  # ServerConfig made it port + 1
            self._check_port_free(context, self.config.port_out)
            if self.config.http_port is not None:
                self._check_tcp_port_free(self.config.http_bind or self.config.bind, self.config.http_port)
            if self.config.metrics_port is not None:
                self._serve_metrics()
            self._start_sink(addresses)
            if self.config.http_port is not None:
                self._start_http()
            scheduler = Scheduler(self.config, self._count_tokens if self.tokenizer is not None else None)
            ventilator = self._ventilator(context, frontend, addresses, scheduler, admins, gateway_public, curve_keys)
            ventilator.refused_versions = self.refused_versions
            metrics.MODEL_VERSION.set(self.config.version_number or 0)
            self._start_workers(ventilator, addresses)
            if self.repository and self.config.worker_port is None:
                self.swap = VersionSwap(self, ventilator, follow_latest=self.follow_latest)
            elif self.repository and self.config.poll_interval_s:
                logger.warning("--poll-interval-s is ignored with --worker-port: remote workers' model files "
                               "cannot be swapped from here")  # fmt: skip
            if self.http is not None:
                self._wait_http(ventilator)
            ventilator.update_gauges()
            if on_ready is not None:
                info = ventilator.describe()
                # With no local worker, what no worker has reported yet comes from the options.
                on_ready({**info, **{k: v for k, v in self.model_info.items() if info.get(k) is None}})
            self._serve(ventilator, addresses)
        finally:
            if self.swap is not None:
                self.swap.close()
            self._shutdown(ventilator)
            frontend.close()
            if ventilator is not None:
                ventilator.close()
            if authenticator is not None:
                authenticator.stop()
            context.term()
            shutil.rmtree(ipc_dir, ignore_errors=True)
        if self.gave_up is not None:
            raise StartupError(f"the server stopped: {self.gave_up} (see the errors above)")

    def _count_tokens(self, texts: list[Any], is_tokenized: bool, chunk: bool) -> Any:
        """Tokens per input, for cutting bulk requests (by the tokenizer of the version served)."""
        return self.tokenizer.count_tokens(texts, is_tokenized=is_tokenized, chunk=chunk)

    def _curve_keys(self) -> Any:
        from ..security import load_curve_dir

        assert self.config.curve_dir is not None
        try:
            keys = load_curve_dir(self.config.curve_dir)
        except (ValueError, OSError) as exc:
            raise StartupError(f"--curve-dir: {exc}") from exc
        if self.config.worker_port is not None and not keys.workers:
            raise StartupError(
                f"--curve-dir {self.config.curve_dir} has no workers/*.key, so no remote worker could join on "
                f"--worker-port: copy each worker's public key (`bertserve keygen DIR --name NAME`) into "
                f"{self.config.curve_dir}/workers/"
            )
        return keys

    def _ventilator(
        self, context: zmq.Context, frontend: zmq.Socket, addresses: Addresses, scheduler: Scheduler,
        admins: frozenset[bytes] | None, gateway_public: bytes | None, curve_keys: Any,
    ) -> Ventilator:  # fmt: skip
        try:
            return Ventilator(
                self.config, context, frontend, addresses, scheduler, curve_admins=admins, gateway_key=gateway_public,
                model_sha256=self.model_sha256, curve_keys=curve_keys,
            )  # fmt: skip
        except zmq.ZMQError as exc:  # the worker link's port
            where = f"{self.config.bind}:{self.config.worker_port}"
            raise StartupError(f"cannot listen for remote workers on {where}: {exc.strerror}") from None

    def _start_authenticator(self, context: zmq.Context, keys: Any) -> Any:
        from ..security import start_authenticator

        return start_authenticator(context, keys, self._extra_client_keys())

    def _extra_client_keys(self) -> frozenset[bytes]:
        return frozenset([self.gateway_keys.public]) if self.gateway_keys is not None else frozenset()

    def _warn_if_exposed(self) -> None:
        from ..security import loopback_only

        if not loopback_only(self.config.bind):
            logger.warning(
                "LISTENING ON %s WITHOUT CURVE: anyone who reaches ports %d and %d can send requests and "
                "subscribe to replies%s%s. Serve with --curve-dir (see `bertserve keygen`) to authenticate "
                "and encrypt.",
                self.config.bind, self.config.port, self.config.port_out,
                ", and stop the server (--allow-terminate true)" if self.config.allow_terminate else "",
                f"; on port {self.config.worker_port} anyone can join as a worker and read every request"
                if self.config.worker_port is not None else "",
            )  # fmt: skip

    def _warn_if_http_exposed(self) -> None:
        from ..security import loopback_only

        http_bind = self.config.http_bind or self.config.bind
        keyless = self.config.api_key is None and self.config.api_keys is None
        if self.config.http_port is not None and keyless and not loopback_only(http_bind):
            logger.warning(
                "SERVING HTTP ON %s:%d WITHOUT AN API KEY: anyone who reaches it can encode. Set --api-keys FILE "
                "or BERTSERVE_API_KEY.", http_bind, self.config.http_port,
            )  # fmt: skip

    def _choose_version(self) -> None:
        """With a model repository, serve the version asked for, or the newest that is whole."""
        import dataclasses

        from ..model.repository import choose, is_repository

        if not is_repository(self.config.model.model_dir):
            return
        base = self.config.model.model_dir
        try:
            version, refused = choose(base, self.config.model_version, self.config.model,
                                      require_manifest=self.config.require_manifest)  # fmt: skip
        except (ValueError, OSError) as exc:
            raise StartupError(str(exc)) from exc
        self.repository = base
        self.follow_latest = str(self.config.model_version) == "latest"
        self.record_refusals(refused)
        logger.info("serving version %d of %s", version.number, base)
        model = self.config.model.replace(model_dir=version.path)
        self.config = dataclasses.replace(self.config, model=model, model_version=str(version.number))

    def record_refusals(self, refused: list[Any]) -> None:
        """Log, count and list each version refused; a version refused again for the same
        reason (or still being written) is not logged again."""
        listed = {entry["version"]: entry for entry in self.refused_versions}
        for refusal in refused:
            number = refusal.version.number
            entry = listed.get(number)
            same = entry is not None and (entry["reason"] == refusal.reason or (entry["settling"] and refusal.settling))
            if not same:
                level = logging.WARNING if refusal.settling else logging.ERROR
                logger.log(level, "refused version %d of %s: %s", number, self.repository, refusal.reason)
                metrics.VERSIONS_REFUSED.inc()
                entry = listed[number] = {"version": number}
            assert entry is not None
            entry.update(reason=refusal.reason, settling=refusal.settling, at=round(time.time(), 3))
        self.refused_versions[:] = sorted(listed.values(), key=lambda entry: -entry["version"])

    def add_worker(self, config: ServerConfig) -> int:
        """Start one more worker, running ``config``'s model version; returns its index."""
        assert self.addresses is not None
        index = max(self.workers, default=-1) + 1
        self._start_worker(index, self.addresses, config)
        return index

    def preparation(self, config: ServerConfig, steps: list[str] | None = None) -> Preparation | None:
        """The steps that make what ``config``'s workers load, if any is missing (``steps``
        when the caller has looked already)."""
        from ..model.prepare import STEP_NAMES, Preparation, missing_steps

        if config.model_class:
            return None  # a model class loads itself
        try:
            steps = missing_steps(config.model) if steps is None else steps
        except (ValueError, TypeError, OSError) as exc:  # the workers will fail on it and say why
            logger.warning("cannot tell whether the model's graph is cached: %s", exc)
            return None
        if not steps:
            return None
        names = " and ".join(STEP_NAMES[step] for step in steps)
        logger.info("building the %s of model %s before a worker loads it", names, config.model.model_dir)
        # A worker's share of the cores: during a swap the serving workers keep theirs.
        return Preparation(config.model, steps, cpu_only=config.cpu, threads=config.worker_threads(),
                           log_level=self.log_level)  # fmt: skip

    def retire_worker(self, index: int) -> None:
        """Tell worker ``index`` to stop once it holds nothing; it is not restarted."""
        self.retiring.add(index)
        if self.swap is not None:
            self.swap.ventilator.stop_worker(index)

    def _check_model(self) -> None:
        """Catch a bad model directory or option here, with its cause, before any process starts."""
        from ..model.options import resolve_options

        self._choose_version()
        try:
            self.model_info, self.tokenizer = resolve_options(self.config.model)
            if self.config.worker_port is not None:
                from ..model.checksum import tree_sha256

                self.model_sha256 = tree_sha256(self.config.model.model_dir, self.config.model.tuned_model_dir)
            if self.config.model_class:
                from ..model.interface import load_model_class

                load_model_class(self.config.model_class)
        except (ValueError, TypeError, OSError, ImportError) as exc:
            raise StartupError(str(exc)) from exc

    def _bind(self, socket: zmq.Socket, port: int) -> None:
        try:
            socket.bind(f"tcp://{self.config.bind}:{port}")
        except zmq.ZMQError as exc:
            raise StartupError(f"cannot listen on {self.config.bind}:{port}: {exc.strerror}") from None

    def _check_port_free(self, context: zmq.Context, port: int) -> None:
        probe = context.socket(zmq.PUB)
        probe.linger = 0
        try:
            self._bind(probe, port)
        finally:
            probe.close()

    def _check_tcp_port_free(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host.strip("[]") if host not in ("*", "") else "0.0.0.0", port))
            except OSError as exc:
                raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}") from None

    def _serve_metrics(self) -> None:
        assert self.config.metrics_port is not None
        try:
            metrics.serve(self.config.metrics_port, self.config.bind)
        except OSError as exc:
            where = f"{self.config.bind}:{self.config.metrics_port}"
            raise StartupError(f"cannot serve metrics on {where}: {exc}") from None

    def _start(self, target: Callable[..., None], args: tuple[Any, ...], name: str) -> BaseProcess:
        process = self._spawn.Process(target=target, args=args, name=name, daemon=True)
        process.start()
        return process

    def _start_sink(self, addresses: Addresses, grace_s: float = 0.0) -> None:
        args = (self.config, addresses.sink, self.log_level, grace_s, self._extra_client_keys())
        self.sink = self._start(run_sink, args, "bertserve-sink")
        self.started_at["sink"] = time.monotonic()

    def _start_worker(self, index: int, addresses: Addresses, config: ServerConfig | None = None) -> None:
        config = self.worker_config[index] = config or self.worker_config.get(index, self.config)
        args = (config, index, addresses, self.log_level)
        self.workers[index] = self._start(run_worker, args, f"bertserve-worker-{index}")
        self.started_at[f"worker {index}"] = time.monotonic()

    def _load_principals(self) -> None:
        """Read the HTTP API's keys once, at start; a restarted HTTP process gets the same."""
        from ..http.principals import load_principals

        self.principals = load_principals(self.config.api_key, self.config.api_keys)

    def _start_http(self) -> None:
        from ..http.process import run_http

        # The keys go to the child through multiprocessing's pipe (as SHA-256 digests), never its command line.
        args = (self.config, self.log_level, self.gateway_keys, self.principals)
        self.http = self._start(run_http, args, "bertserve-http")
        self.started_at["http"] = time.monotonic()

    def _wait_http(self, ventilator: Ventilator) -> None:
        """Until the HTTP process accepts connections (its gateway has reached the ventilator)."""
        from ..http.process import connect_host

        assert self.http is not None and self.config.http_port is not None
        host = connect_host(self.config.http_bind or self.config.bind)
        while True:
            if self.should_exit.is_set():
                raise StartupError("interrupted while the HTTP front end was starting")
            if not self.http.is_alive():
                raise StartupError(f"the HTTP front end could not start (exit code {self.http.exitcode}); see above")
            try:
                socket.create_connection((host, self.config.http_port), timeout=0.5).close()
                return
            except OSError:
                ventilator.poll_once(100)

    def _start_workers(self, ventilator: Ventilator, addresses: Addresses) -> None:
        """What the workers load is made first, in processes of its own (see
        :mod:`..model.prepare`); then worker 0, then the rest."""
        if self.config.num_worker == 0:
            logger.info("no local workers: serving once remote workers join on port %d", self.config.worker_port)
            return
        preparation = self.preparation(self.config)
        while preparation is not None and (done := preparation.poll()) is None:
            if self.should_exit.is_set():
                preparation.stop()
                raise StartupError("interrupted while the model's graph was being built")
            ventilator.poll_once(100)
        if preparation is not None and not done:
            raise StartupError(f"the model cannot be served: {preparation.failure}")
        self._start_worker(0, addresses)
        self._wait_ready(ventilator, 1)
        for index in range(1, self.config.num_worker):
            self._start_worker(index, addresses)
        self._wait_ready(ventilator, self.config.num_worker)

    def _wait_ready(self, ventilator: Ventilator, count: int) -> None:
        while ventilator.registry.local_count < count:
            if self.should_exit.is_set():
                raise StartupError("interrupted while the workers were loading the model")
            for index, process in self.workers.items():
                if not process.is_alive():
                    raise StartupError(f"worker {index} could not start (exit code {process.exitcode}); see above")
            if self.sink is not None and not self.sink.is_alive():
                raise StartupError(f"the sink could not start (exit code {self.sink.exitcode}); see above")
            ventilator.poll_once(100)

    def _serve(self, ventilator: Ventilator, addresses: Addresses) -> None:
        next_check = time.monotonic()
        while not self.should_exit.is_set():
            try:
                ventilator.poll_once(100)
            except zmq.ContextTerminated:
                break
            except Exception:  # a bug in handling one message must not stop the server
                logger.exception("error in the ventilator loop")
            if ventilator.terminate_requested:
                logger.info("a client asked the server to stop")
                self.should_exit.set()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + 0.25
                self._supervise(ventilator, addresses)

    def _supervise(self, ventilator: Ventilator, addresses: Addresses) -> None:
        now = time.monotonic()
        for index, pid, _ in ventilator.unresponsive_workers():
            logger.error("killing worker %d (pid %d)", index, pid)
            process = self.workers.get(index)
            if process is not None and process.pid == pid and process.is_alive():
                process.kill()
        if "sink" in self.restart_at:
            if now >= self.restart_at["sink"]:
                del self.restart_at["sink"]
                self._start_sink(addresses, grace_s=_RESUBSCRIBE_S)
        elif self.sink is not None and not self.sink.is_alive():
            logger.error("the sink died (exit code %s); restarting it", self.sink.exitcode)
            ventilator.sink_lost()
            self._failed("sink", now)
        if "http" in self.restart_at:
            if now >= self.restart_at["http"]:
                del self.restart_at["http"]
                self._start_http()
        elif self.http is not None and not self.http.is_alive():
            logger.error("the HTTP front end died (exit code %s); restarting it", self.http.exitcode)
            self._failed("http", now)
        for index, process in list(self.workers.items()):
            name = f"worker {index}"
            if name in self.restart_at:
                if now >= self.restart_at[name]:
                    del self.restart_at[name]
                    self._start_worker(index, addresses)
            elif not process.is_alive():
                self._worker_died(ventilator, index, process.exitcode, now)
        if self.swap is not None:
            self.swap.tick(now)
        for name, started in list(self.started_at.items()):
            if now - started > STABLE_SECONDS:
                self.failures.pop(name, None)  # up long enough: its next failure counts as the first

    def _worker_died(self, ventilator: Ventilator, index: int, exitcode: int | None, now: float) -> None:
        """Restart a worker that died, unless a swap retired it or no longer needs it."""
        if index in self.retiring:
            logger.info("worker %d (model version %s) stopped", index, self.worker_config[index].version_number)
            ventilator.worker_lost(index, f"worker {index} stopped")
        elif self.swap is not None and not self.swap.keep(index, exitcode):
            logger.error("worker %d (model version %s) died (exit code %s)", index,
                         self.worker_config[index].version_number, exitcode)  # fmt: skip
            ventilator.worker_lost(index, f"worker {index} died with exit code {exitcode}")
        else:
            logger.error("worker %d died (exit code %s); restarting it", index, exitcode)
            ventilator.worker_lost(index, f"worker {index} died with exit code {exitcode}")
            self._failed(f"worker {index}", now)
            return
        self.retiring.discard(index)
        del self.workers[index], self.worker_config[index]
        self.failures.pop(f"worker {index}", None)
        self.started_at.pop(f"worker {index}", None)

    def _failed(self, name: str, now: float) -> None:
        """Count a failure of ``name`` and schedule its restart, backing off; give up after
        ``max_restarts`` failures in a row."""
        failures = self.failures[name] = self.failures.get(name, 0) + 1
        metrics.RESTARTS.labels(name.split()[0]).inc()
        if failures > self.config.max_restarts:
            logger.critical(
                "%s failed %d times in a row; giving up and stopping the server (see the errors above)", name, failures
            )
            self.gave_up = f"{name} failed {failures} times in a row"
            self.should_exit.set()
            return
        delay = restart_delay(failures)
        self.restart_at[name] = now + delay
        if failures > 1:
            logger.warning("restarting %s in %.1f s (failure %d of at most %d)", name, delay, failures,
                           self.config.max_restarts)  # fmt: skip

    def _shutdown(self, ventilator: Ventilator | None) -> None:
        if self.http is not None and self.http.is_alive():
            self.http.terminate()  # uvicorn stops accepting and lets in-flight requests finish
        if ventilator is not None:
            ventilator.accepting = False
            deadline = time.monotonic() + (0 if self.force_exit else DRAIN_SECONDS)
            while not ventilator.idle and time.monotonic() < deadline and not self.force_exit:
                ventilator.poll_once(50)
            ventilator.fail_everything("the server is shutting down")
            ventilator.stop_workers()
            ventilator.stop_sink()
        others = [process for process in (self.http, self.sink) if process is not None]
        self._join([*self.workers.values(), *others])
        logger.info("bertserve stopped")

    def _join(self, processes: list[BaseProcess]) -> None:
        deadline = time.monotonic() + JOIN_SECONDS
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in processes:
            if process.is_alive():
                logger.warning("%s did not stop in time; killing it", process.name)
                process.kill()
                process.join(5)
