"""The worker link's handshake: which hosts may join the head, and what each is told.

A host's HELLO is refused if it speaks another link version, names a model the head does not
serve or has other model files than the head's, or if the head has :data:`MAX_HOSTS` hosts
joined; a host that joins is welcomed with the model options every worker of that model must
run (:func:`welcome_options`). The link (:mod:`.link`) keeps a :class:`Host` for each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bertserve.client import __version__

from ...config.model import FIELDS, SOURCE_FIELDS
from ...config.server import ServerConfig
from ..protocol import link_bodies as bodies, wire
from .models import HeadModel, Models

MAX_HOSTS = 1024
"""Most hosts joined at once; a HELLO past it is refused."""


@dataclass
class Host:
    routing_id: bytes
    hostname: str
    last_seen: float
    draining: bool = False
    workers: int = 1  # the most workers it may register (its HELLO's count)
    model: str = ""  # the served model its workers run
    clamped: bool = False  # told once that a worker of it asked for more credits than it gets


def welcome_options(config: ServerConfig) -> dict[str, Any]:
    """What a host needs from the head to run the head's model: its model options (the
    model directory and graph cache are the host's own) and model class."""
    model = {key: value for key, value in config.public().items() if key in _MODEL_FIELDS and key not in _HOSTS_OWN}
    return {
        "model": model,
        "model_class": config.serving.model_class,
        "tuned": config.model.tuned_model_dir is not None,
        "heartbeat_timeout_ms": config.workers.heartbeat_timeout_ms,
        "model_name": config.serving.served_model_name,  # what its workers' logs and spans call the model
    }


_MODEL_FIELDS = frozenset(FIELDS)
_HOSTS_OWN = frozenset({"model_dir", "tuned_model_dir", "graph_dir", "device", "calibration", *SOURCE_FIELDS})
"""The model fields that name something of the machine a process runs on: a host has its own."""


def as_served(ready: bodies.Ready, served: HeadModel, hostname: str) -> bodies.Ready:
    """A remote worker's READY as the head registers it: its files are the head's (checked
    at HELLO), wherever they are on its host, so it runs the head's model version (a head
    with a link never swaps)."""
    model = ready.model
    if model is not None:
        model = model.model_copy(update={"model_dir": served.config.model.model_dir})
    update = {
        "hostname": ready.hostname or hostname,
        "version": served.version,
        "model": model,
        "model_name": served.name,
    }
    return ready.model_copy(update=update)


def refusal(hello: bodies.Hello, models: Models, *, joined: int, known: bool) -> str | None:
    """Why a host's HELLO is refused (``joined``: hosts joined now; ``known``: this one is
    among them); ``None``: it may join."""
    if hello.link != wire.LINK_VERSION:
        return (
            f"the worker speaks link version {hello.link} (bertserve {hello.version}); this head "
            f"speaks {wire.LINK_VERSION} (bertserve {__version__}): run the same bertserve version on both"
        )
    served = models.get(hello.model_name)
    if served is None:
        return f"{models.unknown(hello.model_name)}: start the worker with --model NAME, one of those"
    if hello.model_sha256 != served.sha256:
        version = "" if served.version is None else f", version {served.version} of its repository"
        return (
            f"the worker's model files (sha256 {bodies.printable(hello.model_sha256, 16)}...) differ from those "
            f"of the head's model {served.name}{version} (sha256 {served.sha256[:16]}...): give the worker the same "
            f"model directory as the head (--model-dir"
            f"{' and --tuned-model-dir' if served.config.model.tuned_model_dir else ''}"
            f"{f'; from a store: --model-version {served.version}' if served.version is not None else ''})"
        )
    if not known and joined >= MAX_HOSTS:
        return f"this head has {joined} hosts joined, the most it takes"
    return None
