"""The decoder-shaped families' ``config.json`` (:mod:`.decoder` runs them): Qwen3 and Gemma3's text
model (EmbeddingGemma). What these configs can say that the forward pass does not compute (a
sliding window on Qwen3, rope scaling, logit soft-capping) is refused by name.
"""

from __future__ import annotations

from typing import Any

from ..errors import ModelError, ModelFileError, ModelShapeError
from .config_values import LIMITS, float_key, int_key


def qwen3_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    if raw.get("use_sliding_window"):
        raise ModelError(f"{path}: use_sliding_window is true; bertserve runs Qwen3 with full attention only")
    layers = int(raw["num_hidden_layers"])
    layer_types = raw.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or set(layer_types) != {"full_attention"}):
        raise ModelError(f"{path}: layer_types {layer_types!r}: bertserve runs Qwen3 with full attention only")
    theta = _theta(path, raw, "full_attention", "rope_theta", 10_000.0)
    return {
        **_attention_heads(path, raw),
        "layer_norm_eps": float_key(path, raw, "rms_norm_eps", 1e-6),
        "layer_windows": (0,) * layers,
        "rope_theta_global": theta,
        "rope_theta_local": theta,
        "causal": True,
    }


def gemma3_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Gemma3's text model: EmbeddingGemma's bidirectional attention (``use_bidirectional_attention``)
    or the language model's causal one, each layer whole or in a window (``layer_types``, else
    every ``sliding_window_pattern``-th layer whole)."""
    layers = int(raw["num_hidden_layers"])
    for key in ("attn_logit_softcapping",):
        if raw.get(key) is not None:
            raise ModelError(f"{path}: {key} {raw[key]!r} is not supported (bertserve caps no attention scores)")
    layer_types = raw.get("layer_types")
    if layer_types is None:
        pattern = int_key(path, raw, "sliding_window_pattern", 6)
        layer_types = [
            "full_attention" if (i + 1) % max(pattern, 1) == 0 else "sliding_attention" for i in range(layers)
        ]
    kinds = ("sliding_attention", "full_attention")
    if not isinstance(layer_types, list) or len(layer_types) != layers or not set(layer_types) <= set(kinds):
        raise ModelFileError(f"{path}: layer_types should list {layers} of {' or '.join(kinds)}")
    window = int_key(path, raw, "sliding_window", 512)
    if not 2 <= window <= 1 << 21:
        raise ModelShapeError(f"{path}: sliding_window {window} is outside 2 to {1 << 21:,}")
    heads = _attention_heads(path, raw)
    scalar = float_key(path, raw, "query_pre_attn_scalar", float(heads["head_dim"]))
    if not scalar > 0:
        raise ModelFileError(f"{path}: query_pre_attn_scalar should be above 0, not {scalar}")
    bidirectional = bool(raw.get("use_bidirectional_attention", False))
    # A window layer's token sees those within half the window on either side, bidirectional
    # (transformers loads such a config's sliding_window as w // 2 + 1, seen when |i - j| < it),
    # else the window - 1 before it.
    reach = window // 2 if bidirectional else window - 1
    return {
        **heads,
        "layer_norm_eps": float_key(path, raw, "rms_norm_eps", 1e-6),
        "layer_windows": tuple(reach if kind == "sliding_attention" else 0 for kind in layer_types),
        "rope_theta_global": _theta(path, raw, "full_attention", "rope_theta", 1_000_000.0),
        "rope_theta_local": _theta(path, raw, "sliding_attention", "rope_local_base_freq", 10_000.0),
        "causal": not bidirectional,
        "attention_scale": scalar**-0.5,
        "embedding_scale": float(int(raw["hidden_size"]) ** 0.5),
        "norm_offset": 1.0,
        "post_norms": True,
    }


def _attention_heads(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Grouped-query attention's heads, each ``head_dim`` wide whatever the hidden size."""
    heads = int(raw["num_attention_heads"])
    kv_heads = int_key(path, raw, "num_key_value_heads", heads)
    head_dim = int_key(path, raw, "head_dim", int(raw["hidden_size"]) // heads)
    for key, value in (("num_key_value_heads", kv_heads), ("head_dim", head_dim)):
        if not 1 <= value <= LIMITS[key]:
            raise ModelShapeError(f"{path}: {key} {value} is outside 1 to {LIMITS[key]:,}")
    if heads % kv_heads:
        raise ModelShapeError(
            f"{path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    if head_dim % 2:
        raise ModelShapeError(f"{path}: head_dim {head_dim} is odd; rotary positions turn pairs of values")
    return {
        "type_vocab_size": 0,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "attention_bias": bool(raw.get("attention_bias", False)),
        "mlp_bias": False,
        "norm_bias": False,
    }


def _theta(path: str, raw: dict[str, Any], layer: str, key: str, default: float) -> float:
    """A rotary base: from ``rope_parameters`` (transformers 5's, whole or per layer type) or
    the older ``key``; any rotary scaling is refused."""
    declared = raw.get("rope_parameters")
    rope: dict[str, Any] = declared if isinstance(declared, dict) else {}
    if isinstance(rope.get(layer), dict):
        rope = rope[layer]
    scaling = raw.get("rope_scaling")
    kind = rope.get("rope_type", scaling.get("rope_type", "default") if isinstance(scaling, dict) else "default")
    if kind != "default" or (scaling is not None and not isinstance(scaling, dict)):
        raise ModelError(f"{path}: rope_type {kind!r} is not supported (only the default rotary positions)")
    theta = rope.get("rope_theta", raw.get(key, default))
    if not isinstance(theta, int | float) or isinstance(theta, bool) or not 1.0 < theta < 1e12:
        raise ModelFileError(f"{path}: {key} should be a number above 1, not {theta!r}")
    return float(theta)
