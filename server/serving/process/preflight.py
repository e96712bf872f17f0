"""What the head checks before it starts a process: the model version to serve, the model
and its options, the CURVE keys, the ports, and what it serves openly.

Each check raises :class:`...errors.StartupError` with the cause, so a bad option stops the
start with one clear message instead of a child process failing later. Every port the server
listens on is checked before any process starts; one in use is named with its flag.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

import zmq

from ... import metrics
from ...config.server import ServerConfig
from ...errors import StartupError
from ...security import loopback_only
from ..versions.book import VersionsBook
from ..versions.plan import Release

logger = logging.getLogger("bertserve.server")

# Where a server is reached by `bertserve status` without --host (which is localhost).
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "*", "::1", "[::1]", "::", "[::]")


def choose_version(config: ServerConfig, book: VersionsBook) -> tuple[Release, bool]:
    """With a model repository, the version asked for, or the newest that is whole (the
    refusals on the way go in ``book``), with ``config`` in its directory, and whether newer
    versions are taken (``--model-version latest``). Else ``config`` as it is."""
    from ...model.repository import choose, is_repository

    if not is_repository(config.model.model_dir):
        return Release(config, config.serving.asked_version), True
    base = config.model.model_dir
    try:
        version, refused = choose(
            base,
            config.serving.model_version,
            config.model,
            # a store's versions are synced whole and renamed into place, checked by their manifests
            require_manifest=config.serving.require_manifest or config.model.model_url is not None,
            settle_s=0.0 if config.model.model_url is not None else 2.0,
        )
    except (ValueError, OSError) as exc:
        raise StartupError(str(exc)) from exc
    book.repository = base
    book.record_refusals(refused)
    logger.info("serving version %d of %s", version.number, base)
    follow_latest = str(config.serving.model_version) == "latest"
    return Release(config.in_dir(version.path), version.number), follow_latest


def check_model(config: ServerConfig, book: VersionsBook) -> tuple[dict[str, Any], str]:
    """Catch a bad model directory or option here, with its cause: the model's description
    and the sha256 of its files (which remote workers must share; ``""`` without them). Its
    tokenizer is the one ``book`` serves."""
    from ...model.options import resolve_options
    from ...model.prompts import resolve_prompts

    model_sha256 = ""
    try:
        model_info, tokenizer = resolve_options(config.model)
        prompts = resolve_prompts(config.model.model_dir, config.serving.prompt, config.serving.default_prompt_name)
        model_info.update(prompts.describe())
        book.serve_tokenizer(tokenizer)
        if config.ports.worker_port is not None:
            from ...model.checksum import tree_sha256

            model_sha256 = tree_sha256(config.model.model_dir, config.model.tuned_model_dir)
        if config.serving.model_class:
            from ...model.interface import load_model_class

            load_model_class(config.serving.model_class)
    except (ValueError, TypeError, OSError, ImportError) as exc:
        raise StartupError(str(exc)) from exc
    return model_info, model_sha256


def curve_keys(config: ServerConfig) -> Any:
    from ...security import load_curve_dir

    assert config.security.curve_dir is not None
    try:
        keys = load_curve_dir(config.security.curve_dir)
    except (ValueError, OSError) as exc:
        raise StartupError(f"--curve-dir: {exc}") from exc
    if config.ports.worker_port is not None and not keys.workers:
        raise StartupError(
            f"--curve-dir {config.security.curve_dir} has no workers/*.key, so no remote worker could join on "
            f"--worker-port: copy each worker's public key (`bertserve keygen DIR --name NAME`) into "
            f"{config.security.curve_dir}/workers/"
        )
    return keys


def warn_if_exposed(config: ServerConfig) -> None:
    if not loopback_only(config.ports.bind):
        logger.warning(
            "LISTENING ON %s WITHOUT CURVE: anyone who reaches ports %d and %d can send requests and "
            "subscribe to replies%s%s. Serve with --curve-dir (see `bertserve keygen`) to authenticate "
            "and encrypt.",
            config.ports.bind,
            config.ports.port,
            config.ports.out,
            ", and stop the server (--allow-terminate true)" if config.security.allow_terminate else "",
            f"; on port {config.ports.worker_port} anyone can join as a worker and read every request"
            if config.ports.worker_port is not None
            else "",
        )


def warn_if_http_exposed(config: ServerConfig) -> None:
    keyless = config.security.api_key is None and config.security.api_keys is None
    fronts = [
        ("HTTP", config.http.http_bind or config.ports.bind, config.ports.http_port),
        ("gRPC", config.grpc.grpc_bind or config.ports.bind, config.ports.grpc_port),
    ]
    for name, bind, port in fronts:
        if port is not None and keyless and not loopback_only(bind):
            logger.warning(
                "SERVING %s ON %s:%d WITHOUT AN API KEY: anyone who reaches it can encode. Set --api-keys FILE "
                "or BERTSERVE_API_KEY.",
                name,
                bind,
                port,
            )


def check_ports(frontend: zmq.Socket, config: ServerConfig) -> None:
    """Bind ``frontend`` to the request port, and check that the other ports are free (their
    processes bind them later): the results port, the HTTP and gRPC ports and the workers' port."""
    bind(frontend, config.ports.bind, config.ports.port, "--port")
    assert config.ports.out is not None  # ServerConfig made it port + 1
    # Plain sockets, bound and closed at once: a ZeroMQ probe would take the connections of the
    # peers that keep dialling these ports (a results subscriber, a remote worker host) and let
    # its port go later, on its I/O thread, so the process's own bind could find it still held.
    check_tcp_port_free(config.ports.bind, config.ports.out, "--port-out")
    if config.ports.http_port is not None:
        check_tcp_port_free(config.http.http_bind or config.ports.bind, config.ports.http_port, "--http-port")
    if config.ports.grpc_port is not None:
        check_tcp_port_free(config.grpc.grpc_bind or config.ports.bind, config.ports.grpc_port, "--grpc-port")
    if config.ports.worker_port is not None:
        check_tcp_port_free(config.ports.bind, config.ports.worker_port, "--worker-port")


