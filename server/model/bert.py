"""The forward pass of the post-norm encoder families (BERT, RoBERTa and XLM-RoBERTa,
DistilBERT, MPNet: see :mod:`.families`) in plain TensorFlow ops, over weights prepared for
it: Q, K and V fused into one matrix, the matrices stored in the compute dtype. :mod:`.graph`
builds it into a frozen graph; embeddings sums, softmax, layer norm, residuals and pooling
accumulate in fp32.

The families differ only at the edges of the layer stack: where positions start (after the
padding index for RoBERTa's kind and MPNet), whether there are token types, and MPNet's
relative position bias, one table of buckets shared by every layer's attention scores.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..config.model import PoolingStrategy
from ..errors import ModelError
from .norm import layer_norm
from .pooling import ForwardSpec, pooled_output
from .precision import compute_dtype, numpy_dtype
from .task_heads import task_output

if TYPE_CHECKING:
    from .families import EncoderConfig
    from .st_modules import DenseModule
    from .tasks import TaskHead


def prepare_weights(weights: dict[str, np.ndarray], config: EncoderConfig, spec: ForwardSpec) -> dict[str, np.ndarray]:
    """Fuse Q, K and V into one matrix (with the query pre-scaled) and store the matrices
    in the compute dtype."""
    compute = numpy_dtype(spec.dtype)
    head_dim = config.hidden_size // config.num_attention_heads
    scale = 1.0 / math.sqrt(head_dim)
    out: dict[str, np.ndarray] = {name: value for name, value in weights.items() if name.startswith("head/")}
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        if f"bert/embeddings/{name}" in weights:
            out[f"embeddings/{name}"] = weights[f"bert/embeddings/{name}"].astype(compute)
    if "bert/encoder/relative_attention_bias/table" in weights:
        out["relative_bias"] = weights["bert/encoder/relative_attention_bias/table"]
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
    """The output of ``spec`` for a batch: ``input_ids``, ``input_mask`` and ``segment_ids``
    are int32 [batch, length], right-padded."""
    import tensorflow as tf

    f32 = tf.float32
    length = tf.shape(input_ids)[1]
    lengths = tf.reduce_sum(input_mask, axis=1)
    mask = tf.cast(input_mask, f32)
    embeddings = _embeddings(w, config, input_ids, segment_ids, length)
    x = layer_norm(embeddings, w["embeddings/ln_gamma"], w["embeddings/ln_beta"], config.layer_norm_eps)
    attention_bias = tf.reshape((1.0 - mask) * -1e9, [tf.shape(input_ids)[0], 1, 1, length])
    if config.relative_attention_buckets:
        attention_bias = attention_bias + relative_position_bias(w["relative_bias"], config, length)
    layers = _encoder_layers(w, config, spec, x, attention_bias, tf.shape(input_ids)[0], length)

    pooler = None
    if spec.pooling_strategy is PoolingStrategy.CLS_POOLED:
        cls = tf.cast(layers[-1][:, 0], compute_dtype(spec.dtype))
        pooler = tf.tanh(tf.cast(tf.matmul(cls, w["pooler/kernel"]), f32) + w["pooler/bias"])
    if head is not None:  # a task's head on the last layer (.task_heads), in place of pooling
        return task_output(w, config, head, layers[-1], input_mask)
    return pooled_output(w, spec, dense, layers, input_mask, lengths, pooler)


def _embeddings(w: dict, config: EncoderConfig, input_ids, segment_ids, length):
    """Word, position and (where the family has them) token type embeddings, summed in fp32."""
    import tensorflow as tf

    f32 = tf.float32
    positions = w["embeddings/position_embeddings"][config.position_offset : config.position_offset + length]
    embeddings = tf.cast(tf.gather(w["embeddings/word_embeddings"], input_ids), f32) + tf.cast(positions, f32)[None]
    if config.type_vocab_size:
        # A family with one token type gives every token type 0, as its tokenizer does.
        types = tf.minimum(segment_ids, config.type_vocab_size - 1)
        embeddings += tf.cast(tf.gather(w["embeddings/token_type_embeddings"], types), f32)
    return embeddings


# MPNet computes its buckets for 32, whatever the size of its table (always 32 in practice).
_MPNET_BUCKETS = 32


def relative_position_bias(table, config: EncoderConfig, length):
    """MPNet's attention bias [1, heads, length, length]: the table's row for the bucket of
    each key's position relative to the query's (T5's buckets: exact near, logarithmic far)."""
    import tensorflow as tf

    positions = tf.range(length)
    relative = positions[None, :] - positions[:, None]  # key - query
    half = _MPNET_BUCKETS // 2
    n = -relative
    bucket = tf.cast(n < 0, tf.int32) * half
    n = tf.abs(n)
    exact = half // 2
    far = exact + tf.cast(
        tf.math.log(tf.cast(tf.maximum(n, 1), tf.float32) / exact)
        / math.log(config.relative_max_distance / exact)
        * (half - exact),
        tf.int32,
    )
    bucket += tf.where(n < exact, n, tf.minimum(far, half - 1))
    values = tf.gather(table, bucket)  # [length, length, heads]
    return tf.transpose(values, [2, 0, 1])[None]


def _encoder_layers(w: dict, config: EncoderConfig, spec: ForwardSpec, x, attention_bias, batch, length) -> list:
    """Every layer's output, [batch, length, hidden] in fp32."""
    import tensorflow as tf

    compute, f32 = compute_dtype(spec.dtype), tf.float32
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = hidden // heads
    eps = config.layer_norm_eps
    x = tf.reshape(x, [-1, hidden])  # [batch * length, hidden], fp32 residual stream

    def dense(x, prefix):
        """x in the compute dtype, [tokens, in] -> [tokens, out] in the compute dtype."""
        return tf.nn.bias_add(tf.matmul(x, w[prefix + "/kernel"]), w[prefix + "/bias"])

    def activation(x):
        act = config.hidden_act
        if act == "relu":
            return tf.nn.relu(x)
        return tf.nn.gelu(x, approximate=act != "gelu")

    def _encoder_layer(x, p):
        qkv = dense(tf.cast(x, compute), p + "qkv")
        # One transpose for query, key and value: [3, batch, heads, length, head_dim].
        q, k, v = tf.unstack(tf.transpose(tf.reshape(qkv, [batch, length, 3, heads, head_dim]), [2, 0, 3, 1, 4]))
        # Softmax in fp32: oneDNN's bf16 softmax ran at half its fp32 speed (a bulk run's
        # softmax took 14% of its time in bf16, 7% cast to fp32 and back).
        scores = tf.cast(tf.matmul(q, k, transpose_b=True), f32) + attention_bias
        probs = tf.cast(tf.nn.softmax(scores, axis=-1), compute)
        context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [-1, hidden])
        attn = tf.cast(dense(context, p + "attn_out"), f32)
        x = layer_norm(attn + x, w[p + "attn_ln/gamma"], w[p + "attn_ln/beta"], eps)
        inner = activation(dense(tf.cast(x, compute), p + "ffn_in"))
        ffn = tf.cast(dense(inner, p + "ffn_out"), f32)
        return layer_norm(ffn + x, w[p + "ffn_ln/gamma"], w[p + "ffn_ln/beta"], eps)

    layers = []
    for n in range(config.num_hidden_layers):
        with tf.name_scope(f"layer_{n}"):
            x = _encoder_layer(x, f"layer_{n}/")
        layers.append(tf.reshape(x, [batch, length, hidden]))
    return layers
