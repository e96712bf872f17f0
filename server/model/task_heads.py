"""The heads of the tasks beside embedding (:mod:`.tasks`), in TensorFlow ops on the encoder's
last layer, and their weights' names and shapes.

A sequence classifier's head reads the first token (ModernBERT's, the first token or the mean,
as its ``classifier_pooling`` says) and ends in one logit per label:

============  ====================================================================
family        head, as transformers computes it
============  ====================================================================
bert          the pooler (dense, tanh), then the classifier
roberta       dense, tanh, then ``out_proj`` (XLM-RoBERTa, CamemBERT and MPNet alike)
mpnet
distilbert    ``pre_classifier``, ReLU, then the classifier
modernbert    dense, ``classifier_activation``, norm, then the classifier
============  ====================================================================

A causal language model reranking (Qwen3-Reranker, :mod:`.yes_no`) reads its last real token
and ends in logit(yes) - logit(no), from its output layer's two rows (the word embeddings', when
tied). SPLADE's head is the masked language model's (dense, GELU, layer norm, then the decoder, tied
to the word embeddings unless the model has its own), then log(1 + ReLU(logits)) and the
maximum over the real tokens. The heads run in fp32 whatever the encoder's dtype: they are a
small part of the work, and the scores are what the caller compares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .norm import layer_norm

if TYPE_CHECKING:
    from .families import EncoderConfig
    from .tasks import TaskHead

#: Hugging Face names of the heads' tensors, per family: a prefix, then ``weight`` or ``bias``,
#: as ``task/<part>/<kernel|bias>`` (``gamma``/``beta`` for a norm). Specific prefixes first.
_HEAD_NAMES: dict[str, list[tuple[str, str]]] = {
    "bert": [
        ("classifier.", "task/classifier"),
        ("cls.predictions.transform.dense.", "task/transform"),
        ("cls.predictions.transform.LayerNorm.", "task/transform_ln"),
        ("cls.predictions.decoder.", "task/decoder"),
        ("cls.predictions.", "task/decoder"),  # its bias
    ],
    "roberta": [
        ("classifier.dense.", "task/dense"),
        ("classifier.out_proj.", "task/classifier"),
        ("lm_head.dense.", "task/transform"),
        ("lm_head.layer_norm.", "task/transform_ln"),
        ("lm_head.decoder.", "task/decoder"),
        ("lm_head.", "task/decoder"),  # its bias
    ],
    "mpnet": [
        ("classifier.dense.", "task/dense"),
        ("classifier.out_proj.", "task/classifier"),
    ],
    "distilbert": [
        ("pre_classifier.", "task/dense"),
        ("classifier.", "task/classifier"),
        ("vocab_transform.", "task/transform"),
        ("vocab_layer_norm.", "task/transform_ln"),
        ("vocab_projector.", "task/decoder"),
    ],
    "modernbert": [
        ("head.dense.", "task/dense"),
        ("head.norm.", "task/dense_ln"),
        ("classifier.", "task/classifier"),
    ],
}
_NORM_PARTS = ("task/transform_ln", "task/dense_ln")
ANSWER_TABLE = "qwen3/lm_head"  # a causal LM's output layer [vocab, hidden], when not tied to the word embeddings
_SUFFIXES = {"weight": "kernel", "bias": "bias"}
_NORM_SUFFIXES = {"weight": "gamma", "gamma": "gamma", "bias": "beta", "beta": "beta"}


def head_name(name: str, family: str) -> str | None:
    """bertserve's name for the head tensor ``name`` of a ``family`` model, or None."""
    for prefix, part in _HEAD_NAMES.get(family, []):
        if not name.startswith(prefix):
            continue
        suffixes = _NORM_SUFFIXES if part in _NORM_PARTS else _SUFFIXES
        suffix = suffixes.get(name[len(prefix) :])
        if suffix is not None:
            return f"{part}/{suffix}"
    return None


def expected_shapes(config: EncoderConfig, head: TaskHead, present: set[str]) -> dict[str, tuple[int, ...]]:
    """The head weights ``head`` needs (a tied decoder only where the model has its own)."""
    h = config.hidden_size
    shapes: dict[str, tuple[int, ...]] = {}
    if head.late:  # its heads are read beside the encoder's weights (.late)
        return shapes
    if head.answers:  # a causal LM's reranking: its output rows, or the word embeddings tied to them
        if ANSWER_TABLE in present:
            shapes[ANSWER_TABLE] = (config.vocab_size, h)
    elif head.scores:
        labels = len(head.labels)
        shapes["task/classifier/kernel"], shapes["task/classifier/bias"] = (h, labels), (labels,)
        if config.family == "bert":
            shapes["bert/pooler/dense/kernel"], shapes["bert/pooler/dense/bias"] = (h, h), (h,)
        else:
            shapes["task/dense/kernel"] = (h, h)
            if head.head_bias:
                shapes["task/dense/bias"] = (h,)
        if config.family == "modernbert":
            shapes["task/dense_ln/gamma"] = (h,)
            if config.norm_bias:
                shapes["task/dense_ln/beta"] = (h,)
    elif head.task == "sparse":
        v = config.vocab_size
        shapes.update({"task/transform/kernel": (h, h), "task/transform/bias": (h,)})
        shapes.update({"task/transform_ln/gamma": (h,), "task/transform_ln/beta": (h,), "task/decoder/bias": (v,)})
        if "task/decoder/kernel" in present:
            shapes["task/decoder/kernel"] = (h, v)
    return shapes


