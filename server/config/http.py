"""The HTTP front end's options (:class:`Http`): where it listens, what one connection and one
request may hold, in bytes and in time, before the application sees them, who may call it from
a browser or through a proxy; their defaults and the rules their values keep. Each is a
``bertserve start`` flag; :mod:`..http.connections` and :mod:`..http.front` enforce them. Nothing
here imports the web framework, so the config can use it in any process.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigError

HTTP_CONNECTIONS = 1000
"""Default most HTTP connections open at once; one more is answered 503 and closed unread."""
HTTP_HEADER_BYTES = 16 * 1024
"""Default most bytes of an HTTP request's line and headers (h11's own default)."""
HTTP_HEADERS = 100
"""Default most header fields in one HTTP request."""
HTTP_HEADER_TIMEOUT_S = 10.0
"""Default time an HTTP request's headers may take to arrive."""
HTTP_BODY_TIMEOUT_S = 60.0
"""Default time an HTTP request's body may take to arrive, once its headers have."""
HTTP_BODY_MIN_RATE = 64 * 1024
"""Default slowest average pace of an HTTP body, in bytes a second, after its first 2 s."""
HTTP_BODY_BYTES = 12 * 1024 * 1024
"""Default largest HTTP body: while it is read, parsed and sent on, one body costs the HTTP process
about four times its size, so this keeps one request within 64 MiB; bulk work is better sent as
several requests, or over ZeroMQ."""
HTTP_BODY_BYTES_TOTAL = 32 * 1024 * 1024
"""Default budget of the HTTP bodies held at once (``server/http/bodies.py``): a body costs the head
a few times its size while it is parsed and sent on, so this keeps HTTP within about 300 MiB of a
Kubernetes head's 1 GiB (docker/README.md)."""


