"""jina-embeddings-v3's LoRA task adapters, every adapter in one graph, one chosen per input.

Each product ``x @ W`` of an adapter ``t`` is ``x @ W + s * (x @ A_t^T) @ B_t^T`` (``s`` the
config's alpha / rank), and each embedding table's row ``E[i] + s * A_t[i] @ B_t``, as the
model's code computes them. The graph holds every adapter's factors side by side, A as
``[in, adapters * rank]`` and B as ``[adapters * rank, out]``: an input's rank-wide slice of
``x @ A`` is kept, the others zeroed, so one pair of thin products serves a batch whose rows
ask for different adapters (or none: all zeroed, the base weights).

Which adapter a row asks for comes in its segment ids (jina-embeddings-v3 has one token
type, so they say nothing else): 0 for none, ``t + 1`` for adapter ``t``, set by the worker
from the request's ``prompt_name`` (:mod:`..serving.worker.worker`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .families import EncoderConfig

ROLES = ("qkv", "attn_out", "ffn_in", "ffn_out")


def prepare(weights: dict[str, np.ndarray], config: EncoderConfig, compute: Any, q_scale: float) -> dict[str, Any]:
    """The adapters' factors laid out side by side, scaled (B by alpha / rank, and the query's
    columns of Q, K and V's by ``q_scale``, as its base weights are)."""
    if not config.adapters:
        return {}
    n, r, s = len(config.adapters), config.lora_rank, config.lora_scaling
    out: dict[str, Any] = {}
    for layer in range(config.num_hidden_layers):
        for role in ROLES:
            a, b = weights[f"lora/layer_{layer}/{role}/A"], weights[f"lora/layer_{layer}/{role}/B"]
            side_a = a.transpose(2, 0, 1).reshape(a.shape[2], n * r)  # [in, (t, r)]
            side_b = (b.transpose(0, 2, 1) * s).reshape(n * r, b.shape[1])  # [(t, r), out]
            if role == "qkv":
                side_b[:, : config.hidden_size] *= q_scale
            out[f"layer_{layer}/{role}/lora_a"] = side_a.astype(compute)
            out[f"layer_{layer}/{role}/lora_b"] = side_b.astype(compute)
    words_a, words_b = weights["lora/word_embeddings/A"], weights["lora/word_embeddings/B"]
    out["embeddings/lora_a"] = words_a.transpose(1, 0, 2).reshape(words_a.shape[1], n * r).astype(np.float32)
    out["embeddings/lora_b"] = (words_b * s).reshape(n * r, words_b.shape[2]).astype(np.float32)
    types_a, types_b = weights["lora/token_type_embeddings/A"], weights["lora/token_type_embeddings/B"]
    # the one token type's row, per adapter: [adapters, hidden]
    out["embeddings/type_lora"] = (np.einsum("nr,nrh->nh", types_a[:, 0, :], types_b) * s).astype(np.float32)
    return out


def chosen(config: EncoderConfig, segment_ids: Any) -> Any:
    """Each row's adapter, one-hot [batch, adapters] in fp32 (all zeros: none)."""
    import tensorflow as tf

    # compared, not tf.one_hot: LiteRT runs that as a table lookup, which an index of -1 fails
    return tf.cast(tf.equal(segment_ids[:, :1] - 1, tf.range(len(config.adapters))[None, :]), tf.float32)


def kept(config: EncoderConfig, one_hot: Any, length: Any, dtype: Any) -> Any:
    """Which columns of ``x @ A`` each token keeps: [batch * length, adapters * rank]."""
    import tensorflow as tf

    columns = tf.repeat(one_hot, config.lora_rank, axis=1)
    rows = tf.reshape(tf.tile(columns[:, None, :], [1, length, 1]), [-1, len(config.adapters) * config.lora_rank])
    return tf.cast(rows, dtype)


def embedding_delta(w: dict, config: EncoderConfig, input_ids: Any, one_hot: Any) -> Any:
    """What each row's adapter adds to its word and token type embeddings, [batch, length, hidden] fp32."""
    import tensorflow as tf

    columns = tf.repeat(one_hot, config.lora_rank, axis=1)[:, None, :]  # [batch, 1, (t, r)]
    words = tf.einsum("blk,kh->blh", tf.gather(w["embeddings/lora_a"], input_ids) * columns, w["embeddings/lora_b"])
    return words + tf.matmul(one_hot, w["embeddings/type_lora"])[:, None, :]


def product_delta(w: dict, prefix: str, x: Any, keep: Any) -> Any:
    """What the tokens' adapters add to the product ``prefix`` of ``x`` [tokens, in]."""
    import tensorflow as tf

    return tf.matmul(tf.matmul(x, w[prefix + "/lora_a"]) * keep, w[prefix + "/lora_b"])
