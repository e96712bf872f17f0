"""The BERT forward pass in plain TensorFlow ops, over weights prepared for it: Q, K and V
fused into one matrix, the matrices stored in the compute dtype. :mod:`.graph` builds it into
a frozen graph; embeddings sums, softmax, layer norm, residuals and pooling accumulate in fp32.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..config.model import PoolingStrategy
from ..errors import ModelError

if TYPE_CHECKING:
    from .model_dir import BertConfig


class ForwardSpec(Protocol):
    """What the forward pass computes (:class:`.graph.GraphSpec` is one)."""

    @property
    def pooling_strategy(self) -> PoolingStrategy: ...
    @property
    def pooling_layer(self) -> tuple[int, ...]: ...
    @property
    def mask_cls_sep(self) -> bool: ...
    @property
    def normalize(self) -> bool: ...
    @property
    def dtype(self) -> str: ...
    @property
    def output_dtype(self) -> str: ...


def prepare_weights(weights: dict[str, np.ndarray], config: BertConfig, spec: ForwardSpec) -> dict[str, np.ndarray]:
    """Fuse Q, K and V into one matrix (with the query pre-scaled) and store the matrices
    in the compute dtype."""
    compute = _numpy_dtype(spec.dtype)
    head_dim = config.hidden_size // config.num_attention_heads
    scale = 1.0 / math.sqrt(head_dim)
    out: dict[str, np.ndarray] = {}
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        out[f"embeddings/{name}"] = weights[f"bert/embeddings/{name}"].astype(compute)
    out["embeddings/ln_gamma"] = weights["bert/embeddings/LayerNorm/gamma"]
    out["embeddings/ln_beta"] = weights["bert/embeddings/LayerNorm/beta"]
    for n in range(config.num_hidden_layers):
        src = f"bert/encoder/layer_{n}/"
        dst = f"layer_{n}/"
        q, k, v = (weights[f"{src}attention/self/{x}/kernel"] for x in ("query", "key", "value"))
        qb, kb, vb = (weights[f"{src}attention/self/{x}/bias"] for x in ("query", "key", "value"))
        out[dst + "qkv/kernel"] = np.concatenate([q * scale, k, v], axis=1).astype(compute)
        out[dst + "qkv/bias"] = np.concatenate([qb * scale, kb, vb]).astype(compute)
        for block, name in (
            ("attention/output/dense", "attn_out"),
            ("intermediate/dense", "ffn_in"),
            ("output/dense", "ffn_out"),
        ):
            out[f"{dst}{name}/kernel"] = weights[f"{src}{block}/kernel"].astype(compute)
            out[f"{dst}{name}/bias"] = weights[f"{src}{block}/bias"].astype(compute)
        for block, name in (("attention/output", "attn_ln"), ("output", "ffn_ln")):
            out[f"{dst}{name}/gamma"] = weights[f"{src}{block}/LayerNorm/gamma"]
            out[f"{dst}{name}/beta"] = weights[f"{src}{block}/LayerNorm/beta"]
    if spec.pooling_strategy is PoolingStrategy.CLS_POOLED and "bert/pooler/dense/kernel" not in weights:
        raise ModelError("CLS_POOLED needs the pooler weights, and this model has none")
    if "bert/pooler/dense/kernel" in weights:
        out["pooler/kernel"] = weights["bert/pooler/dense/kernel"].astype(compute)
        out["pooler/bias"] = weights["bert/pooler/dense/bias"]
    return out


def _numpy_dtype(dtype: str) -> np.dtype:
    if dtype == "bf16":
        import tensorflow as tf

        return tf.bfloat16.as_numpy_dtype
    return np.dtype({"fp32": np.float32, "fp16": np.float16, "int8": np.float32}[dtype])


def forward(w: dict, config: BertConfig, spec: ForwardSpec, input_ids, input_mask, segment_ids):
    import tensorflow as tf

    # int8's graph is fp32: its LiteRT form (see .int8) holds the int8 weights.
    compute = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16, "int8": tf.float32}[spec.dtype]
    f32 = tf.float32
    batch, length = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = hidden // heads
    eps = config.layer_norm_eps

    def layer_norm(x, gamma, beta):
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + eps) * gamma + beta

    def dense(x, prefix):
        """x in the compute dtype, [tokens, in] -> [tokens, out] in the compute dtype."""
        return tf.nn.bias_add(tf.matmul(x, w[prefix + "/kernel"]), w[prefix + "/bias"])

    def activation(x):
        act = config.hidden_act
        if act == "relu":
            return tf.nn.relu(x)
        return tf.nn.gelu(x, approximate=act != "gelu")

    embeddings = (
        tf.cast(tf.gather(w["embeddings/word_embeddings"], input_ids), f32)
        + tf.cast(tf.gather(w["embeddings/token_type_embeddings"], segment_ids), f32)
        + tf.cast(w["embeddings/position_embeddings"][:length], f32)[None]
    )
    x = layer_norm(embeddings, w["embeddings/ln_gamma"], w["embeddings/ln_beta"])
    x = tf.reshape(x, [-1, hidden])  # [batch * length, hidden], fp32 residual stream

    mask = tf.cast(input_mask, f32)
    attention_bias = tf.reshape((1.0 - mask) * -1e9, [batch, 1, 1, length])

    def split_heads(t):
        return tf.transpose(tf.reshape(t, [batch, length, heads, head_dim]), [0, 2, 1, 3])

    def _encoder_layer(x, p):
        qkv = dense(tf.cast(x, compute), p + "qkv")
        q, k, v = (split_heads(t) for t in tf.split(qkv, 3, axis=-1))
        scores = tf.cast(tf.matmul(q, k, transpose_b=True), f32) + attention_bias
        probs = tf.cast(tf.nn.softmax(scores, axis=-1), compute)
        context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [-1, hidden])
        attn = tf.cast(dense(context, p + "attn_out"), f32)
        x = layer_norm(attn + x, w[p + "attn_ln/gamma"], w[p + "attn_ln/beta"])
        inner = activation(dense(tf.cast(x, compute), p + "ffn_in"))
        ffn = tf.cast(dense(inner, p + "ffn_out"), f32)
        return layer_norm(ffn + x, w[p + "ffn_ln/gamma"], w[p + "ffn_ln/beta"])

    layers = []
    for n in range(config.num_hidden_layers):
        with tf.name_scope(f"layer_{n}"):
            x = _encoder_layer(x, f"layer_{n}/")
        layers.append(tf.reshape(x, [batch, length, hidden]))

    lengths = tf.reduce_sum(input_mask, axis=1)
    pool_mask = mask
    if spec.mask_cls_sep:
        positions = tf.range(length)[None, :]
        keep = (positions > 0) & (positions < (lengths - 1)[:, None])
        pool_mask = mask * tf.cast(keep, f32)

    if spec.pooling_strategy is PoolingStrategy.CLS_POOLED:
        cls = tf.cast(layers[-1][:, 0], compute)
        out = tf.tanh(tf.cast(tf.matmul(cls, w["pooler/kernel"]), f32) + w["pooler/bias"])
    else:
        pooled = [_pool(layers[i], spec.pooling_strategy, pool_mask, lengths) for i in spec.pooling_layer]
        out = pooled[0] if len(pooled) == 1 else tf.concat(pooled, axis=-1)
    if spec.normalize:
        out = tf.math.l2_normalize(out, axis=-1, epsilon=1e-12)
    return tf.cast(out, tf.float16 if spec.output_dtype == "float16" else f32)


def _pool(h, strategy: PoolingStrategy, pool_mask, lengths):
    """One layer's hidden states ``h`` [batch, length, hidden] pooled by ``strategy``."""
    import tensorflow as tf

    m = tf.expand_dims(pool_mask, -1)
    count = tf.reduce_sum(m, axis=1)
    if strategy is PoolingStrategy.NONE:
        return h * m
    if strategy is PoolingStrategy.CLS_TOKEN:
        return h[:, 0]
    if strategy is PoolingStrategy.SEP_TOKEN:
        return tf.gather(h, lengths - 1, batch_dims=1)
    mean = tf.reduce_sum(h * m, axis=1) / tf.maximum(count, 1.0)
    maximum = tf.reduce_max(h - (1.0 - m) * 1e30, axis=1) * tf.cast(count > 0, tf.float32)
    if strategy is PoolingStrategy.REDUCE_MEAN:
        return mean
    if strategy is PoolingStrategy.REDUCE_MAX:
        return maximum
    return tf.concat([mean, maximum], axis=-1)
