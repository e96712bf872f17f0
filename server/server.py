"""``BertServer``: starts the sink and the workers, runs the ventilator, shuts down cleanly.

Signal handlers only set flags; the main loop polls them. Shutdown runs in stages: stop
accepting, drain what is in flight (with a deadline), fail what is left with an error
reply, stop the workers, then the sink; a process that does not stop in time is killed.
"""

from __future__ import annotations

import logging
import multiprocessing
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

import zmq

from .config import ServerConfig
from .errors import BertServeError
from .sink import run_sink
from .ventilator import Ventilator
from .worker import Addresses, run_worker

logger = logging.getLogger("bertserve.server")

_DRAIN_SECONDS = 10.0
_JOIN_SECONDS = 10.0
_RESTART_BACKOFF = 1.0


class StartupError(BertServeError):
    """The server cannot start: a port is taken, the model cannot load, a flag is wrong."""


class BertServer:
    def __init__(self, config: ServerConfig, *, log_level: int = logging.INFO) -> None:
        self.config = config
        self.log_level = log_level
        self.should_exit = threading.Event()
        self.force_exit = False
        self._spawn = multiprocessing.get_context("spawn")
        self.workers: dict[int, BaseProcess] = {}
        self.sink: BaseProcess | None = None
        self.model_info: dict[str, Any] = {}
        self.tokenizer: Any = None

    # -- signals -------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle_exit)

    def _handle_exit(self, signum: int, frame: Any) -> None:
        if self.should_exit.is_set() and signum == signal.SIGINT:
            self.force_exit = True
        self.should_exit.set()

    # -- running -------------------------------------------------------------------------

    def run(self, on_ready: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Serve until told to stop (a signal, ``TERMINATE``, or ``should_exit``)."""
        self._check_model()
        context = zmq.Context()
        ipc_dir = tempfile.mkdtemp(prefix="bertserve-")
        addresses = Addresses(f"ipc://{ipc_dir}/jobs", f"ipc://{ipc_dir}/credits", f"ipc://{ipc_dir}/sink")
        frontend = context.socket(zmq.PULL)
        frontend.linger = 0
        ventilator: Ventilator | None = None
        try:
            self._bind(frontend, self.config.port)
            self._check_port_free(context, self.config.port_out)
            self.sink = self._start(run_sink, (self.config, addresses.sink, self.log_level), "bertserve-sink")
            ventilator = Ventilator(self.config, context, frontend, addresses, self.tokenizer)
            self._start_workers(ventilator, addresses)
            if on_ready is not None:
                on_ready(ventilator.describe())
            self._serve(ventilator, addresses)
        finally:
            self._shutdown(ventilator)
            frontend.close()
            if ventilator is not None:
                ventilator.close()
            context.term()
            shutil.rmtree(ipc_dir, ignore_errors=True)

    def _check_model(self) -> None:
        """Catch a bad model directory or option here, with its cause, before any process starts."""
        from .encoder import resolve_options

        try:
            self.model_info, self.tokenizer = resolve_options(self.config.model)
        except (ValueError, TypeError, OSError) as exc:
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

    def _start(self, target: Callable[..., None], args: tuple[Any, ...], name: str) -> BaseProcess:
        process = self._spawn.Process(target=target, args=args, name=name, daemon=True)
        process.start()
        return process

    def _start_worker(self, index: int, addresses: Addresses) -> None:
        args = (self.config, index, addresses, self.log_level)
        self.workers[index] = self._start(run_worker, args, f"bertserve-worker-{index}")

    def _start_workers(self, ventilator: Ventilator, addresses: Addresses) -> None:
        """Worker 0 first (it builds and caches the graph), then the rest load it."""
        self._start_worker(0, addresses)
        self._wait_ready(ventilator, 1)
        for index in range(1, self.config.num_worker):
            self._start_worker(index, addresses)
        self._wait_ready(ventilator, self.config.num_worker)

    def _wait_ready(self, ventilator: Ventilator, count: int) -> None:
        while len(ventilator.workers) < count:
            if self.should_exit.is_set():
                raise StartupError("interrupted while the workers were loading the model")
            for index, process in self.workers.items():
                if not process.is_alive():
                    raise StartupError(f"worker {index} could not start (exit code {process.exitcode}); see above")
            if self.sink is not None and not self.sink.is_alive():
                raise StartupError(f"the sink could not start (exit code {self.sink.exitcode}); see above")
            ventilator.poll_once(100)

    def _serve(self, ventilator: Ventilator, addresses: Addresses) -> None:
        restarts: dict[int, float] = {}
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
                next_check = time.monotonic() + 0.5
                self._supervise(ventilator, addresses, restarts)

    def _supervise(self, ventilator: Ventilator, addresses: Addresses, restarts: dict[int, float]) -> None:
        if self.sink is not None and not self.sink.is_alive():
            logger.error("the sink died (exit code %s); stopping the server", self.sink.exitcode)
            self.should_exit.set()
            return
        for index, process in list(self.workers.items()):
            if process.is_alive():
                continue
            if index not in restarts:
                logger.error("worker %d died (exit code %s); restarting it", index, process.exitcode)
                ventilator.worker_lost(index)
                restarts[index] = time.monotonic() + _RESTART_BACKOFF
            elif time.monotonic() >= restarts[index]:
                del restarts[index]
                self._start_worker(index, addresses)

    def _shutdown(self, ventilator: Ventilator | None) -> None:
        if ventilator is not None:
            ventilator.accepting = False
            deadline = time.monotonic() + (0 if self.force_exit else _DRAIN_SECONDS)
            while not ventilator.idle and time.monotonic() < deadline and not self.force_exit:
                ventilator.poll_once(50)
            ventilator.fail_everything("the server is shutting down")
            ventilator.stop_workers()
            ventilator.sink.send_multipart([b"STOP"])
        self._join(list(self.workers.values()) + ([self.sink] if self.sink is not None else []))
        logger.info("bertserve stopped")

    def _join(self, processes: list[BaseProcess]) -> None:
        deadline = time.monotonic() + _JOIN_SECONDS
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in processes:
            if process.is_alive():
                logger.warning("%s did not stop in time; killing it", process.name)
                process.kill()
                process.join(5)
