"""Qwen3's forward pass as an embedder (Qwen3-Embedding), in plain TensorFlow ops: the decoder
run once over the whole input, with no key-value cache.

Each layer is pre-norm with RMSNorm: grouped-query attention (``num_key_value_heads`` key and
value heads, each shared by a group of query heads, each head ``head_dim`` wide whatever the
hidden size), an RMSNorm over each query and key head before the rotary positions, causal
attention, and a SwiGLU feed-forward; a final RMSNorm. Layer -1 is the model's output, after
that norm; another pooled layer is that layer's raw output, as transformers' hidden states
are. sentence-transformers pools Qwen3-Embedding by its last token (``LAST_TOKEN``).

The model's tokenizer pads on the left; bertserve pads on the right, with every row's
positions counted from 0. Both give each token the same vector: causal attention never lets
a real token see the padding after it, and rotary attention scores depend only on how far
apart two tokens are, not on where the row starts (a left-padded row's positions are all
shifted by its padding, which cancels).

As in :mod:`.bert`, the matrix products run in the compute dtype while the residual stream,
the norms, rotary positions and softmax stay in fp32. The query, key and value products are
one product, and so are SwiGLU's gate and up products, so that every family's products have
the roles :mod:`.int8` names (``qkv``, ``attn_out``, ``ffn_in``, ``ffn_out``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..config.model import PoolingStrategy
from ..errors import ModelError
from .modernbert import _rotary, _rotate
from .pooling import ForwardSpec, pooled_output
from .precision import compute_dtype, numpy_dtype
from .task_heads import task_output

if TYPE_CHECKING:
    from .families import EncoderConfig
    from .st_modules import DenseModule
    from .tasks import TaskHead


def prepare_weights(weights: dict[str, np.ndarray], config: EncoderConfig, spec: ForwardSpec) -> dict[str, np.ndarray]:
    """The products fused and in the compute dtype; the softmax's 1/sqrt(head_dim) folded into
    the query heads' norm (rotation is linear, so scaling before it is scaling after)."""
    if spec.pooling_strategy is PoolingStrategy.CLS_POOLED:
        raise ModelError("CLS_POOLED needs a pooler, and Qwen3 has none; use LAST_TOKEN, as Qwen3-Embedding does")
    compute = numpy_dtype(spec.dtype)
    scale = np.float32(1.0 / math.sqrt(config.head_dim))
    out = {name: value for name, value in weights.items() if not name.startswith("qwen3/")}
    # The embedding table stays fp32: a bf16 copy of fp32 weights would round every input
    # before the first layer (a model published in bf16 loses nothing either way).
    out["embeddings/word_embeddings"] = weights["qwen3/embeddings/word_embeddings"]
    out["final_norm/gamma"] = weights["qwen3/final_norm/gamma"]
    for n in range(config.num_hidden_layers):
        ours, theirs = f"layer_{n}/", f"qwen3/layer_{n}/"

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
        for norm in ("attn_norm", "mlp_norm", "k_norm"):
            out[f"{ours}{norm}/gamma"] = weights[f"{theirs}{norm}/gamma"]
        out[ours + "q_norm/gamma"] = weights[theirs + "q_norm/gamma"] * scale
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
    """The output of ``spec`` for a batch (int32 [batch, length], right-padded); Qwen3 has no
    token types, and ``segment_ids`` goes unread."""
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

    def heads_of(t, count, p, norm):
        """[batch * length, count * head_dim] as [batch, count, length, head_dim], each head
        RMS-normed (queries and keys) and turned by its position."""
        t = tf.reshape(tf.cast(t, f32), [batch, length, count, head_dim])
        if norm:
            t = _rotate(tf.transpose(rms_norm(t, w[p + norm + "/gamma"]), [0, 2, 1, 3]), cos, sin)
            return tf.cast(t, compute)
        return tf.cast(tf.transpose(t, [0, 2, 1, 3]), compute)

    # a token sees itself and the real tokens before it
    positions = tf.range(length)
    causal = tf.reshape(
        tf.cast(tf.expand_dims(positions, 1) >= tf.expand_dims(positions, 0), f32), [1, 1, length, length]
    )
    bias = (1.0 - causal * tf.reshape(mask, [batch, 1, 1, length])) * -1e9
    cos, sin = _rotary(config.rope_theta, head_dim, length)
    group = heads // kv_heads

    def attention(x, p):
        qkv = linear(x, p + "qkv", config.attention_bias)
        q, k, v = tf.split(qkv, [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], axis=-1)
        q, k, v = heads_of(q, heads, p, "q_norm"), heads_of(k, kv_heads, p, "k_norm"), heads_of(v, kv_heads, p, None)
        # Each key and value head serves the `group` query heads after it: those query heads'
        # rows go side by side, one product per key head, with no copy of the keys or values.
        grouped = tf.reshape(q, [batch, kv_heads, group * length, head_dim])
        scores = tf.reshape(tf.cast(tf.matmul(grouped, k, transpose_b=True), f32), [batch, heads, length, length])
        probs = tf.cast(tf.nn.softmax(scores + bias, axis=-1), compute)
        context = tf.matmul(tf.reshape(probs, [batch, kv_heads, group * length, length]), v)
        context = tf.reshape(
            tf.transpose(tf.reshape(context, [batch, heads, length, head_dim]), [0, 2, 1, 3]), [-1, heads * head_dim]
        )
        return tf.cast(linear(context, p + "attn_out", config.attention_bias), f32)

    def feed_forward(x, p):
        gate, up = tf.split(linear(x, p + "ffn_in", False), 2, axis=-1)
        return tf.cast(linear(tf.nn.silu(gate) * up, p + "ffn_out", False), f32)

    x = tf.reshape(tf.cast(tf.gather(w["embeddings/word_embeddings"], input_ids), f32), [-1, hidden])
    layers = []
    for n in range(config.num_hidden_layers):
        p = f"layer_{n}/"
        with tf.name_scope(f"layer_{n}"):
            x = x + attention(rms_norm(x, w[p + "attn_norm/gamma"]), p)
            x = x + feed_forward(rms_norm(x, w[p + "mlp_norm/gamma"]), p)
        layers.append(tf.reshape(x, [batch, length, hidden]))
    layers[-1] = tf.reshape(rms_norm(x, w["final_norm/gamma"]), [batch, length, hidden])

    if head is not None:  # a task's head on the last layer (.task_heads), in place of pooling
        return task_output(w, config, head, layers[-1], input_mask)
    return pooled_output(w, spec, dense, layers, input_mask, lengths)