@dataclass(frozen=True, kw_only=True)
class Http:
    """The HTTP front end's options (their flags' names), checked when built; the body limit
    against the request frame limit is the server's check (:meth:`body_checks`)."""

    http_bind: str | None = None  # None: the server's --bind
    max_http_body_bytes: int | None = None  # None: HTTP_BODY_BYTES, at most the frame limit and the total
    max_http_body_bytes_total: int = HTTP_BODY_BYTES_TOTAL
    max_http_body_bytes_per_principal: int | None = None  # None: half the total, at least one body at the limit
    http_body_timeout_s: float = HTTP_BODY_TIMEOUT_S
    http_body_min_rate: int = HTTP_BODY_MIN_RATE  # bytes a second; 0: any pace within the timeout
    max_http_connections: int = HTTP_CONNECTIONS
    max_http_header_bytes: int = HTTP_HEADER_BYTES
    max_http_headers: int = HTTP_HEADERS
    http_header_timeout_s: float = HTTP_HEADER_TIMEOUT_S
    forwarded_allow_ips: tuple[str, ...] = ()  # proxies whose X-Forwarded-For is believed (none: the peer address)
    metrics_principals: bool = False  # /metrics names each HTTP principal
    cors_allow_origin: tuple[str, ...] = ()  # origins whose pages may call the HTTP API (CORS)

    def __post_init__(self) -> None:
        for ok, problem in self._checks():
            if not ok:
                raise ConfigError(problem)
        object.__setattr__(self, "forwarded_allow_ips", forwarded_allow_ips(self.forwarded_allow_ips))
        object.__setattr__(self, "cors_allow_origin", cors_origins(self.cors_allow_origin))

    def body_limit(self, message_limit: int) -> int:
        """Largest HTTP request body: ``max_http_body_bytes``, or :data:`HTTP_BODY_BYTES`, at most
        ``message_limit`` (the request frame limit) and ``max_http_body_bytes_total``."""
        if self.max_http_body_bytes is not None:
            return self.max_http_body_bytes
        return min(HTTP_BODY_BYTES, message_limit, self.max_http_body_bytes_total)

    def principal_body_limit(self, message_limit: int) -> int:
        """What one HTTP principal's bodies may hold at once: ``max_http_body_bytes_per_principal``,
        or half of ``max_http_body_bytes_total`` (so another principal always finds the other
        half), at least one body at :meth:`body_limit`."""
        if self.max_http_body_bytes_per_principal is not None:
            return self.max_http_body_bytes_per_principal
        return max(self.max_http_body_bytes_total // 2, self.body_limit(message_limit))

    def body_checks(self, message_limit: int) -> list[tuple[bool, str]]:
        """The rules the body limits keep against ``message_limit``, the request frame limit:
        (holds, the message if not)."""
        body, total = self.max_http_body_bytes, self.max_http_body_bytes_total
        principal = self.max_http_body_bytes_per_principal
        return [
            (
                body is None or 1024 <= body <= message_limit,
                f"--max-http-body-bytes {body} must be between 1024 and the request frame limit, "
                f"{message_limit} bytes (--max-message-bytes, or what --max-request-size and --max-text-chars "
                "need, at most 16 MiB): raise --max-message-bytes too",
            ),
            (
                body is None or body <= total,
                f"--max-http-body-bytes {body} must not exceed --max-http-body-bytes-total "
                f"{total}, or a body at the limit could never be read",
            ),
            (
                principal is None or self.body_limit(message_limit) <= principal <= total,
                f"--max-http-body-bytes-per-principal {principal} must be between the body "
                f"limit {self.body_limit(message_limit)} (--max-http-body-bytes) and --max-http-body-bytes-total "
                f"{total}",
            ),
        ]

    def _checks(self) -> list[tuple[bool, str]]:
        return [
            (
                self.max_http_body_bytes_total >= 1024,
                f"--max-http-body-bytes-total must be at least 1024, not {self.max_http_body_bytes_total}",
            ),
            (
                self.http_body_timeout_s > 0,
                f"--http-body-timeout-s must be more than 0, not {self.http_body_timeout_s}",
            ),
            (
                self.http_body_min_rate >= 0,
                f"--http-body-min-rate must be 0 or more, not {self.http_body_min_rate}",
            ),
            (
                self.max_http_connections >= 1,
                f"--max-http-connections must be at least 1, not {self.max_http_connections}",
            ),
            (
                self.max_http_header_bytes >= 1024,
                f"--max-http-header-bytes must be at least 1024, not {self.max_http_header_bytes}",
            ),
            (self.max_http_headers >= 1, f"--max-http-headers must be at least 1, not {self.max_http_headers}"),
            (
                self.http_header_timeout_s > 0,
                f"--http-header-timeout-s must be more than 0, not {self.http_header_timeout_s}",
            ),
        ]


def forwarded_allow_ips(values: Sequence[str]) -> tuple[str, ...]:
    """``--forwarded-allow-ips``: addresses or networks (``10.0.0.0/8``), or ``*`` for any,
    whose ``X-Forwarded-For`` the HTTP process believes; anything else is a ConfigError."""
    for item in _items(values):
        if item != "*":
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ConfigError(f"--forwarded-allow-ips takes addresses, networks or *, not {item!r}") from None
    return tuple(_items(values))


def cors_origins(values: Sequence[str]) -> tuple[str, ...]:
    """``--cors-allow-origin``: origins as a browser sends them (``scheme://host[:port]``, no
    path), or ``*`` for any page; anything else is a ConfigError."""
    for item in _items(values):
        if item != "*" and not _is_origin(item):
            raise ConfigError(
                f"--cors-allow-origin takes an origin, scheme://host[:port] with no path or trailing "
                f"slash (https://app.example.com), or *, not {item!r}"
            )
    return tuple(dict.fromkeys(_items(values)))


def _items(values: Sequence[str]) -> list[str]:
    """A repeatable flag's values, each of which may hold several separated by commas (as the
    environment gives them), without blanks."""
    return [item.strip() for value in values for item in str(value).split(",") if item.strip()]


def _is_origin(text: str) -> bool:
    parts = urlsplit(text)
    try:
        parts.port  # noqa: B018 - raises ValueError on a port that is not one
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and text == f"{parts.scheme}://{parts.netloc}"
