"""The bertserve server side: the model core (``Encoder``) and the serving roles.

Importing this package does not import TensorFlow; ``Encoder`` loads it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config.model import ModelConfig, PoolingStrategy
from .errors import BertServeError, ConfigError, ModelError, ModelFileError, ModelShapeError, StartupError

if TYPE_CHECKING:
    from .model.encoder import Encoder

__all__ = [
    "BertServeError",
    "ConfigError",
    "Encoder",
    "ModelConfig",
    "ModelError",
    "ModelFileError",
    "ModelShapeError",
    "PoolingStrategy",
    "StartupError",
]


def __getattr__(name: str) -> Any:
    if name == "Encoder":
        from .model.encoder import Encoder

        return Encoder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
