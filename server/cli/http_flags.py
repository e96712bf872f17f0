"""The flags of ``bertserve start`` for its edges: the HTTP front end (its port, names, keys
and the limits of its edge, :mod:`..config.http`), the gRPC one (:mod:`..config.grpc`) and
security (CURVE, who may stop the server, the API keys)."""

from __future__ import annotations

from ..config.grpc import GRPC_CALLS, GRPC_IDLE_S, GRPC_PRINCIPAL_CALLS, GRPC_STREAMS
from ..config.http import (
    HTTP_BODY_MIN_RATE,
    HTTP_BODY_TIMEOUT_S,
    HTTP_CONNECTIONS,
    HTTP_HEADER_BYTES,
    HTTP_HEADER_TIMEOUT_S,
    HTTP_HEADERS,
)
from ..config.server import HTTP_BODY_BYTES_TOTAL
from .flag_help import Flag, boolean, under

HTTP_FLAGS = under(
    "HTTP and gRPC",
    Flag("--http-port", "also serve the HTTP API (OpenAI's /v1/embeddings, ...) on this port", int, unset="no HTTP"),
    Flag("--http-bind", "address the HTTP port listens on", unset="--bind"),
    Flag(
        "--served-model-name",
        "the model name the HTTP API lists and accepts",
        unset="all-MiniLM-L6-v2 without --model-dir, else the directory's name",
    ),
    Flag(
        "--model-alias",
        "other names the HTTP API accepts for the model",
        many=True,
        default=(),
        unset="none",
        metavar="NAME",
    ),
    Flag(
        "--auto-truncate",
        "cut an over-long input where a request does not say (TEI's truncate; /v1/embeddings counts those cut)",
        boolean,
        False,
        rare=True,
    ),
    Flag(
        "--token-id-input",
        "take token id arrays as this model's WordPiece ids (else refused: most clients send tiktoken ids)",
        boolean,
        False,
        rare=True,
    ),
    Flag(
        "--max-http-body-bytes",
        "largest HTTP request body; larger is refused with 413",
        int,
        unset="16 MiB, at most the request frame limit",
        rare=True,
    ),
    Flag(
        "--max-http-body-bytes-total",
        "HTTP bodies held at once, each counted as its bytes plus 64 per comma, "
        "232 per '{' and 88 per '['; past it 429",
        int,
        HTTP_BODY_BYTES_TOTAL,
        rare=True,
    ),
    Flag(
        "--max-http-body-bytes-per-principal",
        "HTTP bodies one principal (API key, else address) holds at once, of --max-http-body-bytes-total; past it 429",
        int,
        unset="half the total, at least --max-http-body-bytes",
        rare=True,
    ),
    Flag(
        "--http-body-timeout-s",
        "an HTTP body not whole this long after its headers is cut off with 408",
        float,
        HTTP_BODY_TIMEOUT_S,
        rare=True,
    ),
    Flag(
        "--http-body-min-rate",
        "an HTTP body slower than this many bytes a second on average (after 2 s) is cut off with 408 (0: any pace)",
        int,
        HTTP_BODY_MIN_RATE,
        metavar="BYTES",
        rare=True,
    ),
    Flag(
        "--max-http-connections",
        "HTTP connections open at once; one more is answered 503 and closed",
        int,
        HTTP_CONNECTIONS,
        rare=True,
    ),
    Flag(
        "--max-http-header-bytes",
        "largest HTTP request line and headers; larger is answered 400 and closed",
        int,
        HTTP_HEADER_BYTES,
        rare=True,
    ),
    Flag(
        "--max-http-headers",
        "most header fields in one HTTP request; more is 431",
        int,
        HTTP_HEADERS,
        metavar="N",
        rare=True,
    ),
    Flag(
        "--http-header-timeout-s",
        "HTTP request headers not whole this long after the connection (or the "
        "request's first byte) are answered 408 and closed",
        float,
        HTTP_HEADER_TIMEOUT_S,
        rare=True,
    ),
    Flag(
        "--forwarded-allow-ips",
        "proxies (addresses, networks, or *) whose X-Forwarded-For names the HTTP caller",
        many=True,
        default=(),
        unset="none: the peer address",
        metavar="ADDR",
        rare=True,
    ),
    Flag(
        "--cors-allow-origin",
        "let pages from this origin (https://app.example.com, or *) call the HTTP API from a browser",
        many=True,
        default=(),
        unset="none: no CORS headers",
        metavar="ORIGIN",
        rare=True,
    ),
    Flag(
        "--metrics-principals",
        "name each HTTP principal in /metrics (bertserve_http_principal_requests_total)",
        boolean,
        False,
        rare=True,
    ),
    Flag(
        "--metrics-port",
        "serve Prometheus /metrics alone on this port (with --http-port it is at /metrics)",
        int,
        unset="none",
    ),
)

GRPC_FLAGS = under(
    "HTTP and gRPC",
    Flag("--grpc-port", "serve TEI's gRPC API on this port", int, unset="none"),
    Flag("--grpc-bind", "address the gRPC port listens on", unset="--bind", rare=True),
    Flag(
        "--grpc-tls-cert",
        "PEM certificate chain: the gRPC port speaks TLS only",
        unset="plain",
        metavar="FILE",
        rare=True,
    ),
    Flag("--grpc-tls-key", "PEM private key of --grpc-tls-cert", unset="none", metavar="FILE", rare=True),
    Flag(
        "--grpc-tls-client-ca",
        "PEM CAs: a gRPC caller must show a certificate one of them signed",
        unset="none asked",
        metavar="FILE",
        rare=True,
    ),
    Flag(
        "--max-grpc-message-bytes",
        "largest gRPC message either way; larger is RESOURCE_EXHAUSTED",
        int,
        unset="the request frame limit",
        rare=True,
    ),
    Flag("--max-grpc-streams", "gRPC calls open at once on one connection", int, GRPC_STREAMS, rare=True),
    Flag(
        "--max-grpc-calls-per-principal",
        "gRPC calls one principal holds open; past it RESOURCE_EXHAUSTED",
        int,
        GRPC_PRINCIPAL_CALLS,
        rare=True,
    ),
    Flag("--max-grpc-calls", "gRPC calls the process holds open", int, GRPC_CALLS, rare=True),
    Flag(
        "--grpc-idle-timeout-s",
        "a gRPC stream that sends nothing this long is ended with DEADLINE_EXCEEDED",
        float,
        GRPC_IDLE_S,
        rare=True,
    ),
)

SECURITY_FLAGS = under(
    "security",
    Flag(
        "--curve-dir",
        "serve with CURVE: DIR/server.key_secret; client keys in DIR/clients, admins in DIR/admins",
        unset="plain TCP",
    ),
    Flag("--allow-terminate", "let clients stop the server", boolean, unset="on loopback without CURVE, or admins"),
    Flag(
        "--api-key",
        "HTTP and gRPC callers must send Authorization: Bearer KEY; better as BERTSERVE_API_KEY, "
        "since every user can see a command line",
        unset="none needed",
        metavar="KEY",
    ),
    Flag(
        "--api-keys",
        "FILE of NAME KEY lines: each key a principal of its own (bounds, turns, metrics)",
        unset="none",
        metavar="FILE",
    ),
)
