"""The forward pass of the post-norm encoder families (BERT, RoBERTa and XLM-RoBERTa,
DistilBERT, MPNet, and the variants GTE, NomicBERT, JinaBERT and jina-embeddings-v3: see
:mod:`.families`) in plain
TensorFlow ops, over weights prepared for it: Q, K and V fused into one matrix, a gated
feed-forward's two halves into one, the matrices stored in the compute dtype. :mod:`.graph`
builds it into a frozen graph; embeddings sums, softmax, layer norm, residuals, rotary
positions and pooling accumulate in fp32.

The families differ only at the edges of the layer stack: where positions start (after the
padding index for RoBERTa's kind and MPNet), or that there are none in the embeddings but
rotary ones on each query and key (GTE, NomicBERT) or ALiBi's bias on the scores (JinaBERT);
whether there are token types; MPNet's relative position bias, one table of buckets shared by
every layer's attention scores; whether the feed-forward is gated; and jina-embeddings-v3's LoRA
task adapters beside every product and embedding table (:mod:`.lora`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..config.model import PoolingStrategy
from ..errors import ModelError
from . import lora, rotary
from .bert_variants import alibi_slopes
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
    hidden = config.hidden_size
    scale = 1.0 / math.sqrt(hidden // config.num_attention_heads)
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
        kernel, bias = _qkv(weights, src + "attention/self/", config.hidden_size)
        kernel = np.concatenate([kernel[:, :hidden] * scale, kernel[:, hidden:]], axis=1)
        out[dst + "qkv/kernel"] = kernel.astype(compute)
        out[dst + "qkv/bias"] = np.concatenate([bias[:hidden] * scale, bias[hidden:]]).astype(compute)
        ffn_in = _ffn_in(weights, src + "intermediate/", config.intermediate_size)
        for name, (k, b) in (
            ("attn_out", _product(weights, src + "attention/output/dense")),
            ("ffn_in", ffn_in),
            ("ffn_out", _product(weights, src + "output/dense")),
        ):
            out[f"{dst}{name}/kernel"], out[f"{dst}{name}/bias"] = k.astype(compute), b.astype(compute)
        for block, name in (("attention/output", "attn_ln"), ("output", "ffn_ln")):
            out[f"{dst}{name}/gamma"] = weights[f"{src}{block}/LayerNorm/gamma"]
            out[f"{dst}{name}/beta"] = weights[f"{src}{block}/LayerNorm/beta"]
    out.update(lora.prepare(weights, config, compute, scale))
    if spec.pooling_strategy is PoolingStrategy.CLS_POOLED and "bert/pooler/dense/kernel" not in weights:
        raise ModelError("CLS_POOLED needs the pooler weights, and this model has none")
    if "bert/pooler/dense/kernel" in weights:
        out["pooler/kernel"] = weights["bert/pooler/dense/kernel"].astype(compute)
        out["pooler/bias"] = weights["bert/pooler/dense/bias"]
    return out


def _product(weights: dict[str, np.ndarray], prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """A product's kernel and bias (zeros where the model has none: NomicBERT's)."""
    kernel = weights[prefix + "/kernel"]
    return kernel, weights.get(prefix + "/bias", np.zeros(kernel.shape[1], np.float32))


def _qkv(weights: dict[str, np.ndarray], prefix: str, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """Q, K and V as one product [hidden, 3 * hidden]: fused already (GTE, NomicBERT), or each
    on its own under BERT's names or GTE's unpacked ones."""
    if prefix + "qkv/kernel" in weights:
        return _product(weights, prefix + "qkv")
    names = ("query", "key", "value") if prefix + "query/kernel" in weights else ("q", "k", "v")
    parts = [_product(weights, prefix + name) for name in names]
    return np.concatenate([k for k, _ in parts], axis=1), np.concatenate([b for _, b in parts])


def _ffn_in(weights: dict[str, np.ndarray], prefix: str, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The feed-forward's first product; a gated one's as [gate | up], the half the activation
    takes first: GTE's fused product holds up then gate, JinaBERT's gate then up, NomicBERT's
    two products up (``fc11``) and gate (``fc12``)."""
    if prefix + "up_gate/kernel" in weights:
        kernel = weights[prefix + "up_gate/kernel"]
        return np.concatenate([kernel[:, width:], kernel[:, :width]], axis=1), np.zeros(2 * width, np.float32)
    if prefix + "gate_up/kernel" in weights:
        return weights[prefix + "gate_up/kernel"], np.zeros(2 * width, np.float32)
    if prefix + "gate/kernel" in weights:
        (gate, gate_bias), (up, up_bias) = _product(weights, prefix + "gate"), _product(weights, prefix + "up")
        return np.concatenate([gate, up], axis=1), np.concatenate([gate_bias, up_bias])
    return _product(weights, prefix + "dense")


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
    adapters = lora.chosen(config, segment_ids) if config.adapters else None
    if adapters is not None:
        embeddings += lora.embedding_delta(w, config, input_ids, adapters)
    x = layer_norm(embeddings, w["embeddings/ln_gamma"], w["embeddings/ln_beta"], config.layer_norm_eps)
    attention_bias = tf.reshape((1.0 - mask) * -1e9, [tf.shape(input_ids)[0], 1, 1, length])
    if config.relative_attention_buckets:
        attention_bias = attention_bias + relative_position_bias(w["relative_bias"], config, length)
    if config.alibi:
        attention_bias = attention_bias + alibi_bias(config.num_attention_heads, length)
    layers = _encoder_layers(w, config, spec, x, attention_bias, tf.shape(input_ids)[0], length, adapters)

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
    embeddings = tf.cast(tf.gather(w["embeddings/word_embeddings"], input_ids), f32)
    if not (config.rotary_dim or config.alibi):  # absolute positions
        positions = w["embeddings/position_embeddings"][config.position_offset : config.position_offset + length]
        embeddings += tf.cast(positions, f32)[None]
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


