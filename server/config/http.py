"""The limits of the HTTP front end's edge: what one connection and one request may hold, in
bytes and in time, before the application sees them; their defaults and the rules their values
keep. ``ServerConfig`` holds the values (each a ``bertserve start`` flag) and checks them here;
:mod:`..http.connections` and :mod:`..http.front` enforce them. Nothing here imports the web framework, so
the config can use it in any process.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any
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


def http_limit_checks(config: Any, message_limit: int) -> list[tuple[bool, str]]:
    """The rules of a ``ServerConfig``'s HTTP edge limits, a body at most ``message_limit``
    (the request frame limit): (holds, the message if not)."""
    return [
        (
            config.max_http_body_bytes_total >= 1024,
            f"--max-http-body-bytes-total must be at least 1024, not {config.max_http_body_bytes_total}",
        ),
        (
            config.max_http_body_bytes is None or 1024 <= config.max_http_body_bytes <= message_limit,
            f"--max-http-body-bytes {config.max_http_body_bytes} must be between 1024 and the request frame limit, "
            f"{message_limit} bytes (--max-message-bytes, or what --max-request-size and --max-text-chars "
            "need, at most 16 MiB): raise --max-message-bytes too",
        ),
        (
            config.max_http_body_bytes is None or config.max_http_body_bytes <= config.max_http_body_bytes_total,
            f"--max-http-body-bytes {config.max_http_body_bytes} must not exceed --max-http-body-bytes-total "
            f"{config.max_http_body_bytes_total}, or a body at the limit could never be read",
        ),
        (
            config.max_http_body_bytes_per_principal is None
            or config.http_body_limit <= config.max_http_body_bytes_per_principal <= config.max_http_body_bytes_total,
            f"--max-http-body-bytes-per-principal {config.max_http_body_bytes_per_principal} must be between the body "
            f"limit {config.http_body_limit} (--max-http-body-bytes) and --max-http-body-bytes-total "
            f"{config.max_http_body_bytes_total}",
        ),
        (
            config.http_body_timeout_s > 0,
            f"--http-body-timeout-s must be more than 0, not {config.http_body_timeout_s}",
        ),
        (config.http_body_min_rate >= 0, f"--http-body-min-rate must be 0 or more, not {config.http_body_min_rate}"),
        (
            config.max_http_connections >= 1,
            f"--max-http-connections must be at least 1, not {config.max_http_connections}",
        ),
        (
            config.max_http_header_bytes >= 1024,
            f"--max-http-header-bytes must be at least 1024, not {config.max_http_header_bytes}",
        ),
        (config.max_http_headers >= 1, f"--max-http-headers must be at least 1, not {config.max_http_headers}"),
        (
            config.http_header_timeout_s > 0,
            f"--http-header-timeout-s must be more than 0, not {config.http_header_timeout_s}",
        ),
    ]
