"""A server's config for a test or a benchmark, named by the flags it cares about:
``server_config("/m", port=6000, http_port=8080)`` builds each part of
:class:`..config.server.ServerConfig` from the names that are its fields (the ``bertserve start``
flags with ``-`` written ``_``) and resolves the models as the command line does
(:func:`..cli.served.resolve_models`); every other option keeps its default."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..cli.served import resolve_models
from ..config.model import ModelConfig
from ..config.served import ModelServing, Routing
from ..config.server import ServerConfig

_PARTS: dict[str, Any] = {
    field.name: field.default_factory
    for field in dataclasses.fields(ServerConfig)
    if field.name not in ("models", "routing")
}
"""Each part but the models, by its field: the class that builds it."""


def server_config(
    model_dir: str | os.PathLike[str] | None = None, *, model: ModelConfig | None = None, **named: Any
) -> ServerConfig:
    """The config of a server of ``model`` (else of a model in ``model_dir``), its options
    those ``named`` (``num_worker`` is the workers' and the model's, as its flag is), the rest
    their defaults. Raises ``TypeError`` for a name that is no option, and what the parts raise
    for a value they refuse."""
    if model is None:
        model = ModelConfig.of(model_dir=os.fspath(model_dir) if model_dir is not None else "unused")
    parts = {name: kind(**_take(named, kind, keep=("num_worker",))) for name, kind in _PARTS.items()}
    serving = ModelServing(model=model, **_take(named, ModelServing))
    routing = Routing(**_take(named, Routing))
    if named:
        raise TypeError(f"server_config() takes no option {', '.join(sorted(named))}")
    if routing.several:
        routing = dataclasses.replace(routing, model_defaults=serving)
    models, routing = resolve_models(serving, routing)
    return ServerConfig(models=models, routing=routing, **parts)


def _take(named: dict[str, Any], kind: Any, keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """The options in ``named`` that are fields of ``kind``, taken out of it but those in ``keep``."""
    fields = {field.name for field in dataclasses.fields(kind)} - {"model", "model_defaults", "tasks"}
    taken = {key: value for key, value in named.items() if key in fields}
    for key in taken:
        if key not in keep:
            del named[key]
    return taken
