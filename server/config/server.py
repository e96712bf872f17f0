"""The server's options: processes, ports, batching, devices, limits, security and HTTP."""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from . import http as http_limits
from .batching import Batching
from .limits import QUEUED_BYTES, REPLY_BYTES, REQUEST_TOKENS, Limits
from .model import ModelConfig
from .ports import Ports
from .specs import check_models
from .stopping import STOP_TIMEOUT_SECONDS, StopBudget

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

    Built once by the CLI (or by tests), with one keyword a flag. The options of one concern
    are built, checked and resolved once into a frozen object of their own, which a policy
    is given instead of the whole config: :attr:`ports` (:class:`.ports.Ports`, ``port_out``
    following ``port``), :attr:`batching` (:class:`.batching.Batching`, the scheduler's),
    :attr:`limits` (:class:`.limits.Limits`, the head's bounds, those left out following those
    given); the HTTP edge's rules are :mod:`.http`'s. Once built, ``port_out`` is always an int. With several models
    (``models`` or ``models_dir``), the CLI makes ``model`` the default model's options
    (:func:`.served.with_default_model`), and :func:`.served.served_models` gives each model
    a config of its own. The version a model serves once a swap has run is the head's state
    (:class:`..serving.head.models.HeadModel`), not a field here.
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
    max_queued_sentences: int | None = None  # None: QUEUED_SENTENCES, at least the two below (.limits)
    max_client_queued_sentences: int | None = None  # None: CLIENT_QUEUED_SENTENCES, within the two around it
    max_queued_bytes: int = QUEUED_BYTES
    max_message_bytes: int | None = None
    max_request_tokens: int = REQUEST_TOKENS  # most tokens of model work in one HTTP request, counted before work
    max_reply_bytes: int = REPLY_BYTES  # largest answer, counted before work (.limits)
    reply_hwm: int = 100
    job_timeout_ms: int = 120_000
    heartbeat_timeout_ms: int = 10_000
    max_restarts: int = 5
    stop_timeout: float = STOP_TIMEOUT_SECONDS  # the whole stop, from the signal to the exit (.stopping)
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
    cors_allow_origin: tuple[str, ...] = ()  # origins whose pages may call the HTTP API (CORS)
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
    auto_truncate: bool = False  # HTTP: cut an over-long input where the request does not say (TEI's flag)
    models: tuple[str, ...] = ()  # NAME=DIR[,key=value,...]: several models, each in served_models.py's terms
    models_dir: str | None = None  # several models: one subfolder each, named by the folder
    default_model: str | None = None  # the model a request gets unless it names one (None: the first)
    task_defaults: tuple[str, ...] = ()  # TASK=NAME: the model a request of that task gets unless it names one
    model_defaults: ModelConfig | None = None  # with models or models_dir: the model flags, under each model's own

    def __post_init__(self) -> None:
        if not (self.num_worker >= 1 or (self.num_worker == 0 and self.worker_port is not None)):
            raise ConfigError(
                "num_worker must be at least 1 (0 only with worker_port, for a head whose workers join remotely)"
            )
        # Each concern is built, so checked, once: the HTTP body limits are checked against the frame limit.
        ports, limits, _, _ = self.ports, self.limits, self.batching, self.stop_budget
        checks = [
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
            *http_limits.http_limit_checks(self, limits.message_bytes),
            (self.prefetch_size >= 1, "prefetch_size must be at least 1"),
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
        # What was given as another type (a path, a list, a number) is kept as the fields say.
        object.__setattr__(self, "models", tuple(str(spec) for spec in self.models))
        if self.models_dir is not None:
            object.__setattr__(self, "models_dir", os.fspath(self.models_dir))
        object.__setattr__(self, "port_out", ports.out)
        object.__setattr__(self, "device_map", tuple(int(d) for d in self.device_map))
        object.__setattr__(self, "model_alias", tuple(str(a) for a in self.model_alias))
        object.__setattr__(self, "task_defaults", tuple(str(item) for item in self.task_defaults))
        object.__setattr__(self, "forwarded_allow_ips", http_limits.forwarded_allow_ips(self.forwarded_allow_ips))
        object.__setattr__(self, "cors_allow_origin", http_limits.cors_origins(self.cors_allow_origin))
        if self.curve_dir is not None:
            object.__setattr__(self, "curve_dir", os.fspath(self.curve_dir))
        object.__setattr__(self, "model_version", str(self.model_version).lower())

    @functools.cached_property
    def stop_budget(self) -> StopBudget:
        """The whole stop and its stages' shares (:class:`.stopping.StopBudget`)."""
        return StopBudget(self.stop_timeout)

    @functools.cached_property
    def ports(self) -> Ports:
        """Where the server listens, ``port_out`` following ``port`` (:meth:`.ports.Ports.resolve`)."""
        return Ports.resolve(
            port=self.port,
            port_out=self.port_out,
            http_port=self.http_port,
            metrics_port=self.metrics_port,
            worker_port=self.worker_port,
        )

    @functools.cached_property
    def limits(self) -> Limits:
        """The head's bounds, those left out following those given (:meth:`.limits.Limits.resolve`)."""
        return Limits.resolve(
            max_queued_sentences=self.max_queued_sentences,
            max_client_queued_sentences=self.max_client_queued_sentences,
            max_request_size=self.max_request_size,
            max_queued_bytes=self.max_queued_bytes,
            max_message_bytes=self.max_message_bytes,
            max_text_chars=self.max_text_chars,
            request_timeout_ms=self.request_timeout_ms,
            max_request_tokens=self.max_request_tokens,
            max_reply_bytes=self.max_reply_bytes,
        )

    @functools.cached_property
    def batching(self) -> Batching:
        """The scheduler's batching options, with this model's run size."""
        return Batching(
            max_batch_size=self.max_batch_size,
            max_batch_tokens=self.max_batch_tokens,
            max_latency_ms=self.max_latency_ms,
            merge_requests=self.merge_requests,
            bulk_run_ms=self.bulk_run_ms,
            bulk_slowdown=self.bulk_slowdown,
            model_batch_size=self.model.batch_size,
        )

    @property
    def queue_limit(self) -> int:
        """Most inputs queued at once, all clients together (``max_queued_sentences``, resolved)."""
        return self.limits.queued_sentences

    @property
    def client_queue_limit(self) -> int:
        """Most inputs one client may have queued (``max_client_queued_sentences``, resolved)."""
        return self.limits.client_queued_sentences

    @property
    def request_size_limit(self) -> int:
        """Most inputs in one request (``max_request_size``, resolved)."""
        return self.limits.request_size

    @property
    def version_number(self) -> int | None:
        """The model version served, once a repository's version is chosen; else None."""
        return int(self.model_version) if str(self.model_version).isdigit() else None

    @property
    def message_limit(self) -> int:
        """Largest frame the request socket accepts (ZeroMQ's MAXMSGSIZE): ``max_message_bytes``,
        or what the largest allowed request can take as UTF-8 JSON, at most
        :data:`.limits.MESSAGE_BYTES` and ``max_queued_bytes``."""
        return self.limits.message_bytes

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
        limits = self.limits  # the sentence bounds as resolved, not as given
        data.update(
            max_queued_sentences=limits.queued_sentences,
            max_client_queued_sentences=limits.client_queued_sentences,
            max_request_size=limits.request_size,
        )
        data["api_key"] = "(set)" if self.api_key is not None else None  # never the key itself
        data["api_keys"] = "(set)" if self.api_keys is not None else None
        model = data.pop("model")
        model["pooling_strategy"] = self.model.pooling_strategy.value if self.model.pooling_strategy else None
        return {**data, **{f"model_{k}" if k in data else k: v for k, v in model.items()}}
