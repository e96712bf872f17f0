"""``BertServer``: starts the sink and the workers, runs the ventilator, keeps them alive,
shuts down cleanly.

Signal handlers only set flags; the main loop polls them. A worker that dies is restarted
and its jobs handed to another; one that stops answering (no heartbeat, or a job past
``job_timeout_ms``) is killed and replaced. A sink that dies is restarted and the requests
it held get error replies. Restarts of a process that keeps failing back off, and after
``max_restarts`` failures in a row the server stops with a message saying which process
failed. Shutdown runs in stages within the stop budget (:mod:`.shutdown`): refuse what is
new, drain what is in flight, fail what is left with an error reply, stop the workers (one
still in a model run is killed), the sink and the HTTP front end; a process that does not stop
in time is killed, and a second Ctrl-C stops everything at once.
Every port is checked before any process starts, and a start that fails says why, once.
Remote workers (``--worker-port``) are not this process's to start or stop: their hosts keep
them alive (:mod:`..remote`) and join again when a head comes back. Several models are
served side by side (:class:`.model_processes.SupervisedModel`), each with its own workers,
versions and swap (:mod:`..versions.swap`); the worker indices run on across them
(:class:`.model_processes.LocalWorkers`, which the swap sees as
:class:`..versions.interfaces.WorkerProcesses`). The processes are
:class:`.children.Children`, restarted by :mod:`.restarts`' rule.
"""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from ... import metrics, tracing
from ...config.server import ServerConfig
from ...config.telemetry import Telemetry
from ...errors import StartupError
from ...model.prompts import Prompts
from ..head.models import HeadModel, Models
from ..head.ventilator import Ventilator
from ..policy.scheduler import Scheduler
from ..protocol.sockets import request_socket
from ..protocol.wire import Addresses
from ..sink.sink import run_sink
from ..versions.book import VersionsBook
from ..versions.swap import VersionSwap, store_of
from . import front_ends as front_end, preflight
from .children import Children, worker_index, worker_name
from .front_ends import front_ends
from .lifecycle import ExitFlags
from .model_processes import LocalWorkers, ModelProcesses, SupervisedModel
from .restarts import Exit, Fate
from .shutdown import shut_down

if TYPE_CHECKING:
    from ...model.prepare import Preparation

logger = logging.getLogger("bertserve.server")

_RESUBSCRIBE_S = 1.0  # a restarted sink lets clients subscribe again before it publishes


