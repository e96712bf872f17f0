"""Reading a ``config.json``'s values: integers and numbers checked by key, and the bounds on an
encoder's sizes, for every family's reader (:mod:`.families`, :mod:`.decoder_config`)."""

from __future__ import annotations

from typing import Any

from ..errors import ModelFileError

#: Bounds on a config's sizes, far above any encoder's (XLM-RoBERTa's vocabulary is 250,002,
#: ModernBERT's positions 8,192), so that a damaged or hostile config.json is refused before
#: anything is allocated for it.
LIMITS = {
    "vocab_size": 4_000_000,
    "hidden_size": 65_536,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "intermediate_size": 262_144,
    "max_position_embeddings": 1 << 20,
    "num_key_value_heads": 1024,
    "head_dim": 4096,
}


def int_key(path: str, raw: dict[str, Any], key: str, default: int) -> int:
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise ModelFileError(f"{path}: {key} should be an integer, not {value!r}")
    return value


def float_key(path: str, raw: dict[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ModelFileError(f"{path}: {key} should be a number, not {value!r}")
    return float(value)