def alibi_bias(heads: int, length):
    """ALiBi's attention bias [1, heads, length, length]: each head's slope times the distance
    between query and key, subtracted, both ways alike (JinaBERT's)."""
    import tensorflow as tf

    distance = tf.cast(tf.abs(tf.range(length)[None, :] - tf.range(length)[:, None]), tf.float32)
    slopes = tf.constant(alibi_slopes(heads), tf.float32)
    return -slopes[None, :, None, None] * distance[None, None]


def _encoder_layers(
    w: dict, config: EncoderConfig, spec: ForwardSpec, x, attention_bias, batch, length, adapters=None
) -> list:
    """Every layer's output, [batch, length, hidden] in fp32; ``adapters``: each row's LoRA
    adapter, one-hot (:mod:`.lora`), or None for a model without them."""
    import tensorflow as tf

    compute, f32 = compute_dtype(spec.dtype), tf.float32
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = hidden // heads
    eps = config.layer_norm_eps
    x = tf.reshape(x, [-1, hidden])  # [batch * length, hidden], fp32 residual stream

    keep = None if adapters is None else lora.kept(config, adapters, length, compute)

    def dense(x, prefix):
        """x in the compute dtype, [tokens, in] -> [tokens, out] in the compute dtype."""
        out = tf.matmul(x, w[prefix + "/kernel"])
        if keep is not None:
            out += lora.product_delta(w, prefix, x, keep)
        return tf.nn.bias_add(out, w[prefix + "/bias"])

    def activation(x):
        act = config.hidden_act
        if act == "relu":
            return tf.nn.relu(x)
        if act == "silu":
            return tf.nn.silu(x)
        return tf.nn.gelu(x, approximate=act != "gelu")

    def feed_forward(x, p):
        inner = dense(x, p + "ffn_in")
        if config.glu:
            gate, up = tf.split(inner, 2, axis=-1)
            return activation(gate) * up
        return activation(inner)

    rotation = None
    if config.rotary_dim:
        rotation = rotary.angles(config.rope_theta_global, config.rotary_dim, length, config.rope_ntk_factor)

    def _encoder_layer(x, p):
        qkv = dense(tf.cast(x, compute), p + "qkv")
        # One transpose for query, key and value: [3, batch, heads, length, head_dim].
        q, k, v = tf.unstack(tf.transpose(tf.reshape(qkv, [batch, length, 3, heads, head_dim]), [2, 0, 3, 1, 4]))
        if rotation is not None:
            q, k = (tf.cast(rotary.rotate(tf.cast(t, f32), *rotation, config.rotary_dim), compute) for t in (q, k))
        # Softmax in fp32: oneDNN's bf16 softmax ran at half its fp32 speed (a bulk run's
        # softmax took 14% of its time in bf16, 7% cast to fp32 and back).
        scores = tf.cast(tf.matmul(q, k, transpose_b=True), f32) + attention_bias
        probs = tf.cast(tf.nn.softmax(scores, axis=-1), compute)
        context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [-1, hidden])
        attn = tf.cast(dense(context, p + "attn_out"), f32)
        x = layer_norm(attn + x, w[p + "attn_ln/gamma"], w[p + "attn_ln/beta"], eps)
        inner = feed_forward(tf.cast(x, compute), p)
        ffn = tf.cast(dense(inner, p + "ffn_out"), f32)
        return layer_norm(ffn + x, w[p + "ffn_ln/gamma"], w[p + "ffn_ln/beta"], eps)

    layers = []
    for n in range(config.num_hidden_layers):
        with tf.name_scope(f"layer_{n}"):
            x = _encoder_layer(x, f"layer_{n}/")
        layers.append(tf.reshape(x, [batch, length, hidden]))
    return layers
