"""Reading a model's weights, once its directory is checked (:mod:`.model_dir`): a Google
checkpoint or safetensors files, with a fine-tuned checkpoint applied last.

Weights come out under Google's names (``bert/encoder/layer_0/attention/self/query/kernel``)
with dense kernels laid out ``[in, out]``, whatever the layout they came from, and are checked
against the shapes the config implies.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import numpy as np

from ..errors import ModelFileError, ModelShapeError
from .model_dir import BertConfig, ModelFiles

logger = logging.getLogger("bertserve.model")


def read_weights(model: ModelFiles) -> dict[str, np.ndarray]:
    """Read every weight source in order (a fine-tuned checkpoint last) and check the shapes."""
    weights = _read_sources(model.weight_sources)
    if model.tuned_sources:
        tuned = _read_sources(model.tuned_sources)
        if not set(tuned) & set(weights):
            where = model.tuned_sources[0][1]
            raise ModelFileError(f"the fine-tuned checkpoint {where} has no BERT weights to apply")
        logger.info("%d tensors come from the fine-tuned checkpoint", len(tuned))
        weights.update(tuned)
    _check_shapes(model, weights)
    return weights


def _read_sources(sources: list[tuple[str, str]]) -> dict[str, np.ndarray]:
    weights: dict[str, np.ndarray] = {}
    for kind, path in sources:
        weights.update(_read_checkpoint(path) if kind == "checkpoint" else _read_safetensors([path]))
    return weights


def _read_checkpoint(prefix: str) -> dict[str, np.ndarray]:
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(prefix)
        names = reader.get_variable_to_shape_map()
        return {
            name: np.asarray(reader.get_tensor(name))
            for name in names
            if name.startswith("bert/") and not re.search(r"/adam_[mv]$|_slot_", name)
        }
    except (tf.errors.OpError, ValueError) as exc:
        raise ModelFileError(f"cannot read checkpoint {prefix}: {exc}") from exc


def _read_safetensors(paths: Iterable[str]) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    weights: dict[str, np.ndarray] = {}
    for path in paths:
        try:
            raw = load_file(path)
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelFileError(f"cannot read {path}: {exc}") from exc
        for name, value in raw.items():
            google = _hf_to_google(name)
            if google is not None:
                weights[google] = value.T if google.endswith("/kernel") else value
    return weights


_PREFIX = r"^(?:bert\.)?"
_LAYER = _PREFIX + r"encoder\.layer\.(\d+)\.(.+)"
_HF_RENAMES = [
    (_PREFIX + r"embeddings\.(\w+)_embeddings\.weight$", r"bert/embeddings/\1_embeddings"),
    (_PREFIX + r"embeddings\.LayerNorm\.(weight|gamma)$", "bert/embeddings/LayerNorm/gamma"),
    (_PREFIX + r"embeddings\.LayerNorm\.(bias|beta)$", "bert/embeddings/LayerNorm/beta"),
    (_LAYER + r"\.LayerNorm\.(weight|gamma)$", r"bert/encoder/layer_\1/\2/LayerNorm/gamma"),
    (_LAYER + r"\.LayerNorm\.(bias|beta)$", r"bert/encoder/layer_\1/\2/LayerNorm/beta"),
    (_LAYER + r"\.weight$", r"bert/encoder/layer_\1/\2/kernel"),
    (_LAYER + r"\.bias$", r"bert/encoder/layer_\1/\2/bias"),
    (_PREFIX + r"pooler\.dense\.weight$", "bert/pooler/dense/kernel"),
    (_PREFIX + r"pooler\.dense\.bias$", "bert/pooler/dense/bias"),
]


def _hf_to_google(name: str) -> str | None:
    for pattern, replacement in _HF_RENAMES:
        google, count = re.subn(pattern, replacement, name)
        if count:
            return google.replace(".", "/")
    return None


# -- checks ------------------------------------------------------------------------------


def _expected_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
    h, i = config.hidden_size, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "bert/embeddings/word_embeddings": (config.vocab_size, h),
        "bert/embeddings/position_embeddings": (config.max_position_embeddings, h),
        "bert/embeddings/token_type_embeddings": (config.type_vocab_size, h),
        "bert/embeddings/LayerNorm/gamma": (h,),
        "bert/embeddings/LayerNorm/beta": (h,),
    }
    for n in range(config.num_hidden_layers):
        layer = f"bert/encoder/layer_{n}/"
        for name in ("query", "key", "value"):
            shapes[f"{layer}attention/self/{name}/kernel"] = (h, h)
            shapes[f"{layer}attention/self/{name}/bias"] = (h,)
        shapes[f"{layer}attention/output/dense/kernel"] = (h, h)
        shapes[f"{layer}attention/output/dense/bias"] = (h,)
        shapes[f"{layer}intermediate/dense/kernel"] = (h, i)
        shapes[f"{layer}intermediate/dense/bias"] = (i,)
        shapes[f"{layer}output/dense/kernel"] = (i, h)
        shapes[f"{layer}output/dense/bias"] = (h,)
        for block in ("attention/output", "output"):
            shapes[f"{layer}{block}/LayerNorm/gamma"] = (h,)
            shapes[f"{layer}{block}/LayerNorm/beta"] = (h,)
    return shapes


def _check_shapes(model: ModelFiles, weights: dict[str, np.ndarray]) -> None:
    expected = _expected_shapes(model.config)
    if "bert/pooler/dense/kernel" in weights:
        h = model.config.hidden_size
        expected["bert/pooler/dense/kernel"] = (h, h)
        expected["bert/pooler/dense/bias"] = (h,)
    missing = sorted(set(expected) - set(weights))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelShapeError(
            f"the {model.layout} weights lack {', '.join(missing[:3])}{more} "
            f"(config says {model.config.num_hidden_layers} layers)"
        )
    for name, shape in expected.items():
        actual = tuple(weights[name].shape)
        if actual != shape:
            raise ModelShapeError(f"weight {name} has shape {actual}, but the config implies {shape}")
        if weights[name].dtype != np.float32:
            weights[name] = weights[name].astype(np.float32)
    for name in set(weights) - set(expected):
        del weights[name]
