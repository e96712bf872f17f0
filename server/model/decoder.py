"""The decoder-shaped families as embedders, in plain TensorFlow ops, each run once over the
whole input with no key-value cache: Qwen3 (Qwen3-Embedding, Qwen3-Reranker) and Gemma3's
text model (EmbeddingGemma).

Both are pre-norm stacks with RMSNorm: grouped-query attention (``num_key_value_heads`` key and
value heads, each shared by a group of query heads, every head ``head_dim`` wide whatever the
hidden size) with an RMSNorm over each query and key head before the rotary positions, and a
gated feed-forward; a final RMSNorm. Where they differ (:class:`.families.EncoderConfig`):

=================  ==================================  =====================================
                   Qwen3                               Gemma3 (EmbeddingGemma)
=================  ==================================  =====================================
attention          causal                              bidirectional (EmbeddingGemma's
                                                       ``use_bidirectional_attention``), in a
                                                       window (``|i - j| < sliding_window``)
                                                       on most layers, whole on the others
rotary base        ``rope_theta``                      the whole layers' and the window
                                                       layers' own
feed-forward       SwiGLU (SiLU)                       GeGLU (tanh GELU)
norms              before attention and feed-forward   after each too; every norm scales by
                                                       ``1 + weight``
scores scaled by   ``head_dim ** -0.5``                ``query_pre_attn_scalar ** -0.5``
embeddings         as stored                           times ``sqrt(hidden_size)``
=================  ==================================  =====================================

The ``1 +``, the scores' scale (rotation is linear, so scaling the query heads' norm scales the
scores) and the embeddings' scale are folded into the weights once, as they are prepared.

Layer -1 is the model's output, after its final norm; another pooled layer is that layer's raw
output, as transformers' hidden states are. Qwen3's tokenizer pads on the left; bertserve pads
on the right, with every row's positions counted from 0. Both give each token the same vector:
causal attention never lets a real token see the padding after it, and rotary attention scores
depend only on how far apart two tokens are, not on where the row starts.

As in :mod:`.bert`, the matrix products run in the compute dtype while the residual stream,
the norms, rotary positions and softmax stay in fp32; the embedding table stays fp32 too (a
bf16 copy of fp32 weights would round every input before the first layer; a model published
in bf16 loses nothing either way). The query, key and value products are one product, and so
are the gate and up products, so that every family's products have the roles :mod:`.int8`
names (``qkv``, ``attn_out``, ``ffn_in``, ``ffn_out``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..config.model import PoolingStrategy
from ..errors import ModelError
from . import rotary
from .pooling import ForwardSpec, pooled_output
from .precision import compute_dtype, numpy_dtype
from .task_heads import task_output

if TYPE_CHECKING:
    from .families import EncoderConfig
    from .st_modules import DenseModule
    from .tasks import TaskHead

NAMES = {"qwen3": "Qwen3", "gemma3": "Gemma3"}
_NORMS = ("attn_norm", "mlp_norm", "attn_post_norm", "mlp_post_norm")


def prepare_weights(weights: dict[str, np.ndarray], config: EncoderConfig, spec: ForwardSpec) -> dict[str, np.ndarray]:
    """The products fused and in the compute dtype; the norms' offset, the scores' scale and
    the embeddings' scale folded in (see the module docstring)."""
    if spec.pooling_strategy is PoolingStrategy.CLS_POOLED:
        raise ModelError(
            f"CLS_POOLED needs a pooler, and {NAMES[config.family]} has none; use LAST_TOKEN or REDUCE_MEAN"
        )
    compute = numpy_dtype(spec.dtype)
    family = config.family + "/"
    offset = np.float32(config.norm_offset)
    scale = np.float32(config.attention_scale or 1.0 / math.sqrt(config.head_dim))
    out = {name: value for name, value in weights.items() if not name.startswith(family)}
    out["embeddings/word_embeddings"] = weights[family + "embeddings/word_embeddings"] * np.float32(
        config.embedding_scale
    )
    out["final_norm/gamma"] = weights[family + "final_norm/gamma"] + offset
    for n in range(config.num_hidden_layers):
        ours, theirs = f"layer_{n}/", f"{family}layer_{n}/"

        def fused(*names: str, kind: str = "kernel", layer: str = theirs) -> np.ndarray:
            axis = 1 if kind == "kernel" else 0
            return np.concatenate([weights[f"{layer}{name}/{kind}"] for name in names], axis=axis).astype(compute)

        out[ours + "qkv/kernel"] = fused("q_proj", "k_proj", "v_proj")
        out[ours + "attn_out/kernel"] = fused("o_proj")
        if config.attention_bias:
            out[ours + "qkv/bias"] = fused("q_proj", "k_proj", "v_proj", kind="bias")
            out[ours + "attn_out/bias"] = fused("o_proj", kind="bias")
        out[ours + "ffn_in/kernel"] = fused("gate_proj", "up_proj")
        out[ours + "ffn_out/kernel"] = fused("down_proj")
        for norm in _NORMS[: 4 if config.post_norms else 2]:
            out[f"{ours}{norm}/gamma"] = weights[f"{theirs}{norm}/gamma"] + offset
        out[ours + "k_norm/gamma"] = weights[theirs + "k_norm/gamma"] + offset
        out[ours + "q_norm/gamma"] = (weights[theirs + "q_norm/gamma"] + offset) * scale
    return out


