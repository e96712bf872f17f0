"""The server's options: processes, ports, batching, devices, limits, security and HTTP."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from . import http as http_limits
from .model import ModelConfig
from .specs import check_models

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest request frame ``--max-message-bytes`` may allow."""
MESSAGE_BYTES = 16 * 1024 * 1024
"""Default largest request frame: larger requests are better sent as several. ZeroMQ reads a
frame whole before the ventilator sees it, one per connection at a time, so this bounds what a
flood of large frames can make the head hold (docker/README.md)."""
QUEUED_BYTES = 128 * 1024 * 1024
"""Default bound on the memory the texts of admitted requests hold in the head
(``--max-queued-bytes``): with the HTTP budget and the idle head, within a 1 GiB limit."""
QUEUED_SENTENCES = 500_000
CLIENT_QUEUED_SENTENCES = 200_000
REQUEST_SIZE = 100_000
HTTP_BODY_BYTES = 12 * 1024 * 1024
"""Default largest HTTP body: while it is read, parsed and sent on, one body costs the HTTP process
about four times its size, so this keeps one request within 64 MiB; bulk work is better sent as
several requests, or over ZeroMQ."""
HTTP_BODY_BYTES_TOTAL = 32 * 1024 * 1024
"""Default budget of the HTTP bodies held at once (``server/http/bodies.py``): a body costs the head
a few times its size while it is parsed and sent on, so this keeps HTTP within about 300 MiB of a
Kubernetes head's 1 GiB (docker/README.md)."""
HEARTBEAT_INTERVAL_MS = 1000
"""How often a worker tells the ventilator it is alive."""


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """How ``bertserve start`` serves: processes, ports, batching, devices and limits.

    Built once by the CLI (or by tests) and passed whole to every role. ``port_out`` left
    out (``None``) is ``port + 1``; once built it is always an int. With several models
    (``models`` or ``models_dir``), the CLI makes ``model`` the default model's options
    (:func:`.served_models.with_default_model`), and :func:`.served_models.served_models`
    gives each model a config of its own.
    """

    model: ModelConfig
    num_worker: int = 1
    port: int = 5555
    port_out: int | None = None  # None: port + 1
    bind: str = "127.0.0.1"
    max_batch_size: int = 256
    max_batch_tokens: int = 4096
    max_latency_ms: float = 10.0
    merge_requests: bool = True
    prefetch_size: int = 1
    bulk_run_ms: float = 250.0  # while small jobs are about, a long job's model runs take about this long
    cpu: bool = False
    device_map: tuple[int, ...] = ()
    gpu_memory_fraction: float | None = None
    threads_per_worker: int | None = None
    worker_nice: int = 5
    feed: str = "thread"
    max_request_size: int | None = None  # None: REQUEST_SIZE, at most max_client_queued_sentences
    max_text_chars: int = 100_000
    request_timeout_ms: int = 600_000
    bulk_slowdown: float = 4.0  # a bulk request that would take more than this times its idle-server time: busy
    max_queued_sentences: int | None = None  # None: QUEUED_SENTENCES, at least the two below (_follow_bounds)
    max_client_queued_sentences: int | None = None  # None: CLIENT_QUEUED_SENTENCES, within the two around it
    max_queued_bytes: int = QUEUED_BYTES
    max_message_bytes: int | None = None
    reply_hwm: int = 100
    job_timeout_ms: int = 120_000
    heartbeat_timeout_ms: int = 10_000
    max_restarts: int = 5
    curve_dir: str | None = None
    allow_terminate: bool | None = None
    legacy_clients: bool = True  # answer bert-as-service 1.x's client in its own wire format
    show_tokens_to_client: bool = False  # legacy clients get each input's tokens with its vectors
    model_class: str | None = None
    http_port: int | None = None
    http_bind: str | None = None
    api_key: str | None = dataclasses.field(default=None, repr=False)
    api_keys: str | None = None  # a file of NAME KEY lines: the HTTP principals (server/http/principals.py)
    max_http_body_bytes: int | None = None  # None: HTTP_BODY_BYTES, at most message_limit and the total
    max_http_body_bytes_total: int = HTTP_BODY_BYTES_TOTAL
    max_http_body_bytes_per_principal: int | None = None  # None: half the total, at least one body at the limit
    http_body_timeout_s: float = http_limits.HTTP_BODY_TIMEOUT_S
    http_body_min_rate: int = http_limits.HTTP_BODY_MIN_RATE  # bytes a second; 0: any pace within the timeout
    max_http_connections: int = http_limits.HTTP_CONNECTIONS
    max_http_header_bytes: int = http_limits.HTTP_HEADER_BYTES
    max_http_headers: int = http_limits.HTTP_HEADERS
    http_header_timeout_s: float = http_limits.HTTP_HEADER_TIMEOUT_S
    forwarded_allow_ips: tuple[str, ...] = ()  # proxies whose X-Forwarded-For is believed (none: the peer address)
    metrics_principals: bool = False  # /metrics names each HTTP principal
    metrics_port: int | None = None
    served_model_name: str | None = None
    model_alias: tuple[str, ...] = ()
    worker_port: int | None = None
    model_version: str = "latest"  # with a model repository: "latest" or a version number
    require_manifest: bool = False
    poll_interval_s: float = 0.0  # with a model repository: look for a newer version this often (0: never)
    prompt: tuple[str, ...] = ()  # NAME=TEXT: prompts beside (and over) those the model directory names
    default_prompt_name: str | None = None  # the prompt every request gets unless it names one
    token_id_input: bool = False  # HTTP: take OpenAI-style token id arrays as this model's WordPiece ids
    models: tuple[str, ...] = ()  # NAME=DIR[,key=value,...]: several models, each in served_models.py's terms
    models_dir: str | None = None  # several models: one subfolder each, named by the folder
    default_model: str | None = None  # the model a request gets unless it names one (None: the first)
    model_defaults: ModelConfig | None = None  # with models or models_dir: the model flags, under each model's own

    def __post_init__(self) -> None:
        self._follow_bounds()
        port_out = self.port + 1 if self.port_out is None else self.port_out
        extra_ports = [p for p in (self.http_port, self.metrics_port, self.worker_port) if p is not None]
        checks = [
            (
                self.num_worker >= 1 or (self.num_worker == 0 and self.worker_port is not None),
                "num_worker must be at least 1 (0 only with worker_port, for a head whose workers join remotely)",
            ),
            (1 <= self.port <= 65535, "port must be between 1 and 65535"),
            (
                1 <= port_out <= 65535,
                "port_out must be between 1 and 65535"
                if self.port_out is not None
                else f"port_out defaults to port + 1 = {port_out}, past 65535: set port_out",
            ),
            (self.port != port_out, "port and port_out must differ"),
            (
                all(p is None or 1 <= p <= 65535 for p in (self.http_port, self.metrics_port, self.worker_port)),
                "http_port, metrics_port and worker_port must be between 1 and 65535",
            ),
            (
                len({self.port, port_out, *extra_ports}) == 2 + len(extra_ports),
                "port, port_out, http_port, metrics_port and worker_port must all differ",
            ),
            (self.api_key is None or len(self.api_key.strip()) >= 8, "api_key must be at least 8 characters"),
            (
                self.curve_dir is None
                or self.http_port is None
                or self.api_key is not None
                or self.api_keys is not None,
                "with curve_dir, serving HTTP needs api_key (or api_keys) too: else HTTP would serve "
                "anyone CURVE keeps "
                "out",
            ),
            (
                self.max_http_body_bytes_total >= 1024,
                f"--max-http-body-bytes-total must be at least 1024, not {self.max_http_body_bytes_total}",
            ),
            (
                self.max_http_body_bytes is None or 1024 <= self.max_http_body_bytes <= self.message_limit,
                f"--max-http-body-bytes {self.max_http_body_bytes} must be between 1024 and the request frame limit, "
                f"{self.message_limit} bytes (--max-message-bytes, or what --max-request-size and --max-text-chars "
                "need, at most 16 MiB): raise --max-message-bytes too",
            ),
            (
                self.max_http_body_bytes is None or self.max_http_body_bytes <= self.max_http_body_bytes_total,
                f"--max-http-body-bytes {self.max_http_body_bytes} must not exceed --max-http-body-bytes-total "
                f"{self.max_http_body_bytes_total}, or a body at the limit could never be read",
            ),
            *http_limits.http_limit_checks(self),
            (self.max_batch_size >= 1, "max_batch_size must be at least 1"),
            (self.max_batch_tokens >= 1, "max_batch_tokens must be at least 1"),
            (self.max_latency_ms >= 0, "max_latency_ms must not be negative"),
            (self.prefetch_size >= 1, "prefetch_size must be at least 1"),
            (self.bulk_run_ms >= 0, f"--bulk-run-ms must be 0 or more, not {self.bulk_run_ms}"),
            (self.max_text_chars >= 1, "max_text_chars must be at least 1"),
            (self.request_timeout_ms >= 1, "request_timeout_ms must be at least 1"),
            (self.bulk_slowdown >= 0, f"--bulk-slowdown must be 0 or more, not {self.bulk_slowdown}"),
            (
                self.max_message_bytes is None or 1024 <= self.max_message_bytes <= MAX_MESSAGE_BYTES,
                f"--max-message-bytes must be between 1024 and {MAX_MESSAGE_BYTES}, not {self.max_message_bytes}",
            ),
            (
                self.max_queued_bytes >= 1024 * 1024,
                f"--max-queued-bytes must be at least 1 MiB (1048576), not {self.max_queued_bytes}",
            ),
            (
                self.max_message_bytes is None or self.max_message_bytes <= self.max_queued_bytes,
                f"--max-message-bytes {self.max_message_bytes} is more than --max-queued-bytes "
                f"{self.max_queued_bytes}: a "
                "request that large could never be queued; lower --max-message-bytes or raise --max-queued-bytes",
            ),
            (self.reply_hwm >= 1, "reply_hwm must be at least 1"),
            (self.job_timeout_ms >= 100, "job_timeout_ms must be at least 100"),
            (
                self.heartbeat_timeout_ms >= 3 * HEARTBEAT_INTERVAL_MS,
                f"heartbeat_timeout_ms must be at least {3 * HEARTBEAT_INTERVAL_MS} (three heartbeats)",
            ),
            (self.max_restarts >= 1, "max_restarts must be at least 1"),
            (
                self.gpu_memory_fraction is None or 0 < self.gpu_memory_fraction <= 1,
                "gpu_memory_fraction must be in (0, 1]",
            ),
            (self.threads_per_worker is None or self.threads_per_worker >= 1, "threads_per_worker must be >= 1"),
            (0 <= self.worker_nice <= 19, "worker_nice must be between 0 and 19"),
            (
                all(isinstance(item, str) and item.partition("=")[0].strip() and "=" in item for item in self.prompt),
                f"--prompt takes NAME=TEXT, not {next((i for i in self.prompt if '=' not in str(i)), '')!r}",
            ),
            (self.feed in ("thread", "tfdata"), "feed must be thread or tfdata"),
            (
                str(self.model_version).lower() == "latest" or str(self.model_version).isdigit(),
                "model_version must be latest or a version number",
            ),
            (self.poll_interval_s >= 0, "poll_interval_s must not be negative (0 turns polling off)"),
        ]
        for ok, problem in checks:
            if not ok:
                raise ConfigError(problem)
        named = self.served_model_name is not None or bool(self.model_alias)
        check_models(self.models, self.models_dir, self.default_model, named=named)
        object.__setattr__(self, "models", tuple(str(spec) for spec in self.models))
        if self.models_dir is not None:
            object.__setattr__(self, "models_dir", os.fspath(self.models_dir))
        object.__setattr__(self, "port_out", port_out)
        object.__setattr__(self, "device_map", tuple(int(d) for d in self.device_map))
        object.__setattr__(self, "model_alias", tuple(str(a) for a in self.model_alias))
        object.__setattr__(self, "forwarded_allow_ips", http_limits.forwarded_allow_ips(self.forwarded_allow_ips))
        if self.curve_dir is not None:
            object.__setattr__(self, "curve_dir", os.fspath(self.curve_dir))
        object.__setattr__(self, "model_version", str(self.model_version).lower())

    def _follow_bounds(self) -> None:
        """Set the sentence bounds left out so that they fit those given: a request at most a
        client's queue, a client's queue at most the server's. Each left out takes its default,
        moved as far as the bounds given need (``--max-queued-sentences 2000`` alone lowers
        the other two to 2000; ``--max-request-size 300000`` alone raises the queues to it).
        Only bounds given that contradict each other are an error, naming both flags."""
        names = {
            "queued": "--max-queued-sentences",
            "client": "--max-client-queued-sentences",
            "request": "--max-request-size",
        }
        given = {
            "queued": self.max_queued_sentences,
            "client": self.max_client_queued_sentences,
            "request": self.max_request_size,
        }
        for key, value in given.items():
            if value is not None and value < 1:
                raise ConfigError(f"{names[key]} must be at least 1, not {value}")
        for low, high in (("request", "client"), ("client", "queued"), ("request", "queued")):
            small, large = given[low], given[high]
            if small is not None and large is not None and small > large:
                raise ConfigError(
                    f"{names[low]} {small} is more than {names[high]} {large}: "
                    + (
                        "a request that large could never queue"
                        if low == "request"
                        else "one client cannot queue more than the whole server"
                    )
                    + f"; lower {names[low]} or raise {names[high]}"
                )
        request_given, client_given = given["request"] or 0, given["client"] or 0
        queued = given["queued"] or max(QUEUED_SENTENCES, client_given, request_given)
        client = given["client"] or max(min(CLIENT_QUEUED_SENTENCES, queued), request_given)
        request = given["request"] or min(REQUEST_SIZE, client)
        object.__setattr__(self, "max_queued_sentences", queued)
        object.__setattr__(self, "max_client_queued_sentences", client)
        object.__setattr__(self, "max_request_size", request)

    @property
    def queue_limit(self) -> int:
        """Most inputs queued at once, all clients together (``max_queued_sentences``, resolved)."""
        assert self.max_queued_sentences is not None  # __post_init__ resolved it
        return self.max_queued_sentences

    @property
    def client_queue_limit(self) -> int:
        """Most inputs one client may have queued (``max_client_queued_sentences``, resolved)."""
        assert self.max_client_queued_sentences is not None  # __post_init__ resolved it
        return self.max_client_queued_sentences

    @property
    def request_size_limit(self) -> int:
        """Most inputs in one request (``max_request_size``, resolved)."""
        assert self.max_request_size is not None  # __post_init__ resolved it
        return self.max_request_size

    @property
    def version_number(self) -> int | None:
        """The model version served, once a repository's version is chosen; else None."""
        return int(self.model_version) if str(self.model_version).isdigit() else None

    @property
    def message_limit(self) -> int:
        """Largest frame the request socket accepts (ZeroMQ's MAXMSGSIZE): ``max_message_bytes``,
        or what the largest allowed request can take as UTF-8 JSON, at most :data:`MESSAGE_BYTES`
        and ``max_queued_bytes``."""
        if self.max_message_bytes is not None:
            return self.max_message_bytes
        per_text = 4 * self.max_text_chars + 8  # UTF-8 bytes, quotes and comma
        return min(MESSAGE_BYTES, self.max_queued_bytes, self.request_size_limit * per_text + 65_536)

    @property
    def http_body_limit(self) -> int:
        """Largest HTTP request body: ``max_http_body_bytes``, or :data:`HTTP_BODY_BYTES`, at most
        the request frame limit and ``max_http_body_bytes_total``."""
        if self.max_http_body_bytes is not None:
            return self.max_http_body_bytes
        return min(HTTP_BODY_BYTES, self.message_limit, self.max_http_body_bytes_total)

    @property
    def http_principal_body_limit(self) -> int:
        """What one HTTP principal's bodies may hold at once: ``max_http_body_bytes_per_principal``,
        or half of ``max_http_body_bytes_total`` (so another principal always finds the other
        half), at least one body at :attr:`http_body_limit`."""
        if self.max_http_body_bytes_per_principal is not None:
            return self.max_http_body_bytes_per_principal
        return max(self.max_http_body_bytes_total // 2, self.http_body_limit)

    def worker_threads(self) -> int:
        """TensorFlow threads per CPU worker: the cores shared out, so workers do not fight."""
        if self.threads_per_worker is not None:
            return self.threads_per_worker
        return max(1, (os.cpu_count() or 1) // max(1, self.num_worker))

    def public(self) -> dict[str, Any]:
        """The configuration as plain JSON values, for the CONFIG command."""
        data = dataclasses.asdict(self)
        data["api_key"] = "(set)" if self.api_key is not None else None  # never the key itself
        data["api_keys"] = "(set)" if self.api_keys is not None else None
        model = data.pop("model")
        model["pooling_strategy"] = self.model.pooling_strategy.value if self.model.pooling_strategy else None
        return {**data, **{f"model_{k}" if k in data else k: v for k, v in model.items()}}