def task_output(w: Any, config: EncoderConfig, head: TaskHead, last: Any, input_mask: Any) -> Any:
    """The head of ``head.task`` on the last layer ``last`` (fp32 [batch, length, hidden]):
    [batch, labels] logits, or SPLADE's [batch, vocab] weights."""
    if head.task == "sparse":
        return _splade(w, config, last, input_mask)
    if head.answers:
        return _yes_no(w, last, input_mask)
    return _classifier(w, config, head, last, input_mask)


def _yes_no(w: Any, last: Any, input_mask: Any) -> Any:
    """logit(yes) - logit(no) at each input's last real token (the rows are right-padded)."""
    import tensorflow as tf

    lengths = tf.reduce_sum(input_mask, axis=1)
    return tf.matmul(tf.gather(last, lengths - 1, batch_dims=1), w["task/answer/kernel"])


def _dense(w: Any, x: Any, name: str, bias: bool = True) -> Any:
    import tensorflow as tf

    out = tf.matmul(x, w[f"task/{name}/kernel"])
    return tf.nn.bias_add(out, w[f"task/{name}/bias"]) if bias else out


def _activation(x: Any, name: str) -> Any:
    import tensorflow as tf

    if name == "relu":
        return tf.nn.relu(x)
    if name == "silu":
        return tf.nn.silu(x)
    if name == "tanh":
        return tf.tanh(x)
    return tf.nn.gelu(x, approximate=name != "gelu")


def _classifier(w: Any, config: EncoderConfig, head: TaskHead, last: Any, input_mask: Any) -> Any:
    import tensorflow as tf

    family = config.family
    if family == "modernbert" and head.pooling == "mean":
        mask = tf.expand_dims(tf.cast(input_mask, tf.float32), -1)
        x = tf.reduce_sum(last * mask, axis=1) / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
    else:
        x = last[:, 0]
    if family == "bert":
        x = tf.tanh(tf.nn.bias_add(tf.matmul(x, w["pooler/kernel"]), w["pooler/bias"]))
    elif family == "distilbert":
        x = tf.nn.relu(_dense(w, x, "dense"))
    elif family == "modernbert":
        x = _activation(_dense(w, x, "dense", head.head_bias), head.head_act)
        beta = w["task/dense_ln/beta"] if config.norm_bias else None
        x = layer_norm(x, w["task/dense_ln/gamma"], beta, config.layer_norm_eps)
    else:  # roberta, mpnet
        x = tf.tanh(_dense(w, x, "dense"))
    return _dense(w, x, "classifier")


def _splade(w: Any, config: EncoderConfig, last: Any, input_mask: Any) -> Any:
    import tensorflow as tf

    hidden = config.hidden_size
    batch, length = tf.shape(last)[0], tf.shape(last)[1]
    x = tf.reshape(last, [-1, hidden])
    x = _activation(_dense(w, x, "transform"), "gelu" if config.hidden_act == "gelu" else config.hidden_act)
    x = layer_norm(x, w["task/transform_ln/gamma"], w["task/transform_ln/beta"], _mlm_eps(config))
    logits = tf.nn.bias_add(tf.matmul(x, w["task/decoder/kernel"]), w["task/decoder/bias"])
    weights = _log1p(tf.nn.relu(tf.reshape(logits, [batch, length, config.vocab_size])))
    weights *= tf.expand_dims(tf.cast(input_mask, tf.float32), -1)  # padding weighs 0, below every real token's max
    return tf.reduce_max(weights, axis=1)


def _log1p(x: Any) -> Any:
    """log(1 + x) to an ulp or so for small ``x`` too, in ops LiteRT has (it turns ``log1p``
    into ``log(1 + x)``, which loses ``x``'s low bits): Goldberg's ``log(u) * x / (u - 1)``."""
    import tensorflow as tf

    u = 1.0 + x
    return tf.where(tf.equal(u, 1.0), x, tf.math.log(u) * x / tf.maximum(u - 1.0, 1e-30))


def _mlm_eps(config: EncoderConfig) -> float:
    return 1e-12 if config.family == "distilbert" else config.layer_norm_eps


def prepare(weights: dict[str, np.ndarray], config: EncoderConfig, head: TaskHead) -> dict[str, np.ndarray]:
    """The head's weights in fp32; a tied decoder made from the word embeddings."""
    out = {name: value.astype(np.float32) for name, value in weights.items() if name.startswith("task/")}
    if config.family == "bert" and head.scores:
        out["pooler/kernel"] = weights["bert/pooler/dense/kernel"].astype(np.float32)
        out["pooler/bias"] = weights["bert/pooler/dense/bias"].astype(np.float32)
    if head.answers:  # one column: the "yes" row of the output layer less the "no" row
        table = weights.get(ANSWER_TABLE, weights.get("qwen3/embeddings/word_embeddings"))
        assert table is not None
        yes, no = head.answers
        out["task/answer/kernel"] = (table[yes] - table[no]).astype(np.float32)[:, None]
    if head.task == "sparse" and "task/decoder/kernel" not in out:
        out["task/decoder/kernel"] = np.ascontiguousarray(weights["bert/embeddings/word_embeddings"].T, np.float32)
    return out
