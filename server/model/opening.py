"""The model a directory holds, opened for this process: a static model (:mod:`.static`),
numpy only; a late-interaction model (BGE-M3, ColBERT: :mod:`.late`), several outputs from one
run; or else the TensorFlow :class:`~.encoder.Encoder`. The worker and ``bertserve embed`` open
theirs here, so a directory is served the same way wherever it is opened."""

from __future__ import annotations

from typing import Any

from ..config.model import ModelConfig
from .static import StaticEncoder, is_static_model
from .tasks import late_kind


def needs_tensorflow(config: ModelConfig) -> bool:
    """Whether the model of ``config`` runs on TensorFlow (a static model does not)."""
    return not is_static_model(config.model_dir)


def open_model(config: ModelConfig, *, verbose: bool | None = None) -> Any:
    """A :class:`StaticEncoder` for a static model, a ``LateModel`` for a late-interaction
    one, else an ``Encoder`` (TensorFlow is imported only for these two); each has the
    :class:`~.interface.Model` methods."""
    if not needs_tensorflow(config):
        return StaticEncoder(config)
    if late_kind(config.model_dir):
        from .late import LateModel

        return LateModel(config)
    from .encoder import Encoder

    return Encoder(config, verbose=verbose)
