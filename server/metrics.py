"""Prometheus metrics of every server process, in one registry.

The ventilator, the sink and the HTTP front end are separate processes, so the metrics use
``prometheus-client``'s multiprocess mode: each process writes its values to memory-mapped
files in one directory, and whoever serves ``/metrics`` merges them. ``prometheus_client``
reads that directory from ``PROMETHEUS_MULTIPROC_DIR`` when it is first imported, so
``bertserve start`` creates a fresh one before anything imports this module, and its child
processes inherit it. Without it (an in-process ``Ventilator`` in a test, say) the metrics
live in this process's default registry.

Requests are labelled with their ``path``: ``http`` for those the HTTP front end sends
(their client ids carry :data:`HTTP_ID_MARK`), ``grpc`` for the gRPC front end's
(:data:`GRPC_ID_MARK`), ``zmq`` for every other client.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST as CONTENT_TYPE,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

_ENV = "PROMETHEUS_MULTIPROC_DIR"

HTTP_ID_MARK = b"http-"
GRPC_ID_MARK = b"grpc-"
"""Client ids of the HTTP front end start with this (after ``<key>:`` under CURVE)."""

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

REQUESTS = Counter(
    "bertserve_requests_total",
    "Encode requests answered, by path, outcome (ok, or the error kind) and model (empty: none was chosen)",
    ["path", "outcome", "model"],
)
REQUEST_SECONDS = Histogram(
    "bertserve_request_duration_seconds",
    "Time from admitting an encode request to publishing its reply",
    ["path", "model"],
    buckets=_LATENCY_BUCKETS,
)
SENTENCES = Counter("bertserve_sentences_total", "Inputs encoded by the workers", ["model"])
SKIPPED_SENTENCES = Counter(
    "bertserve_skipped_sentences_total", "Inputs a worker held but did not run: their requests were past their deadline"
)
EXPIRED_SENTENCES = Counter(
    "bertserve_expired_sentences_total", "Queued inputs dropped before any worker got them: their deadline had passed"
)
TOKENS = Counter("bertserve_tokens_total", "Tokens encoded by the workers, padding left out")
TOKEN_SLOTS = Counter("bertserve_token_slots_total", "Token positions the model computed, padding included")
PADDING = Gauge(
    "bertserve_padding_ratio",
    "Share of computed token positions that were padding, since start",
    multiprocess_mode="mostrecent",
)
JOB_SENTENCES = Histogram(
    "bertserve_job_sentences", "Inputs per mini-job sent to a worker", ["model"], buckets=_SIZE_BUCKETS
)
JOB_SECONDS = Histogram(
    "bertserve_job_seconds", "Model time of one mini-job in its worker", ["model"], buckets=_LATENCY_BUCKETS
)
QUEUED = Gauge(
    "bertserve_queued_sentences",
    "Inputs waiting in the scheduler, by queue (small, bulk, retry) and model",
    ["queue", "model"],
    multiprocess_mode="mostrecent",
)
QUEUED_REQUESTS = Gauge(
    "bertserve_queued_requests",
    "Requests waiting in the scheduler, by queue (small, bulk) and model",
    ["queue", "model"],
    multiprocess_mode="mostrecent",
)
QUEUED_BYTES = Gauge(
    "bertserve_queued_bytes",
    "Memory the texts of admitted requests hold in the head (of --max-queued-bytes)",
    multiprocess_mode="mostrecent",
)
RUNNING_JOBS = Gauge("bertserve_running_jobs", "Mini-jobs held by workers", multiprocess_mode="mostrecent")
IN_FLIGHT = Gauge("bertserve_in_flight_requests", "Admitted requests not answered yet", multiprocess_mode="mostrecent")
REJECTIONS = Counter("bertserve_rejections_total", "Requests refused on arrival, by kind (busy, limit, ...)", ["kind"])
MODEL_VERSION = Gauge(
    "bertserve_model_version", "The model version served (0: a plain model directory)", multiprocess_mode="mostrecent"
)
MODEL_SYNC_FAILURES = Counter(
    "bertserve_model_sync_failures_total",
    "Syncs of a model from its store that failed (the store out of reach, a file refused), by model",
    ["model"],
)
MODEL_SYNC_LAST_SUCCESS = Gauge(
    "bertserve_model_sync_last_success_timestamp_seconds",
    "When a model's store was last synced or found unchanged (Unix time), by model",
    ["model"],
    multiprocess_mode="mostrecent",
)
VERSIONS_REFUSED = Counter("bertserve_model_versions_refused_total", "Model versions refused: not whole, or unreadable")
RESTARTS = Counter("bertserve_process_restarts_total", "Server processes restarted after a failure", ["process"])
WORKERS = Gauge("bertserve_workers", "Workers registered and serving", multiprocess_mode="mostrecent")
MODEL_WORKERS = Gauge(
    "bertserve_model_workers", "Workers registered and serving, by model", ["model"], multiprocess_mode="mostrecent"
)
READY = Gauge(
    "bertserve_ready", "1 when the server has a worker and answers encode requests", multiprocess_mode="mostrecent"
)
MODEL = Gauge(
    "bertserve_model_info",
    "Each served model (name and directory); the value is always 1",
    ["model", "model_dir", "dtype", "pooling_strategy", "output_dim", "max_seq_len"],
    multiprocess_mode="mostrecent",
)
HTTP_REQUESTS = Counter(
    "bertserve_http_requests_total", "HTTP requests by endpoint and status code", ["endpoint", "status"]
)
HTTP_SECONDS = Histogram(
    "bertserve_http_request_duration_seconds",
    "HTTP request time by endpoint",
    ["endpoint"],
    buckets=_LATENCY_BUCKETS,
)
HTTP_PRINCIPAL_REQUESTS = Counter(
    "bertserve_http_principal_requests_total",
    "HTTP requests past the API key check, by principal (the key's name; anonymous without keys) and status code",
    ["principal", "status"],
)
GRPC_CALLS = Counter(
    "bertserve_grpc_calls_total", "gRPC calls by method (tei.v1.Embed/Embed) and status code", ["method", "code"]
)
GRPC_SECONDS = Histogram(
    "bertserve_grpc_call_duration_seconds", "gRPC call time by method", ["method"], buckets=_LATENCY_BUCKETS
)
GRPC_OPEN_CALLS = Gauge(
    "bertserve_grpc_open_calls", "gRPC calls open now, streams included", multiprocess_mode="livesum"
)
HTTP_BODY_BYTES = Gauge(
    "bertserve_http_body_bytes",
    "What the HTTP bodies in flight hold of --max-http-body-bytes-total (their bytes, and 64 per comma, 232 per "
    "'{', 88 per '[')",
    multiprocess_mode="mostrecent",
)


def path_of(client_id: bytes) -> str:
    """``http`` for a request the HTTP front end sent, ``grpc`` for one the gRPC front end sent,
    ``zmq`` for any other."""
    _, _, own = client_id.rpartition(b":")
    if own.startswith(HTTP_ID_MARK):
        return "http"
    return "grpc" if own.startswith(GRPC_ID_MARK) else "zmq"


def _registry() -> CollectorRegistry:
    directory = os.environ.get(_ENV)
    if not directory:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)
    return registry


def render() -> tuple[bytes, str]:
    """Every process's metrics in Prometheus' text format, and its content type."""
    return generate_latest(_registry()), CONTENT_TYPE


def serve(port: int, bind: str) -> None:
    """Serve ``/metrics`` alone on ``bind:port`` from a thread of this process (``--metrics-port``)."""
    from prometheus_client import start_http_server

    start_http_server(port, addr=bind, registry=_registry())
