"""Where the server listens: its address and ports, one a process's. ``port_out`` left out is
``port + 1``; every port given is checked to be a port, and all of them to differ."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Ports:
    """The server's ports, resolved: ``out`` always an int."""

    port: int  # takes requests
    out: int  # publishes results
    http: int | None  # the HTTP API
    metrics: int | None  # Prometheus' /metrics
    worker: int | None  # remote workers join on it

    @classmethod
    def resolve(
        cls,
        *,
        port: int,
        port_out: int | None,
        http_port: int | None,
        metrics_port: int | None,
        worker_port: int | None,
    ) -> Ports:
        """The ports the flags give, ``port_out`` following ``port``; raises :class:`ConfigError`."""
        out = port + 1 if port_out is None else port_out
        extra = [p for p in (http_port, metrics_port, worker_port) if p is not None]
        checks = [
            (1 <= port <= 65535, "port must be between 1 and 65535"),
            (
                1 <= out <= 65535,
                "port_out must be between 1 and 65535"
                if port_out is not None
                else f"port_out defaults to port + 1 = {out}, past 65535: set port_out",
            ),
            (port != out, "port and port_out must differ"),
            (
                all(1 <= p <= 65535 for p in extra),
                "http_port, metrics_port and worker_port must be between 1 and 65535",
            ),
            (
                len({port, out, *extra}) == 2 + len(extra),
                "port, port_out, http_port, metrics_port and worker_port must all differ",
            ),
        ]
        for ok, problem in checks:
            if not ok:
                raise ConfigError(problem)
        return cls(port=port, out=out, http=http_port, metrics=metrics_port, worker=worker_port)