def forward(
    w: dict,
    config: EncoderConfig,
    spec: ForwardSpec,
    dense: tuple[DenseModule, ...],
    input_ids,
    input_mask,
    segment_ids,
    head: TaskHead | None = None,
):
    """The output of ``spec`` for a batch (int32 [batch, length], right-padded); these families
    have no token types, and ``segment_ids`` goes unread."""
    import tensorflow as tf

    f32 = tf.float32
    compute = compute_dtype(spec.dtype)
    batch, length = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
    hidden, heads, kv_heads, head_dim = (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    eps = config.layer_norm_eps
    lengths = tf.reduce_sum(input_mask, axis=1)
    mask = tf.cast(input_mask, f32)

    def rms_norm(x, gamma):
        return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + eps) * gamma

    def linear(x, prefix, bias: bool):
        out = tf.matmul(tf.cast(x, compute), w[prefix + "/kernel"])
        return tf.nn.bias_add(out, w[prefix + "/bias"]) if bias else out

    positions = tf.range(length)
    rows, columns = tf.expand_dims(positions, 1), tf.expand_dims(positions, 0)
    seen = tf.reshape(mask, [batch, 1, 1, length])
    if config.causal:  # a token sees itself and the real tokens before it
        seen = seen * tf.reshape(tf.cast(rows >= columns, f32), [1, 1, length, length])
    masks = {0: (1.0 - seen) * -1e9}
    for window in set(config.layer_windows) - {0}:  # |i - j| <= window
        near = tf.reshape(tf.cast(tf.abs(rows - columns) <= window, f32), [1, 1, length, length])
        masks[window] = (1.0 - seen * near) * -1e9
    rotations = {theta: rotary.angles(theta, head_dim, length) for theta in _thetas(config)}
    group = heads // kv_heads

    def heads_of(t, count, norm, rotation):
        """[batch * length, count * head_dim] as [batch, count, length, head_dim], each head
        RMS-normed (queries and keys) and turned by its position."""
        t = tf.reshape(tf.cast(t, f32), [batch, length, count, head_dim])
        if norm is not None:
            t = rotary.rotate(tf.transpose(rms_norm(t, norm), [0, 2, 1, 3]), *rotation)
            return tf.cast(t, compute)
        return tf.cast(tf.transpose(t, [0, 2, 1, 3]), compute)

    def attention(x, p, window):
        qkv = linear(x, p + "qkv", config.attention_bias)
        q, k, v = tf.split(qkv, [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], axis=-1)
        rotation = rotations[config.rope_theta_local if window else config.rope_theta_global]
        q = heads_of(q, heads, w[p + "q_norm/gamma"], rotation)
        k = heads_of(k, kv_heads, w[p + "k_norm/gamma"], rotation)
        v = heads_of(v, kv_heads, None, rotation)
        # Each key and value head serves the `group` query heads after it: those query heads'
        # rows go side by side, one product per key head, with no copy of the keys or values.
        grouped = tf.reshape(q, [batch, kv_heads, group * length, head_dim])
        scores = tf.reshape(tf.cast(tf.matmul(grouped, k, transpose_b=True), f32), [batch, heads, length, length])
        probs = tf.cast(tf.nn.softmax(scores + masks[window], axis=-1), compute)
        context = tf.matmul(tf.reshape(probs, [batch, kv_heads, group * length, length]), v)
        context = tf.transpose(tf.reshape(context, [batch, heads, length, head_dim]), [0, 2, 1, 3])
        out = tf.cast(linear(tf.reshape(context, [-1, heads * head_dim]), p + "attn_out", config.attention_bias), f32)
        return rms_norm(out, w[p + "attn_post_norm/gamma"]) if config.post_norms else out

    def feed_forward(x, p):
        gate, up = tf.split(linear(x, p + "ffn_in", False), 2, axis=-1)
        act = tf.nn.silu(gate) if config.hidden_act == "silu" else tf.nn.gelu(gate, approximate=True)
        out = tf.cast(linear(act * up, p + "ffn_out", False), f32)
        return rms_norm(out, w[p + "mlp_post_norm/gamma"]) if config.post_norms else out

    x = tf.reshape(tf.gather(w["embeddings/word_embeddings"], input_ids), [-1, hidden])
    layers = []
    for n, window in enumerate(config.layer_windows):
        p = f"layer_{n}/"
        with tf.name_scope(f"layer_{n}"):
            x = x + attention(rms_norm(x, w[p + "attn_norm/gamma"]), p, window)
            x = x + feed_forward(rms_norm(x, w[p + "mlp_norm/gamma"]), p)
        layers.append(tf.reshape(x, [batch, length, hidden]))
    layers[-1] = tf.reshape(rms_norm(x, w["final_norm/gamma"]), [batch, length, hidden])

    if head is not None:  # a task's head on the last layer (.task_heads), in place of pooling
        return task_output(w, config, head, layers[-1], input_mask)
    return pooled_output(w, spec, dense, layers, input_mask, lengths)


def _thetas(config: EncoderConfig) -> set[float]:
    return {config.rope_theta_local if window else config.rope_theta_global for window in config.layer_windows}