class BertServer(ExitFlags):
    def __init__(self, config: ServerConfig, *, telemetry: Telemetry | None = None) -> None:
        self.config = config  # the server's options; each model's own are its HeadModel's
        self.telemetry = telemetry or Telemetry()
        super().__init__()
        self.children = Children(config.workers.max_restarts, logger)  # the sink, the HTTP front end, the workers
        self.workers = LocalWorkers(self.children, self.telemetry)  # the config (model and version) each runs
        self.models: dict[str, SupervisedModel] = {}  # each served model, its versions and swap
        self.default = ""  # the model a request that names none gets
        self.gateway_keys: Any = None  # the HTTP front end's CURVE keys, made at start
        self.principals: Any = None  # who may call the HTTP API (http.principals.Principals), read at start
        self.gave_up: str | None = None
        self.serving = False  # it got ready; a start that fails stops without a word of its own

    @property
    def versions(self) -> VersionsBook:
        """The default model's versions."""
        return self.models[self.default].book

    @property
    def served(self) -> ServerConfig:
        """The default model's options, in the version's directory chosen at start: what the sink, the
        HTTP front end and the ventilator are given (the server's options are every model's)."""
        return self.models[self.default].config

    # -- running -------------------------------------------------------------------------

    def run(self, on_ready: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Serve until told to stop (a signal, ``TERMINATE``, or ``should_exit``)."""
        if front_ends(self.config):
            self._load_principals()
        self._choose_models()
        if self.telemetry.traces_endpoint is not None:  # before anything that must be closed
            tracing.setup(self.telemetry.traces_endpoint, "head")
        context = zmq.Context()
        ipc_dir = tempfile.mkdtemp(prefix="bertserve-")
        addresses = self.workers.addresses = Addresses(
            f"ipc://{ipc_dir}/jobs", f"ipc://{ipc_dir}/credits", f"ipc://{ipc_dir}/sink"
        )
        frontend = request_socket(context, self.config.message_limit)
        ventilator: Ventilator | None = None
        authenticator = None
        try:
            authenticator, keys = self._secure(context, frontend)
            preflight.warn_if_http_exposed(self.config)
            preflight.check_ports(frontend, self.config)
            if self.config.ports.metrics_port is not None:
                preflight.serve_metrics(self.config)
            self._start_sink(addresses)
            for front in front_ends(self.config):
                self._start_front_end(front.name)
            ventilator = self._ventilator(context, frontend, addresses, keys)
            self._start(ventilator, on_ready)
            self._serve(ventilator, addresses)
        finally:
            for model in self.models.values():
                if model.swap is not None:
                    model.swap.close()
            shut_down(ventilator, self.children, self, self.config.stop_budget, serving=self.serving)
            frontend.close()
            if ventilator is not None:
                ventilator.close()
            if authenticator is not None:
                authenticator.stop()
            context.term()
            shutil.rmtree(ipc_dir, ignore_errors=True)
            tracing.shutdown()
        if self.gave_up is not None:
            raise StartupError(f"the server stopped: {self.gave_up} (see the errors above)")

    def _choose_models(self) -> None:
        """Each served model's version chosen and checked (preflight), with its queue."""
        self.default = self.config.default_name
        for index, served in enumerate(self.config.model_configs()):
            book = VersionsBook()
            book.model = served.serving.name
            if served.model.model_url is not None:  # synced by the command line: when it last was, from the cache
                store = store_of(served)
                book.source = store.url.url
                book.record_sync({**store.status(), "last_success": store.last_sync})
            chosen, follow_latest = preflight.choose_version(served, book)
            config = chosen.config
            info, sha256 = preflight.check_model(config, book)
            counter = book.count_tokens if book.tokenizer is not None else None
            prefix = f"m{index}." if index else ""  # job ids of [A-Za-z0-9._:-]
            queue = Scheduler(
                config.batching, config.limits, counter, job_prefix=prefix, pads=bool(info.get("pads", True))
            )
            prompts = Prompts(info.get("prompts", {}), info.get("default_prompt_name"), tuple(info.get("adapters", ())))
            name = served.serving.name
            head = HeadModel(name, config, queue, prompts, sha256, versions_view=book, version=chosen.version)
            self.models[name] = SupervisedModel(head, book, follow_latest, info)

    def _secure(self, context: zmq.Context, frontend: zmq.Socket) -> tuple[Any, dict[str, Any]]:
        """Under CURVE, the authenticator started and the request socket a CURVE server: the
        authenticator, and the keys the ventilator is given; else a warning if the server
        listens past loopback (no authenticator, no keys)."""
        if self.config.security.curve_dir is None:
            preflight.warn_if_exposed(self.config)
            return None, {}
        from ...security import make_curve_server, start_authenticator

        keys = preflight.curve_keys(self.config)
        gateway_public = None
        if front_ends(self.config):
            from ...http.gateway import GatewayKeys

            gateway_public, secret = zmq.curve_keypair()
            self.gateway_keys = GatewayKeys(keys.public, gateway_public, secret)
        authenticator = start_authenticator(context, keys, self._extra_client_keys())
        make_curve_server(frontend, keys)
        return authenticator, {"curve_admins": keys.admins, "gateway_key": gateway_public, "curve_keys": keys}

    def _start(self, ventilator: Ventilator, on_ready: Callable[[dict[str, Any]], None] | None) -> None:
        """Every model's workers started, its swap made and the HTTP front end waited for;
        then ``on_ready`` told what CONFIG says."""
        metrics.MODEL_VERSION.set(self.models[self.default].head.version or 0)
        preparing = self.workers.prepare_for(next(iter(self.models.values())))
        try:  # the next model's graph is built while this one's workers load: two processes at once
            for model, following in zip(self.models.values(), (*tuple(self.models.values())[1:], None), strict=True):
                self._wait_prepared(ventilator, model, preparing)
                preparing = self.workers.prepare_for(following)
                self._start_workers(ventilator, model)
        finally:
            if preparing is not None:
                preparing.stop()  # a model before it could not start
        self._start_swaps(ventilator)
        fronts = [front for front in front_ends(self.config) if front.name in self.children]
        front_end.wait_listening(self.children, fronts, self.should_exit.is_set, lambda: ventilator.poll_once(100))
        ventilator.update_gauges()
        self.serving = True
        if on_ready is not None:
            info = ventilator.describe()
            default = self.models[self.default]
            # With no local worker, what no worker has reported yet comes from the options.
            on_ready({**info, **{k: v for k, v in default.info.items() if info.get(k) is None}})

    def _start_swaps(self, ventilator: Ventilator) -> None:
        for model in self.models.values():
            if model.book.repository and self.config.ports.worker_port is None:
                model.swap = VersionSwap(
                    model.release,
                    pool=ventilator.pool(model.head),
                    processes=ModelProcesses(self.workers, model.name),
                    book=model.book,
                    follow_latest=model.follow_latest,
                )
            elif model.book.repository and model.config.serving.poll_interval_s:
                logger.warning(
                    "--poll-interval-s is ignored with --worker-port: remote workers' model files "
                    "cannot be swapped from here"
                )

    def _ventilator(
        self, context: zmq.Context, frontend: zmq.Socket, addresses: Addresses, keys: dict[str, Any]
    ) -> Ventilator:
        models = Models([model.head for model in self.models.values()], self.default, dict(self.config.routing.tasks))
        try:
            return Ventilator(self.served, context, frontend, addresses, models, **keys)
        except zmq.ZMQError as exc:  # the worker link's port, taken since it was checked
            assert self.config.ports.worker_port is not None
            raise preflight.cannot_listen(
                self.config.ports.bind, self.config.ports.worker_port, "--worker-port", exc
            ) from None

    def _extra_client_keys(self) -> frozenset[bytes]:
        return frozenset([self.gateway_keys.public]) if self.gateway_keys is not None else frozenset()

    def _start_sink(self, addresses: Addresses, grace_s: float = 0.0) -> None:
        version = self.models[self.default].head.version  # the version served now, after a swap too
        args = (self.served, addresses.sink, self.telemetry, grace_s, self._extra_client_keys(), version)
        self.children.start("sink", run_sink, args, "bertserve-sink")

    def _load_principals(self) -> None:
        """Read the API keys once, at start; a restarted front end gets the same."""
        from ...http.principals import load_principals

        self.principals = load_principals(self.config.security.api_key, self.config.security.api_keys)

    def _start_front_end(self, name: str) -> None:
        front = next(front for front in front_ends(self.config) if front.name == name)
        models = [model.config for model in self.models.values()]
        args = (self.served, self.telemetry, self.gateway_keys, self.principals, models)
        front_end.start(self.children, front, args)

    def _wait_prepared(self, ventilator: Ventilator, model: SupervisedModel, preparation: Preparation | None) -> None:
        while preparation is not None and (done := preparation.poll()) is None:
            if self.should_exit.is_set():
                preparation.stop()
                raise StartupError("interrupted while the model's graph was being built")
            ventilator.poll_once(100)
        if preparation is not None and not done:
            which = f"the model {model.name}" if len(self.models) > 1 else "the model"
            raise StartupError(f"{which} cannot be served: {preparation.failure}")

    def _start_workers(self, ventilator: Ventilator, model: SupervisedModel) -> None:
        """``model``'s first worker (once what it loads is made), then the rest."""
        release = model.release
        config = release.config
        if config.serving.num_worker == 0:
            logger.info(
                "no local workers for model %s: serving it once remote workers join on port %d",
                model.name,
                self.config.ports.worker_port,
            )
            return
        first = self.workers.next_index()
        self.workers.start(first, release)
        self._wait_ready(ventilator, first + 1)
        for index in range(first + 1, first + config.serving.num_worker):
            self.workers.start(index, release)
        self._wait_ready(ventilator, first + config.serving.num_worker)

    def _wait_ready(self, ventilator: Ventilator, count: int) -> None:
        while ventilator.local_workers < count:
            if self.should_exit.is_set():
                raise StartupError("interrupted while the workers were loading the model")
            for index, process in self.children.workers().items():
                if not process.is_alive():
                    raise StartupError(f"worker {index} could not start (exit code {process.exitcode}); see above")
            sink = self.children.get("sink")
            if sink is not None and not sink.is_alive():
                raise StartupError(f"the sink could not start (exit code {sink.exitcode}); see above")
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
            if self.should_exit.is_set():
                break  # a child that exits from now on is the shutdown's to join, not a failure
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + 0.25
                self._supervise(ventilator, addresses)

    def _supervise(self, ventilator: Ventilator, addresses: Addresses) -> None:
        now = time.monotonic()
        for index, pid, _ in ventilator.unresponsive_workers():
            logger.error("killing worker %d (pid %d)", index, pid)
            self.children.kill(worker_name(index), pid)
        for name in self.children.due(now):
            self._restart(name, addresses)
        for name, process in self.children.dead():
            self._died(ventilator, name, process.exitcode, now)
        for model in self.models.values():
            if model.swap is not None:
                model.swap.tick(now)
        self.children.forgive(now)

    def _restart(self, name: str, addresses: Addresses) -> None:
        index = worker_index(name)
        if index is not None:
            self.workers.start(index)
        elif name == "sink":
            self._start_sink(addresses, grace_s=_RESUBSCRIBE_S)
        else:
            self._start_front_end(name)

    def _died(self, ventilator: Ventilator, name: str, exitcode: int | None, now: float) -> None:
        index = worker_index(name)
        if index is not None:
            self._worker_died(ventilator, index, exitcode, now)
            return
        if name == "sink":
            logger.error("the sink died (exit code %s); restarting it", exitcode)
            ventilator.sink_lost()
        else:
            title = next((front.title for front in front_ends(self.config) if front.name == name), name)
            logger.error("%s died (exit code %s); restarting it", title, exitcode)
        self._count_failure(name, self.children.exited(name, now))

    def _worker_died(self, ventilator: Ventilator, index: int, exitcode: int | None, now: float) -> None:
        """Restart a worker that died, unless a swap retired it or no longer needs it."""
        release = self.workers.releases[index]
        config, name, version = release.config, worker_name(index), release.version
        swap = (
            self.models[config.serving.served_model_name or ""].swap
            if config.serving.served_model_name in self.models
            else None
        )
        wanted = None if swap is None else functools.partial(swap.keep, index, exitcode)
        verdict = self.children.exited(name, now, wanted=wanted)  # the swap sees the worker's jobs before they go
        if verdict.fate is Fate.RETIRED:
            logger.info("worker %d (model version %s) stopped", index, version)
            ventilator.worker_lost(index, f"worker {index} stopped")
        elif verdict.fate is Fate.LET_GO:
            logger.error("worker %d (model version %s) died (exit code %s)", index, version, exitcode)
            ventilator.worker_lost(index, f"worker {index} died with exit code {exitcode}")
        else:
            logger.error("worker %d died (exit code %s); restarting it", index, exitcode)
            ventilator.worker_lost(index, f"worker {index} died with exit code {exitcode}")
            self._count_failure(name, verdict)
            return
        self.workers.forget(index)

    def _count_failure(self, name: str, verdict: Exit) -> None:
        """A failure of ``name``, restarted after a delay that grows with its failures in a
        row: after ``max_restarts`` of them the server gives up."""
        metrics.RESTARTS.labels(name.split()[0]).inc()
        if verdict.fate is Fate.GIVE_UP:
            logger.critical(
                "%s failed %d times in a row; giving up and stopping the server (see the errors above)",
                name,
                verdict.failures,
            )
            self.gave_up = f"{name} failed {verdict.failures} times in a row"
            self.should_exit.set()
        elif verdict.failures > 1:
            logger.warning(
                "restarting %s in %.1f s (failure %d of at most %d)",
                name,
                verdict.delay,
                verdict.failures,
                self.config.workers.max_restarts,
            )
