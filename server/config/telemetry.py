"""How every process of a server logs and traces: the level, the log's form (text for a
terminal, or one JSON object a line) and where traces go (an OpenTelemetry collector's
OTLP/HTTP endpoint). Built once by the CLI from ``--log-format``, ``--otlp-endpoint`` and the
standard ``OTEL_*`` variables, and handed to each child process, which applies it as it
starts (:mod:`..telemetry`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigError

LOG_FORMATS = ("text", "json")

# The standard variables that name a collector (the SDK's exporter reads them itself), and the one that turns it off.
_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class Telemetry:
    """What each process applies as it starts: ``level`` (a :mod:`logging` level), the log's
    form, and the traces' endpoint (None: no traces, and no OpenTelemetry imported)."""

    level: int = logging.INFO
    log_format: str = "text"
    traces_endpoint: str | None = None  # the full URL spans are POSTed to (``.../v1/traces``)

    def __post_init__(self) -> None:
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format must be one of {', '.join(LOG_FORMATS)}, not {self.log_format!r}")

    @property
    def json_logs(self) -> bool:
        return self.log_format == "json"

    @property
    def tracing(self) -> bool:
        return self.traces_endpoint is not None

    @property
    def verbose(self) -> bool:
        return self.level <= logging.DEBUG


def telemetry_from(
    *,
    verbose: bool,
    log_format: str = "text",
    otlp_endpoint: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Telemetry:
    """The telemetry the flags and the environment ask for. Traces are on with
    ``--otlp-endpoint URL`` (the collector's base URL: spans go to ``URL/v1/traces``), or with
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (the full URL) or ``OTEL_EXPORTER_OTLP_ENDPOINT``
    (the base) as OpenTelemetry's SDKs read them; ``OTEL_SDK_DISABLED=true`` turns them off.
    Spans are sent as OTLP over HTTP (protobuf): a ``grpc`` protocol is refused by name."""
    level = logging.DEBUG if verbose else logging.INFO
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Telemetry(level, log_format)
    endpoint = None
    if otlp_endpoint is not None:
        endpoint = _checked_url("--otlp-endpoint", otlp_endpoint).rstrip("/")
        endpoint += "" if endpoint.endswith(_TRACES_PATH) else _TRACES_PATH  # the base URL, or the full one
    elif environ.get(_ENDPOINT_VARIABLES[0], "").strip():
        endpoint = _checked_url(_ENDPOINT_VARIABLES[0], environ[_ENDPOINT_VARIABLES[0]].strip())
    elif environ.get(_ENDPOINT_VARIABLES[1], "").strip():
        endpoint = _checked_url(_ENDPOINT_VARIABLES[1], environ[_ENDPOINT_VARIABLES[1]].strip()).rstrip("/")
        endpoint += _TRACES_PATH
    if endpoint is not None and otlp_endpoint is None:  # the flag says OTLP/HTTP itself
        # The first of the variables set decides, the traces' own before the general one.
        name = next((name for name in _PROTOCOL_VARIABLES if environ.get(name, "").strip()), None)
        protocol = environ[name].strip() if name is not None else ""
        if name is not None and protocol != "http/protobuf":
            raise ConfigError(
                f"{name}={protocol!r}: bertserve sends traces as OTLP over HTTP (http/protobuf); point "
                "--otlp-endpoint at the collector's OTLP/HTTP port (4318 by default), not its gRPC one"
            )
    if endpoint is not None:
        _check_installed()
    return Telemetry(level, log_format, endpoint)


# What traces need, by the module each package gives (the `otel` extra of setup.py).
_TRACING_MODULES = {
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
}


def _check_installed() -> None:
    missing = []
    for module, package in _TRACING_MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            missing.append(package)
    if missing:
        raise ConfigError(
            f"traces need OpenTelemetry's {', '.join(missing)}: pip install 'bertserve[otel]' (or those packages)"
        )


def _checked_url(name: str, value: str) -> str:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a port that is not one
    except ValueError as exc:
        raise ConfigError(f"{name} must be an http:// or https:// URL, not {value!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError(
            f"{name} must be an http:// or https:// URL of an OTLP/HTTP collector (http://HOST:4318), not {value!r}"
        )
    return value
