"""ModernBERT's forward pass in plain TensorFlow ops: pre-norm layers without biases (unless
the config asks for them), rotary positions, a GeGLU feed-forward, and attention that is
global every few layers and a sliding window in the others (``EncoderConfig.layer_windows``:
a token sees the tokens at most that far from it).

As in :mod:`.bert`, the matrix products run in the compute dtype while the residual stream,
layer norms, rotary positions and softmax stay in fp32. Layer -1 is the model's output, after
its final norm; another pooled layer is that layer's raw output.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..config.model import PoolingStrategy
from ..errors import ModelError
from . import rotary
from .norm import layer_norm
from .pooling import ForwardSpec, pooled_output
from .precision import compute_dtype, numpy_dtype
from .task_heads import task_output

if TYPE_CHECKING:
    from .families import EncoderConfig
    from .st_modules import DenseModule
    from .tasks import TaskHead


def prepare_weights(weights: dict[str, np.ndarray], config: EncoderConfig, spec: ForwardSpec) -> dict[str, np.ndarray]:
    """The matrices in the compute dtype, the query's columns of Wqkv pre-scaled (rotation is
    linear, so scaling before it is scaling after)."""
    if spec.pooling_strategy is PoolingStrategy.CLS_POOLED:
        raise ModelError("CLS_POOLED needs a pooler, and ModernBERT has none; use CLS_TOKEN")
    compute = numpy_dtype(spec.dtype)
    hidden = config.hidden_size
    scale = 1.0 / math.sqrt(hidden // config.num_attention_heads)
    out: dict[str, np.ndarray] = {}
    for name, value in weights.items():
        # the products under the roles .int8 names for every family
        key = name.removeprefix("modernbert/")
        for role, ours in _ROLES.items():
            key = key.replace(f"/{role}/", f"/{ours}/")
        if name.endswith("/Wqkv/kernel"):
            value = np.concatenate([value[:, :hidden] * scale, value[:, hidden:]], axis=1)
        elif name.endswith("/Wqkv/bias"):
            value = np.concatenate([value[:hidden] * scale, value[hidden:]])
        matrix = name.endswith(("/kernel", "/bias")) and not name.startswith("head/")
        if matrix or name == "modernbert/embeddings/word_embeddings":
            value = value.astype(compute)
        out[key] = value
    return out


_ROLES = {"Wqkv": "qkv", "Wo": "attn_out", "mlp_Wi": "ffn_in", "mlp_Wo": "ffn_out"}


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
    """The output of ``spec`` for a batch (int32 [batch, length], right-padded); ModernBERT
    has no token types, and ``segment_ids`` goes unread."""
    import tensorflow as tf

    f32 = tf.float32
    compute = compute_dtype(spec.dtype)
    batch, length = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = hidden // heads
    eps = config.layer_norm_eps
    lengths = tf.reduce_sum(input_mask, axis=1)
    mask = tf.cast(input_mask, f32)

    def norm(x, prefix):
        return layer_norm(x, w[prefix + "/gamma"], w[prefix + "/beta"] if config.norm_bias else None, eps)

    def linear(x, prefix, bias: bool):
        out = tf.matmul(tf.cast(x, compute), w[prefix + "/kernel"])
        return tf.nn.bias_add(out, w[prefix + "/bias"]) if bias else out

    def split_heads(t):
        return tf.transpose(tf.reshape(t, [batch, length, heads, head_dim]), [0, 2, 1, 3])

    padding = tf.reshape((1.0 - mask) * -1e9, [batch, 1, 1, length])
    distance = tf.abs(tf.range(length)[None, :] - tf.range(length)[:, None])
    rotations = {theta: rotary.angles(theta, head_dim, length) for theta in _thetas(config)}
    # A position whose window holds no attended token (a ColBERT query's [MASK] expansion, kept
    # though attended to by none) gets no attention output, as PyTorch's SDPA gives a row it masks whole.
    attended = tf.reshape(mask > 0, [batch, 1, length])
    seen = {
        window: tf.reshape(
            tf.cast(tf.reduce_any(tf.expand_dims(distance <= window, 0) & attended, -1), compute), [batch, 1, length, 1]
        )
        for window in set(config.layer_windows) - {0}
    }

    def attention(x, p, window: int):
        qkv = linear(x, p + "qkv", config.attention_bias)
        q, k, v = (split_heads(t) for t in tf.split(qkv, 3, axis=-1))
        cos, sin = rotations[config.rope_theta_local if window else config.rope_theta_global]
        q, k = (tf.cast(rotary.rotate(tf.cast(t, f32), cos, sin), compute) for t in (q, k))
        bias = padding
        if window:
            bias = bias + tf.where(distance <= window, 0.0, -1e9)[None, None]
        scores = tf.cast(tf.matmul(q, k, transpose_b=True), f32) + bias
        probs = tf.cast(tf.nn.softmax(scores, axis=-1), compute)
        if window:
            probs = probs * seen[window]
        context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [-1, hidden])
        return tf.cast(linear(context, p + "attn_out", config.attention_bias), f32)

    def feed_forward(x, p):
        inner, gate = tf.split(linear(x, p + "ffn_in", config.mlp_bias), 2, axis=-1)
        act = tf.nn.relu(inner) if config.hidden_act == "relu" else tf.nn.gelu(inner, config.hidden_act != "gelu")
        return tf.cast(linear(act * gate, p + "ffn_out", config.mlp_bias), f32)

    x = tf.cast(tf.gather(w["embeddings/word_embeddings"], input_ids), f32)
    x = tf.reshape(norm(x, "embeddings/norm"), [-1, hidden])
    layers = []
    for n, window in enumerate(config.layer_windows):
        p = f"layer_{n}/"
        with tf.name_scope(f"layer_{n}"):
            x = x + attention(norm(x, p + "attn_norm") if n else x, p, window)
            x = x + feed_forward(norm(x, p + "mlp_norm"), p)
        layers.append(tf.reshape(x, [batch, length, hidden]))
    layers[-1] = tf.reshape(norm(x, "final_norm"), [batch, length, hidden])

    if head is not None:  # a task's head on the last layer (.task_heads), in place of pooling
        return task_output(w, config, head, layers[-1], input_mask)
    return pooled_output(w, spec, dense, layers, input_mask, lengths)


def _thetas(config: EncoderConfig) -> set[float]:
    return {config.rope_theta_local if window else config.rope_theta_global for window in config.layer_windows}
