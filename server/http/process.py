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

from ..config.served import ServedModel, directory_name
from ..config.server import ServerConfig
from ..config.stopping import FRONT_END_STOP_SIGNAL
from ..config.telemetry import Telemetry
from .bodies import BodyPace
from .gateway import Gateway, GatewayKeys
from .principals import Principals, load_principals

if TYPE_CHECKING:
    from .catalog import ModelSettings

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


def served_names(config: ServerConfig) -> tuple[str, tuple[str, ...]]:
    """The name of ``config``'s model, and its aliases."""
    name = directory_name(config) if config.served_model_name is None else config.served_model_name
    aliases = tuple(alias for alias in dict.fromkeys(config.model_alias) if alias != name)
    return name, aliases


def run_http(
    config: ServerConfig,
    telemetry: Telemetry,
    keys: GatewayKeys | None,
    principals: Principals | None = None,
    models: list[ServedModel] | None = None,
) -> None:
    """Entry point of the HTTP process; ``principals`` as the supervisor read them (else read
    here); ``models``: the models served, each with its config and version (else ``config``'s one).
    Each model's name and tokenizer are read here, once; the head says the rest (:mod:`.catalog`)."""
    from ..logs import child_telemetry

    child_telemetry(telemetry, "http")
    uvicorn_logger = logging.getLogger("uvicorn")
    uvicorn_logger.handlers[:] = logging.getLogger("bertserve").handlers
    uvicorn_logger.setLevel(logging.INFO if telemetry.verbose or telemetry.json_logs else logging.WARNING)
    uvicorn_logger.propagate = False

    from .app import Settings, create_app

    served = models or [ServedModel(served_names(config)[0], config)]
    settings = Settings(
        models=tuple(_model_settings(model) for model in served),
        principals=principals if principals is not None else load_principals(config.api_key, config.api_keys),
        max_body_bytes=config.http_body_limit,
        max_bodies_bytes=config.max_http_body_bytes_total,
        max_inputs=config.request_size_limit,
        request_timeout_s=config.request_timeout_ms / 1000,
        token_id_input=config.token_id_input,
        auto_truncate=config.auto_truncate,
        max_text_chars=config.max_text_chars,
        max_principal_bodies_bytes=config.http_principal_body_limit,
        body_pace=BodyPace(timeout_s=config.http_body_timeout_s, min_rate=config.http_body_min_rate),
        max_headers=config.max_http_headers,
        metrics_principals=config.metrics_principals,
        cors_origins=config.cors_allow_origin,
        max_request_tokens=config.limits.request_tokens,
        max_reply_bytes=config.limits.reply_bytes,
        traced=telemetry.tracing,
    )
    host = connect_host(config.bind)
    port_out = config.port_out
    assert port_out is not None  # ServerConfig fills it in

    async def gateway() -> Gateway:
        gw = Gateway(host, config.port, port_out, keys=keys)
        await gw.start(_GATEWAY_START_S)
        return gw

    server = _SupervisedServer(
        uvicorn.Config(
            create_app(settings, gateway),
            host=config.http_bind or config.bind,
            port=config.http_port or 0,
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
    """uvicorn, stopped by its supervisor (:meth:`..serving.process.children.Children.stop_http`,
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
        max_connections=config.max_http_connections,
        header_timeout_s=config.http_header_timeout_s,
        discard_timeout_s=config.http_body_timeout_s,
    )
    trusted = list(config.forwarded_allow_ips)
    return {
        "http": bounded_protocol(limits),
        "h11_max_incomplete_event_size": config.max_http_header_bytes,
        "proxy_headers": bool(trusted),
        "forwarded_allow_ips": trusted,
    }


def _model_settings(model: ServedModel) -> ModelSettings:
    """What the HTTP API needs of one served model: its names, and the tokenizer its workers
    run (its own vocabulary and max_seq_len)."""
    from ..model.options import resolve_options
    from .catalog import ModelSettings

    _, tokenizer = resolve_options(model.config.model)
    _, aliases = served_names(model.config)  # --model-alias: a server of one model only
    return ModelSettings(model.name, aliases, tokenizer)
