"""The server's options, built from its parts: ports, workers, batching, limits, HTTP, security,
bert-as-service's clients, and the models served."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .batching import Batching
from .grpc import Grpc
from .http import HTTP_BODY_BYTES, HTTP_BODY_BYTES_TOTAL, Http
from .limits import Limits
from .model import ModelConfig
from .ports import Ports
from .security import Legacy, Security
from .served import ModelServing, Routing
from .specs import check_default
from .stopping import StopBudget
from .workers import HEARTBEAT_INTERVAL_MS, Workers

__all__ = ["HEARTBEAT_INTERVAL_MS", "HTTP_BODY_BYTES", "HTTP_BODY_BYTES_TOTAL", "ServerConfig"]


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """How ``bertserve start`` serves, one part a concern, each built and checked once by the
    CLI (or by tests, through :func:`..testing.config.server_config`): where it listens
    (:class:`.ports.Ports`), its workers (:class:`.workers.Workers`), how the scheduler batches
    (:class:`.batching.Batching`), the head's bounds (:class:`.limits.Limits`), the HTTP front
    end (:class:`.http.Http`) and the gRPC one (:class:`.grpc.Grpc`), who may use it
    (:class:`.security.Security`), bert-as-service's clients (:class:`.security.Legacy`), and
    each model served (:class:`.served.ModelServing`), with which one a request gets unless it
    names one (:class:`.served.Routing`). A policy is given the part it uses, not the whole
    config. What needs two parts is checked here.

    A role that serves one model is given the config of that model alone (:meth:`serving_of`):
    the same parts, its one model in :attr:`models`.
    """

    models: tuple[ModelServing, ...]
    ports: Ports = dataclasses.field(default_factory=Ports)
    workers: Workers = dataclasses.field(default_factory=Workers)
    batching: Batching = dataclasses.field(default_factory=Batching)
    limits: Limits = dataclasses.field(default_factory=Limits)
    http: Http = dataclasses.field(default_factory=Http)
    grpc: Grpc = dataclasses.field(default_factory=Grpc)
    security: Security = dataclasses.field(default_factory=Security)
    legacy: Legacy = dataclasses.field(default_factory=Legacy)
    routing: Routing = dataclasses.field(default_factory=Routing)

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models))
        if not self.models:
            raise ConfigError("a server serves at least one model")
        remote = self.ports.worker_port is not None
        for count, name in [(self.workers.num_worker, None), *((m.num_worker, m.name) for m in self.models)]:
            if not (count >= 1 or (count == 0 and remote)):
                where = f"--model {name}: " if name is not None and self.routing.models else ""
                raise ConfigError(
                    f"{where}num_worker must be at least 1 (0 only with worker_port, for a head whose workers join "
                    "remotely)"
                )
        checks = [
            (
                self.security.curve_dir is None or self.ports.http_port is None or self.security.http_keyed,
                "with curve_dir, serving HTTP needs api_key (or api_keys) too: else HTTP would serve "
                "anyone CURVE keeps out",
            ),
            (
                self.security.curve_dir is None or self.ports.grpc_port is None or self.security.http_keyed,
                "with curve_dir, serving gRPC needs api_key (or api_keys) too: else gRPC would serve "
                "anyone CURVE keeps out",
            ),
            *self.http.body_checks(self.limits.message_bytes),
        ]
        for ok, problem in checks:
            if not ok:
                raise ConfigError(problem)
        # The scheduler's runs are its model's (the default model's, in the head's config).
        object.__setattr__(
            self, "batching", dataclasses.replace(self.batching, model_batch_size=self.serving.model.batch_size)
        )
        names = [model.name for model in self.models]
        if len(set(names)) != len(names):
            raise ConfigError(f"two served models have the same name: {', '.join(names)}")
        check_default(self.routing.default_model, names)

    def num_workers(self) -> list[int]:
        """Each model's local workers."""
        return [model.num_worker for model in self.models]

    @property
    def serving(self) -> ModelServing:
        """The default model: ``--default-model``, else the first; a role's config's one model."""
        name = self.routing.default_model
        return next((model for model in self.models if model.name == name), self.models[0])

    @property
    def model(self) -> ModelConfig:
        """The default model's options (:class:`.model.ModelConfig`)."""
        return self.serving.model

    @property
    def default_name(self) -> str:
        """The name of the model a request gets unless it names one."""
        return self.serving.name

    @property
    def stop_budget(self) -> StopBudget:
        """The whole stop and its stages' shares (:class:`.stopping.StopBudget`)."""
        return self.workers.stop_budget

    @property
    def message_limit(self) -> int:
        """Largest frame the request socket accepts (:attr:`.limits.Limits.message_bytes`)."""
        return self.limits.message_bytes

    @property
    def http_body_limit(self) -> int:
        """Largest HTTP request body (:meth:`.http.Http.body_limit`)."""
        return self.http.body_limit(self.message_limit)

    @property
    def http_principal_body_limit(self) -> int:
        """What one HTTP principal's bodies may hold at once (:meth:`.http.Http.principal_body_limit`)."""
        return self.http.principal_body_limit(self.message_limit)

    def serving_of(self, model: ModelServing) -> ServerConfig:
        """The config a role serving ``model`` alone is given: these parts, ``model`` the one model,
        named (``served_model_name`` its :attr:`.served.ModelServing.name`)."""
        return dataclasses.replace(self, models=(model.replace(served_model_name=model.name),), routing=Routing())

    def in_dir(self, model_dir: str) -> ServerConfig:
        """The config of this config's model with its files in ``model_dir`` (a version of its
        repository), under the same name. Which version that is, is not the config's business:
        ``model_version`` stays what was asked."""
        serving = self.serving
        model = serving.model.replace(model_dir=model_dir)
        return self.serving_of(serving.replace(served_model_name=serving.name, model=model))

    def model_configs(self) -> list[ServerConfig]:
        """Each model's config (:meth:`serving_of`), in the order served; with several models the
        cores are shared out among all their local workers, unless ``threads_per_worker`` says
        how many each takes: each model's workers would otherwise take the machine's cores as if
        they were alone on it."""
        workers = sum(self.num_workers())
        if len(self.models) < 2 or workers < 1 or self.workers.threads_per_worker is not None:
            return [self.serving_of(model) for model in self.models]
        shared = dataclasses.replace(self.workers, threads_per_worker=max(1, (os.cpu_count() or 1) // workers))
        return [dataclasses.replace(self.serving_of(model), workers=shared) for model in self.models]

    def worker_threads(self) -> int:
        """TensorFlow threads per CPU worker of this config's model: the cores shared out among
        its workers, so they do not fight (:meth:`model_configs` shares them among several)."""
        if self.workers.threads_per_worker is not None:
            return self.workers.threads_per_worker
        return max(1, (os.cpu_count() or 1) // max(1, self.serving.num_worker))

    def public(self) -> dict[str, Any]:
        """The configuration as plain JSON values, for the CONFIG command: one key a flag, the
        default model's options among them (those named like a server's key as ``model_KEY``)."""
        serving = self.serving
        flags = self.routing.model_defaults or serving  # the flags of several models, else the one model's own
        data: dict[str, Any] = {
            "num_worker": self.workers.num_worker if self.routing.several else serving.num_worker,
            **_fields(self.ports),
            **_fields(self.batching, leave=("model_batch_size",)),
            **_fields(self.workers, leave=("num_worker",)),
            **_fields(self.limits),
            **_fields(self.security),
            **_fields(self.legacy),
            "http_port": self.ports.http_port,
            **_fields(self.http),
            **_fields(self.grpc),
            **_fields(flags, leave=("model",)),
            **_fields(self.routing, leave=("tasks", "model_defaults")),
            "model_defaults": flags.model.flat() if self.routing.model_defaults is not None else None,
        }
        data["api_key"] = "(set)" if self.security.api_key is not None else None  # never the key itself
        data["api_keys"] = "(set)" if self.security.api_keys is not None else None
        model = serving.model.flat()
        model["pooling_strategy"] = serving.model.pooling_strategy.value if serving.model.pooling_strategy else None
        return {**data, **{f"model_{k}" if k in data else k: v for k, v in model.items()}}


def _fields(part: Any, leave: tuple[str, ...] = ()) -> dict[str, Any]:
    """A part's fields as plain values (lists for tuples, as ``dataclasses.asdict`` gives)."""
    return {key: value for key, value in dataclasses.asdict(part).items() if key not in leave}
