"""The bertserve server side: the model core (``Encoder``) and, later, the serving roles.

Importing this package does not import TensorFlow; ``Encoder`` loads it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import ModelConfig, PoolingStrategy
from .errors import BertServeError, ModelError, ModelFileError, ModelShapeError

if TYPE_CHECKING:
    from .encoder import Encoder

__all__ = [
    "BertServeError",
    "Encoder",
    "ModelConfig",
    "ModelError",
    "ModelFileError",
    "ModelShapeError",
    "PoolingStrategy",
]


def __getattr__(name: str) -> Any:
    if name == "Encoder":
        from .encoder import Encoder

        return Encoder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
