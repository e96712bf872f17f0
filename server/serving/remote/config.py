"""How ``bertserve worker`` runs (:class:`HostConfig`): where the head is, this machine's
workers, and the configuration they run, made of the head's model options (its WELCOME) and
this machine's files.

The head's options are checked first: a WELCOME's file names (``vocab_name``,
``config_name``, ``ckpt_name``) must be plain relative names inside the model directory, and
a model class is imported only if this host's own ``--model-class`` names the same one: a
head alone never makes a host import code.

A head's ``--dtype auto`` reaches its hosts as ``auto``, and each worker resolves it for its
own device and CPU (``model/hardware.py``): a host whose CPU lacks bf16 instructions runs fp32
beside hosts that run bf16 (where bf16 would run slower), and their vectors differ no more
than the bf16 reference tests allow (a min cosine of 0.999 to fp32 on all-MiniLM-L6-v2).
Each worker's READY says the dtype it chose and why; a dtype the head names is run as named
on every host.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

from bertserve.client.protocol import MODEL_NAME_PATTERN

from ...config.model import ModelConfig
from ...config.served import ModelServing
from ...config.server import ServerConfig
from ...config.stopping import StopBudget
from ...config.workers import Workers
from ...errors import ConfigError
from ..protocol import link_bodies as bodies


@dataclass(frozen=True, kw_only=True)
class HostConfig:
    """How ``bertserve worker`` runs: where the head is, and this machine's workers. The
    model options come from the head; the files from ``model_dir`` here."""

    server: str
    worker_port: int
    model_dir: str
    tuned_model_dir: str | None = None
    model_name: str | None = None  # the head's model its workers join for (None: the head's default)
    graph_dir: str | None = None
    model_class: str | None = None  # the only model class this host may import: the head must name the same
    client_cert: str | None = None
    server_key: str | None = None
    health_port: int | None = None
    health_bind: str = "127.0.0.1"
    workers: Workers = dataclasses.field(default_factory=Workers)  # as `bertserve start` has them

    def __post_init__(self) -> None:
        checks = [
            (bool(self.server.strip()), "server must name the head's host"),
            (1 <= self.worker_port <= 65535, "worker_port must be between 1 and 65535"),
            (self.workers.num_worker >= 1, "num_worker must be at least 1"),
            (self.health_port is None or 1 <= self.health_port <= 65535, "health_port must be between 1 and 65535"),
            (
                (self.client_cert is None) == (self.server_key is None),
                "CURVE needs both client_cert (this worker's NAME.key_secret) and server_key (the head's public key)",
            ),
            (
                self.model_class is None or re.match(bodies.MODEL_CLASS_PATTERN, self.model_class) is not None,
                f"model_class must be written package.module:Name, not {self.model_class!r}",
            ),
            (
                self.model_name is None or re.fullmatch(MODEL_NAME_PATTERN, self.model_name) is not None,
                f"--model-name must be 1 to 128 of letters, digits and ._:/- (starting with a letter or digit), "
                f"not {self.model_name!r}",
            ),
        ]
        for ok, problem in checks:
            if not ok:
                raise ConfigError(problem)
        welcome = bodies.Welcome(model=bodies.WelcomeModel(), model_class=self.model_class, heartbeat_timeout_ms=10_000)
        self.server_config(welcome)  # the worker options, checked now

    @property
    def stop_budget(self) -> StopBudget:
        return self.workers.stop_budget

    @property
    def address(self) -> str:
        host = self.server.strip()
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 address
        return f"tcp://{host}:{self.worker_port}"

    def server_config(self, welcome: bodies.Welcome) -> ServerConfig:
        """The configuration this host's workers run: the head's model options, this
        machine's files, devices and process settings. Raises ``ConfigError`` if the head
        names a model class this host was not given, or a file outside its model directory."""
        if welcome.model_class != self.model_class:
            if welcome.model_class is None:
                raise ConfigError(
                    f"the head serves BERT from its model directory, but this worker was started with "
                    f"--model-class {self.model_class}: leave it out"
                )
            given = f"was started with --model-class {self.model_class}" if self.model_class else "was given none"
            raise ConfigError(
                f"the head serves the model class {welcome.model_class}, and this worker {given}: a worker imports "
                f"a model class only if its own command line names it; pass --model-class {welcome.model_class} "
                "if you trust that code"
            )
        options = welcome.model.options()
        for field in ("ckpt_name", "config_name", "vocab_name"):
            for directory in (self.model_dir, self.tuned_model_dir):
                if field in options and directory is not None and not _inside(directory, options[field]):
                    raise ConfigError(f"the head names {field} {options[field]!r}, which is not inside {directory}")
        model = ModelConfig.of(
            **options, model_dir=self.model_dir, tuned_model_dir=self.tuned_model_dir, graph_dir=self.graph_dir
        )
        serving = ModelServing(
            model=model,
            served_model_name=welcome.model_name,
            num_worker=self.workers.num_worker,
            model_class=self.model_class,
        )
        workers = dataclasses.replace(self.workers, heartbeat_timeout_ms=welcome.heartbeat_timeout_ms)
        return ServerConfig(models=(serving,), workers=workers)


def _inside(directory: str, name: str) -> bool:
    """Whether ``name`` joined to ``directory`` stays inside it (as written: links are not followed)."""
    base = os.path.normpath(os.path.abspath(directory))
    return os.path.normpath(os.path.join(base, name)).startswith(base.rstrip(os.sep) + os.sep)
