"""Where the server listens: its address and ports, one a process's. ``port_out`` left out is
``port + 1``; every port given is checked to be a port, and all of them to differ."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Ports:
    """The server's address and ports (their flags' names); once built, ``port_out`` is an int."""

    port: int = 5555  # takes requests
    port_out: int | None = None  # publishes results; None: port + 1
    bind: str = "127.0.0.1"
    http_port: int | None = None  # the HTTP API
    grpc_port: int | None = None  # the gRPC API (TEI's tei.v1)
    metrics_port: int | None = None  # Prometheus' /metrics
    worker_port: int | None = None  # remote workers join on it

    def __post_init__(self) -> None:
        port, given = self.port, self.port_out
        out = port + 1 if given is None else given
        extra = [p for p in (self.http_port, self.grpc_port, self.metrics_port, self.worker_port) if p is not None]
        checks = [
            (1 <= port <= 65535, "port must be between 1 and 65535"),
            (
                1 <= out <= 65535,
                "port_out must be between 1 and 65535"
                if given is not None
                else f"port_out defaults to port + 1 = {out}, past 65535: set port_out",
            ),
            (port != out, "port and port_out must differ"),
            (
                all(1 <= p <= 65535 for p in extra),
                "http_port, grpc_port, metrics_port and worker_port must be between 1 and 65535",
            ),
            (
                len({port, out, *extra}) == 2 + len(extra),
                "port, port_out, http_port, grpc_port, metrics_port and worker_port must all differ",
            ),
        ]
        for ok, problem in checks:
            if not ok:
                raise ConfigError(problem)
        object.__setattr__(self, "port_out", out)

    @property
    def out(self) -> int:
        """The port results are published on (``port_out``, resolved)."""
        assert self.port_out is not None  # __post_init__ fills it in
        return self.port_out
