"""The head's front ends: the HTTP process (``--http-port``) and the gRPC one (``--grpc-port``),
each a child its supervisor starts, waits for until it listens, restarts and stops alike."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...config.server import ServerConfig
from ...errors import StartupError
from .children import Children


@dataclass(frozen=True)
class FrontEnd:
    """One front end a server runs: its child's name, what logs call it, where it listens."""

    name: str  # the child's: "http", "grpc"
    title: str
    bind: str
    port: int


def front_ends(config: ServerConfig) -> list[FrontEnd]:
    """The front ends ``config`` asks for."""
    ports = config.ports
    fronts = []
    if ports.http_port is not None:
        fronts.append(FrontEnd("http", "the HTTP front end", config.http.http_bind or ports.bind, ports.http_port))
    if ports.grpc_port is not None:
        fronts.append(FrontEnd("grpc", "the gRPC front end", config.grpc.grpc_bind or ports.bind, ports.grpc_port))
    return fronts


def run_http(*args: Any) -> None:
    from ...http.process import run_http  # uvicorn and FastAPI: in the HTTP process only

    run_http(*args)


def run_grpc(*args: Any) -> None:
    from ...rpc.process import run_grpc  # gRPC: in the gRPC process only

    run_grpc(*args)


_ENTRIES: dict[str, Callable[..., None]] = {"http": run_http, "grpc": run_grpc}


def start(children: Children, front: FrontEnd, args: tuple[Any, ...]) -> None:
    """Start ``front``'s process. The API keys go to it through multiprocessing's pipe (as
    SHA-256 digests), never its command line."""
    children.start(front.name, _ENTRIES[front.name], args, f"bertserve-{front.name}")


def wait_listening(
    children: Children, fronts: list[FrontEnd], interrupted: Callable[[], bool], poll: Callable[[], None]
) -> None:
    """Until every one of ``fronts`` accepts connections (its gateway has reached the head);
    ``poll`` serves the head meanwhile."""
    from ...http.process import connect_host

    for front in fronts:
        process = children.get(front.name)
        assert process is not None
        while True:
            if interrupted():
                raise StartupError(f"interrupted while {front.title} was starting")
            if not process.is_alive():
                raise StartupError(f"{front.title} could not start (exit code {process.exitcode}); see above")
            try:
                socket.create_connection((connect_host(front.bind), front.port), timeout=0.5).close()
                break
            except OSError:
                poll()