def cannot_listen(host: str, port: int, flag: str, exc: OSError | zmq.ZMQError) -> StartupError:
    """The error of a port the server cannot listen on, naming its flag; for one in use, how
    to tell whether a bertserve holds it, and how to choose another."""
    reason = exc.strerror or str(exc)
    message = f"cannot listen on {host}:{port} ({flag}): {reason}"
    if exc.errno == errno.EADDRINUSE:
        default = ", by default --port + 1" if flag == "--port-out" else ""
        check = _who_holds(host, port, flag)
        message = (
            f"cannot listen on {host}:{port} ({flag}{default}): the port is in use. {check}"
            f"to start on another port: {flag} PORT"
        )
    return StartupError(message)


def _who_holds(host: str, port: int, flag: str) -> str:
    """How to tell whether a bertserve holds ``port`` as its ``flag``, or nothing if no command can."""
    if flag in ("--http-port", "--metrics-port"):
        path = "/metrics" if flag == "--metrics-port" else "/health"
        return f"To see whether a bertserve already serves there: `curl -s http://{host}:{port}{path}`; "
    if flag not in ("--port", "--port-out"):
        return ""
    where = "" if host in _LOCAL_HOSTS else f" --host {host}"
    requests = port if flag == "--port" else port - 1  # a server's results port is its --port + 1
    return f"To see whether a bertserve already serves there: `bertserve status{where} --port {requests}`; "


def bind(sock: zmq.Socket, host: str, port: int, flag: str = "--port") -> None:
    try:
        sock.bind(f"tcp://{host}:{port}")
    except zmq.ZMQError as exc:
        raise cannot_listen(host, port, flag, exc) from None


def check_tcp_port_free(host: str, port: int, flag: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]") if host not in ("*", "") else "0.0.0.0", port))
        except OSError as exc:
            raise cannot_listen(host, port, flag, exc) from None


def serve_metrics(config: ServerConfig) -> None:
    assert config.ports.metrics_port is not None
    try:
        metrics.serve(config.ports.metrics_port, config.ports.bind)
    except OSError as exc:
        raise cannot_listen(config.ports.bind, config.ports.metrics_port, "--metrics-port", exc) from None
