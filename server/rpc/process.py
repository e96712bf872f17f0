"""The gRPC process: ``grpc.aio`` serving TEI's ``tei.v1`` services (:mod:`.tei`, :mod:`.tokens`),
gRPC's health service and server reflection, started and supervised by ``bertserve start
--grpc-port``.

It reaches the head as the HTTP process does: one :class:`~..http.gateway.Gateway` (its client
ids marked ``grpc-``, so the head's metrics tell its requests apart), the HTTP API's checks over
it (:class:`~..http.app.Endpoints`). Health follows the head's readiness: the server (``""``),
each TEI service and each served model by its name are SERVING once every model (or that model)
has a worker with it loaded, NOT_SERVING before and from the moment the server begins to stop.

Its supervisor stops it as it stops the HTTP process (:data:`..config.stopping.FRONT_END_STOP_SIGNAL`,
late in the stop): it then refuses new calls, and lets those it holds finish within the stop
budget's tail; a SIGTERM is its supervisor's to act on while that lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Any

import grpc
from bertserve.client.tei import tei_pb2 as pb
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..config.server import ServerConfig
from ..config.stopping import FRONT_END_STOP_SIGNAL
from ..config.telemetry import Telemetry
from ..errors import ConfigError
from ..http.app import Endpoints
from ..http.gateway import Gateway, GatewayError, GatewayKeys
from ..http.principals import Principals
from ..http.process import connect_host, front_end_settings
from ..http.settings import Settings
from ..metrics import GRPC_ID_MARK
from .calls import Guard
from .handlers import tei_handlers
from .tei import Tei
from .tokens import Tokens

logger = logging.getLogger("bertserve.grpc")

_GATEWAY_START_S = 30.0
_HEALTH_EVERY_S = 1.0
_KEEPALIVE_MS = 60_000
_TEI_SERVICES = tuple(service.full_name for service in pb.DESCRIPTOR.services_by_name.values())


def run_grpc(
    config: ServerConfig,
    telemetry: Telemetry,
    keys: GatewayKeys | None,
    principals: Principals | None = None,
    models: list[ServerConfig] | None = None,
) -> None:
    """Entry point of the gRPC process (its arguments as :func:`..http.process.run_http`'s)."""
    from ..logs import child_telemetry

    child_telemetry(telemetry, "grpc")
    settings = front_end_settings(config, telemetry, principals, models)
    try:
        asyncio.run(_serve(config, settings, keys))
    except (GatewayError, ConfigError, OSError) as exc:
        logger.error("the gRPC front end could not start: %s", exc)
        raise SystemExit(3) from None


async def _serve(config: ServerConfig, settings: Settings, keys: GatewayKeys | None) -> None:
    stopping = asyncio.Event()
    supervisor = os.getppid()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(FRONT_END_STOP_SIGNAL, stopping.set)
    # A SIGTERM to the whole process group is the supervisor's to act on; an orphan stops.
    loop.add_signal_handler(signal.SIGTERM, lambda: None if os.getppid() == supervisor else stopping.set())

    api = Endpoints(settings)
    ports = config.ports

    async def gateway() -> Gateway:
        gw = Gateway(connect_host(ports.bind), ports.port, ports.out, keys=keys, mark=GRPC_ID_MARK)
        await gw.start(_GATEWAY_START_S)
        return gw

    await api.open(gateway)
    server, checks = _server(config, api, Guard(settings.principals, config.grpc))
    try:
        await server.start()
        watch = asyncio.ensure_future(_follow_readiness(api, checks, settings, stopping))
        await stopping.wait()
        await checks.enter_graceful_shutdown()  # every service NOT_SERVING, and so it stays
        stopped = asyncio.ensure_future(server.stop(grace=config.stop_budget.tail))  # no new call from here
        await asyncio.sleep(0)
        # The head has sent its failures before this process is told to stop: a call still waiting on
        # it would wait out the grace and be cancelled; it is told the server is shutting down instead.
        await api.close()
        await stopped
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    finally:
        await api.close()


def _server(config: ServerConfig, api: Endpoints, guard: Guard) -> tuple[grpc.aio.Server, Any]:
    """The gRPC server, its services added and its port bound (OSError if it cannot be)."""
    options = config.grpc
    limit = options.message_limit(config.message_limit)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", max(limit, config.limits.max_reply_bytes)),
            ("grpc.max_concurrent_streams", options.max_grpc_streams),
            ("grpc.keepalive_time_ms", _KEEPALIVE_MS),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.so_reuseport", 0),  # a port taken is an error, not shared
        ]
    )
    tei, tokens = Tei(api, guard), Tokens(api, guard)
    server.add_generic_rpc_handlers(
        tei_handlers({"Embed": tei, "Predict": tei, "Rerank": tei, "Info": tokens, "Tokenize": tokens})
    )
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    reflection.enable_server_reflection(
        (*_TEI_SERVICES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    address = f"{_host(options.grpc_bind or config.ports.bind)}:{config.ports.grpc_port}"
    secure = options.tls
    bound = server.add_secure_port(address, _credentials(config)) if secure else server.add_insecure_port(address)
    if not bound:
        raise OSError(f"cannot listen on {address} (--grpc-port): is it taken?")
    return server, checks


def _credentials(config: ServerConfig) -> grpc.ServerCredentials:
    """TLS with the certificate and key given; with a client CA, callers must show a certificate it signed."""
    options = config.grpc
    assert options.grpc_tls_cert is not None and options.grpc_tls_key is not None  # Grpc checks them together
    try:
        pair = (Path(options.grpc_tls_key).read_bytes(), Path(options.grpc_tls_cert).read_bytes())
        client_ca = Path(options.grpc_tls_client_ca).read_bytes() if options.grpc_tls_client_ca else None
    except OSError as exc:
        raise ConfigError(f"cannot read a TLS file of --grpc-tls-*: {exc}") from None
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


async def _follow_readiness(api: Endpoints, checks: Any, settings: Settings, stopping: asyncio.Event) -> None:
    """Each health check's status, as the head says its readiness, asked every second."""
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    while not stopping.is_set():
        try:
            status = await api.gateway.status()
        except GatewayError:
            status = {}
        ready = bool(status.get("ready")) and not status.get("stopping")
        by_model = status.get("models") if isinstance(status.get("models"), dict) else {}
        for name in ("", *_TEI_SERVICES):
            await checks.set(name, serving if ready else not_serving)
        for model in settings.models:
            entry = by_model.get(model.name) if isinstance(by_model, dict) else None
            up = ready or (isinstance(entry, dict) and bool(entry.get("ready")) and not status.get("stopping"))
            for name in model.names:
                await checks.set(name, serving if up else not_serving)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), _HEALTH_EVERY_S)


def _host(bind: str) -> str:
    """``bind`` as a gRPC address's host: an IPv6 address in brackets."""
    return f"[{bind}]" if ":" in bind and not bind.startswith("[") else bind
