"""The flags of ``bertserve start`` for how the head serves: its ports and batching
(:class:`..config.batching.Batching`), the bounds of what it holds
(:class:`..config.limits.Limits`), and its workers and devices; and, for ``bertserve start``
and ``bertserve worker``, how every process logs and traces
(:class:`..config.telemetry.Telemetry`, not a field of the server's config)."""

from __future__ import annotations

from ..config.limits import (
    CLIENT_QUEUED_SENTENCES,
    QUEUED_BYTES,
    QUEUED_SENTENCES,
    REPLY_BYTES,
    REQUEST_SIZE,
    REQUEST_TOKENS,
)
from ..config.stopping import STOP_TIMEOUT_SECONDS
from ..config.telemetry import LOG_FORMATS
from .flag_help import Flag, boolean, under

SERVING_FLAGS = under(
    "serving",
    Flag("--port", "port that takes requests", int, 5555),
    Flag("--port-out", "port that publishes results", int, unset="--port + 1"),
    Flag("--bind", "address to listen on (0.0.0.0: every interface)", default="127.0.0.1"),
    Flag("--max-batch-size", "most sentences in one mini-job", int, 256),
    Flag(
        "--max-batch-tokens",
        "most padded tokens in one bulk mini-job, so jobs take similar time",
        int,
        4096,
        rare=True,
    ),
    Flag("--max-latency-ms", "most a small request for a busy worker waits for company", float, 10.0),
    Flag("--merge-requests", "merge small requests from different clients into one mini-job", boolean, True),
    Flag(
        "--bulk-run-ms",
        "while small requests are about, a long job's model runs are cut to take about this "
        "long, so a small job overtaking it waits at most about this (0: runs of --batch-size)",
        float,
        250.0,
        rare=True,
    ),
    Flag("--legacy-clients", "answer bert-as-service 1.x's own client too", boolean, True, rare=True),
    Flag("--show-tokens-to-client", "send bert-as-service clients each input's tokens", boolean, False, rare=True),
)

LIMIT_FLAGS = under(
    "limits and overload",
    Flag(
        "--max-request-size",
        "most inputs in one request",
        int,
        unset=f"{REQUEST_SIZE}, at most --max-client-queued-sentences",
    ),
    Flag("--max-text-chars", "most characters in one input", int, 100_000),
    Flag(
        "--max-request-tokens",
        "most tokens of model work in one HTTP request, counted before any is tokenized (each "
        "input at most the model's length; a rerank pair counts its query and its document); "
        "past it a 413",
        int,
        REQUEST_TOKENS,
        rare=True,
    ),
    Flag(
        "--max-reply-bytes",
        "largest answer, counted before any work runs (rows x values x bytes; as JSON over HTTP); "
        "past it a 413 that says how many inputs fit",
        int,
        REPLY_BYTES,
        rare=True,
    ),
    Flag("--request-timeout-ms", "a request unfinished after this gets an error reply", int, 600_000),
    Flag(
        "--max-queued-sentences",
        "most inputs queued at once; past it requests get a busy error",
        int,
        unset=f"{QUEUED_SENTENCES}, at least the bounds per client and per request",
    ),
    Flag(
        "--max-client-queued-sentences",
        "most inputs one client may have queued",
        int,
        unset=f"{CLIENT_QUEUED_SENTENCES}, within --max-request-size and --max-queued-sentences",
        rare=True,
    ),
    Flag(
        "--max-queued-bytes",
        "memory the texts of queued requests may hold; past it requests get a busy error",
        int,
        QUEUED_BYTES,
        rare=True,
    ),
    Flag(
        "--bulk-slowdown",
        "a bulk request that would finish (or make one taken before it finish) later than "
        "this many times its time on an idle server, at the speed measured, is refused busy at once (0: never)",
        float,
        4.0,
        rare=True,
    ),
    Flag(
        "--max-message-bytes",
        "largest request frame; a larger one is dropped unread",
        int,
        unset="what the size limits need, at most 16 MiB and --max-queued-bytes",
        rare=True,
    ),
    Flag(
        "--reply-hwm",
        "replies queued for one client connection; bertserve's clients keep at most this many "
        "requests unanswered, and a reply past it is answered with a 'dropped' error instead",
        int,
        100,
        rare=True,
    ),
)

DEVICE_FLAGS = under(
    "workers and devices",
    Flag("--num-worker", "local worker processes (0 with --worker-port: only remote ones)", int, 1),
    Flag("--cpu", "run on the CPU even where a GPU is visible", boolean, False),
    Flag("--device-map", "GPU ids the workers take in turn", int, (), many=True, unset="every visible GPU"),
    Flag(
        "--gpu-memory-fraction",
        "share of its GPU's memory a worker may take",
        float,
        unset="grow as needed",
        metavar="FRACTION",
        rare=True,
    ),
    Flag("--threads-per-worker", "TensorFlow threads per CPU worker", int, unset="the cores shared out"),
    Flag(
        "--worker-nice",
        "how much lower the workers' CPU priority is, so requests move while they compute",
        int,
        5,
        rare=True,
    ),
    Flag(
        "--worker-port",
        "let workers on other machines (`bertserve worker`) join on this port",
        int,
        unset="local workers only",
    ),
    Flag(
        "--feed",
        "what receives and tokenizes a worker's next jobs",
        default="thread",
        choices=("thread", "tfdata"),
        rare=True,
    ),
    Flag(
        "--prefetch-size",
        "jobs a worker holds at once; more than 1 makes small requests wait longer",
        int,
        1,
        rare=True,
    ),
    Flag(
        "--job-timeout-ms",
        "a worker holding a job longer than this is killed and replaced",
        int,
        120_000,
        rare=True,
    ),
    Flag("--heartbeat-timeout-ms", "a worker silent this long is killed and replaced", int, 10_000, rare=True),
    Flag("--max-restarts", "failures in a row of one process before the server gives up", int, 5, rare=True),
    Flag(
        "--stop-timeout",
        "SIGTERM to exit, at most; requests in flight get most of it to finish",
        float,
        STOP_TIMEOUT_SECONDS,
        metavar="SECONDS",
    ),
)

TELEMETRY_FLAGS = under(
    "logs and traces",
    Flag(
        "--log-format",
        "how every process logs to stderr: text, or json (one object a line: time, level, role, model, request_id)",
        default="text",
        choices=LOG_FORMATS,
        metavar="FORMAT",
        rare=True,
    ),
    Flag(
        "--otlp-endpoint",
        "send OpenTelemetry traces of each request, over OTLP/HTTP, to this collector (its base URL; "
        "OTEL_EXPORTER_OTLP_ENDPOINT does too)",
        unset="no traces",
        metavar="URL",
        rare=True,
    ),
)
