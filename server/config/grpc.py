"""The gRPC front end's options (:class:`Grpc`): where it listens, its TLS, and what one message,
one connection, one principal and the whole process may hold at once. Each is a ``bertserve
start`` flag; :mod:`..rpc` enforces them. Nothing here imports gRPC, so the config can use it in
any process."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

GRPC_STREAMS = 100
"""Default most calls open at once on one connection (HTTP/2's concurrent streams)."""
GRPC_PRINCIPAL_CALLS = 200
"""Default most calls one principal (an API key, or without keys a peer address) holds open at
once, on all its connections; one more is refused with RESOURCE_EXHAUSTED."""
GRPC_CALLS = 2000
"""Default most calls open at once in the gRPC process."""
GRPC_IDLE_S = 30.0
"""Default time a stream may wait for its caller's next message before it is ended."""


@dataclass(frozen=True, kw_only=True)
class Grpc:
    """The gRPC front end's options (their flags' names), checked when built."""

    grpc_bind: str | None = None  # None: the server's --bind
    grpc_tls_cert: str | None = None  # PEM certificate chain; with grpc_tls_key, the port speaks TLS only
    grpc_tls_key: str | None = None
    grpc_tls_client_ca: str | None = None  # PEM CAs: a caller must show a certificate they signed
    max_grpc_message_bytes: int | None = None  # None: the request frame limit
    max_grpc_streams: int = GRPC_STREAMS
    max_grpc_calls_per_principal: int = GRPC_PRINCIPAL_CALLS
    max_grpc_calls: int = GRPC_CALLS
    grpc_idle_timeout_s: float = GRPC_IDLE_S

    def __post_init__(self) -> None:
        checks = [
            (
                (self.grpc_tls_cert is None) == (self.grpc_tls_key is None),
                "--grpc-tls-cert and --grpc-tls-key go together: a certificate and its private key",
            ),
            (
                self.grpc_tls_client_ca is None or self.grpc_tls_cert is not None,
                "--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key: client certificates are asked "
                "for over TLS",
            ),
            (
                self.max_grpc_message_bytes is None or self.max_grpc_message_bytes >= 1024,
                f"--max-grpc-message-bytes must be at least 1024, not {self.max_grpc_message_bytes}",
            ),
            (self.max_grpc_streams >= 1, f"--max-grpc-streams must be at least 1, not {self.max_grpc_streams}"),
            (
                1 <= self.max_grpc_calls_per_principal <= self.max_grpc_calls,
                f"--max-grpc-calls-per-principal must be between 1 and --max-grpc-calls ({self.max_grpc_calls}), "
                f"not {self.max_grpc_calls_per_principal}",
            ),
            (
                self.grpc_idle_timeout_s > 0,
                f"--grpc-idle-timeout-s must be more than 0, not {self.grpc_idle_timeout_s}",
            ),
        ]
        for ok, problem in checks:
            if not ok:
                raise ConfigError(problem)

    @property
    def tls(self) -> bool:
        return self.grpc_tls_cert is not None

    def message_limit(self, frame_limit: int) -> int:
        """Largest message either way: ``max_grpc_message_bytes``, else the request frame limit."""
        return self.max_grpc_message_bytes or frame_limit
