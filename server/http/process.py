"""The HTTP process: uvicorn serving :mod:`.app`, started and supervised by ``bertserve start``."""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from ..config.server import ServerConfig
from ..config.stopping import FRONT_END_STOP_SIGNAL
from ..config.telemetry import Telemetry
from .gateway import Gateway, GatewayKeys
from .principals import Principals, load_principals

if TYPE_CHECKING:
    from .catalog import ModelSettings
    from .settings import Settings

logger = logging.getLogger("bertserve.http")

_GATEWAY_START_S = 30.0
_KEEP_ALIVE_S = 75  # longer than a load balancer's usual 60 s idle timeout, so it never reuses a closed connection


def connect_host(bind: str) -> str:
    """Where a process on this machine reaches a socket bound to ``bind``."""
    host = bind.strip().strip("[]")
    if host in ("", "*", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def run_http(
    config: ServerConfig,
    telemetry: Telemetry,
    keys: GatewayKeys | None,
    principals: Principals | None = None,
    models: list[ServerConfig] | None = None,
) -> None:
    """Entry point of the HTTP process; ``principals`` as the supervisor read them (else read
    here); ``models``: each served model's config, with its version (else ``config``'s one model).
    Each model's name and tokenizer are read here, once; the head says the rest (:mod:`.catalog`)."""
    from ..logs import child_telemetry

    child_telemetry(telemetry, "http")
    uvicorn_logger = logging.getLogger("uvicorn")
    uvicorn_logger.handlers[:] = logging.getLogger("bertserve").handlers
    uvicorn_logger.setLevel(logging.INFO if telemetry.verbose or telemetry.json_logs else logging.WARNING)
    uvicorn_logger.propagate = False

    from .app import create_app

    settings = front_end_settings(config, telemetry, principals, models)
    host = connect_host(config.ports.bind)
    port_out = config.ports.out

    async def gateway() -> Gateway:
        gw = Gateway(host, config.ports.port, port_out, keys=keys)
        await gw.start(_GATEWAY_START_S)
        return gw

    server = _SupervisedServer(
        uvicorn.Config(
            create_app(settings, gateway),
            host=config.http.http_bind or config.ports.bind,
            port=config.ports.http_port or 0,
            log_config=None,
            access_log=telemetry.verbose or telemetry.json_logs,
            lifespan="on",
            timeout_graceful_shutdown=max(1, math.ceil(config.stop_budget.tail)),
            timeout_keep_alive=_KEEP_ALIVE_S,
            server_header=False,
            **_edge_options(config),
        )
    )
    server.run()
    if not server.started:
        raise SystemExit(3)


class _SupervisedServer(uvicorn.Server):
    """uvicorn, stopped by its supervisor (:meth:`..serving.process.children.Children.stop_front_ends`,
    late in the stop: until then a new request gets the head's 503 ``shutdown``). A SIGTERM is
    the supervisor's to act on while it lives: a signal to the whole process group reached this
    process too. Once stopping, uvicorn closes its listeners and idle connections, and sends
    each response it still owes with ``Connection: close``; what is still running after the
    budget's tail is cancelled."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.supervisor = os.getppid()
        if threading.current_thread() is threading.main_thread():
            signal.signal(FRONT_END_STOP_SIGNAL, self._stop)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and os.getppid() == self.supervisor:
            return
        super().handle_exit(sig, frame)

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        self.should_exit = True


def _edge_options(config: ServerConfig) -> dict[str, Any]:
    """uvicorn's options for what a connection may hold (:mod:`.connections`): the h11
    protocol, whose header size is bounded (httptools' is not), with a header deadline and a
    connection cap; and forwarded headers trusted only from the addresses the operator lists
    (uvicorn trusts loopback by default, which would let any local caller name its principal)."""
    from .connections import ConnectionLimits, bounded_protocol  # uvicorn's: in the HTTP process only

    limits = ConnectionLimits(
        max_connections=config.http.max_http_connections,
        header_timeout_s=config.http.http_header_timeout_s,
        discard_timeout_s=config.http.http_body_timeout_s,
    )
    trusted = list(config.http.forwarded_allow_ips)
    return {
        "http": bounded_protocol(limits),
        "h11_max_incomplete_event_size": config.http.max_http_header_bytes,
        "proxy_headers": bool(trusted),
        "forwarded_allow_ips": trusted,
    }


def front_end_settings(
    config: ServerConfig,
    telemetry: Telemetry,
    principals: Principals | None = None,
    models: list[ServerConfig] | None = None,
) -> Settings:
    """What a front end (HTTP, gRPC) knows of the server: ``principals`` as the supervisor read
    them (else read here), ``models`` each served model's config (else ``config``'s one model)."""
    from .settings import Settings

    return Settings(
        models=tuple(model_settings(model) for model in models or [config]),
        principals=principals
        if principals is not None
        else load_principals(config.security.api_key, config.security.api_keys),
        http=config.http,
        limits=config.limits,
        token_id_input=config.serving.token_id_input,
        auto_truncate=config.serving.auto_truncate,
        traced=telemetry.tracing,
    )


def model_settings(model: ServerConfig) -> ModelSettings:
    """What the HTTP API needs of one served model: its names, and the tokenizer its workers
    run (its own vocabulary and max_seq_len)."""
    from ..model.options import resolve_options
    from .catalog import ModelSettings

    _, tokenizer = resolve_options(model.model)
    serving = model.serving  # --model-alias: a server of one model only
    return ModelSettings(serving.name, serving.aliases, tokenizer)
