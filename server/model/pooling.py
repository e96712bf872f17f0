"""From hidden states to the output: pooling, a sentence-transformers Dense module, and
normalization, in TensorFlow ops shared by every family's forward pass (in fp32).

Each pooling is sentence-transformers' ``Pooling`` mode of the same meaning, over the real
tokens (``pool_mask``: the input mask, less ``[CLS]`` and ``[SEP]`` with ``mask_cls_sep``):

======================  ==================  ================================================
strategy                sentence-transf.    vector
======================  ==================  ================================================
CLS_TOKEN               cls                 the first token's
SEP_TOKEN               lasttoken           the last real token's
REDUCE_MEAN             mean                the mean
REDUCE_MAX              max                 the element-wise maximum
REDUCE_MEAN_SQRT_LEN    mean_sqrt_len       the sum divided by the square root of the count
WEIGHTED_MEAN           weightedmean        the mean, the i-th token (from 1) weighing i
REDUCE_MEAN_MAX                             the mean and the maximum, concatenated
NONE                                        every token's, zeros at padding
======================  ==================  ================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..config.model import PoolingStrategy

if TYPE_CHECKING:
    from .st_modules import DenseModule


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
    @property
    def zero_padding(self) -> bool: ...


def pooled_output(
    w: Any,
    spec: ForwardSpec,
    dense: Sequence[DenseModule],
    layers: Sequence[Any],
    input_mask: Any,
    lengths: Any,
    pooler: Any = None,
) -> Any:
    """What ``spec`` asks for of the encoder's ``layers`` (each fp32 [batch, length, hidden]):
    their pooling (or the ``pooler``'s output, for CLS_POOLED) through the model's Dense layers
    (sentence vectors only), normalized if asked, in the output dtype."""
    import tensorflow as tf

    if pooler is not None:
        vectors = pooler
    else:
        keep = pool_mask(input_mask, lengths, spec.mask_cls_sep)
        if spec.pooling_strategy is PoolingStrategy.NONE and not spec.zero_padding:
            keep = tf.ones_like(keep)
        pooled = [pool(layers[i], spec.pooling_strategy, keep, lengths) for i in spec.pooling_layer]
        vectors = pooled[0] if len(pooled) == 1 else tf.concat(pooled, axis=-1)
    if spec.pooling_strategy is PoolingStrategy.NONE:
        dense = ()
    return head(w, vectors, dense, spec.normalize, spec.output_dtype)


def pool_mask(input_mask: Any, lengths: Any, mask_cls_sep: bool) -> Any:
    """The tokens pooling reads, as fp32 [batch, length]."""
    import tensorflow as tf

    mask = tf.cast(input_mask, tf.float32)
    if not mask_cls_sep:
        return mask
    positions = tf.range(tf.shape(input_mask)[1])[None, :]
    keep = (positions > 0) & (positions < (lengths - 1)[:, None])
    return mask * tf.cast(keep, tf.float32)


def pool(h: Any, strategy: PoolingStrategy, mask: Any, lengths: Any) -> Any:
    """One layer's hidden states ``h`` [batch, length, hidden] (fp32) pooled by ``strategy``."""
    import tensorflow as tf

    m = tf.expand_dims(mask, -1)
    count = tf.reduce_sum(m, axis=1)
    if strategy is PoolingStrategy.NONE:
        return h * m
    if strategy is PoolingStrategy.CLS_TOKEN:
        return h[:, 0]
    if strategy is PoolingStrategy.SEP_TOKEN:
        return tf.gather(h, lengths - 1, batch_dims=1)
    total = tf.reduce_sum(h * m, axis=1)
    if strategy is PoolingStrategy.REDUCE_MEAN_SQRT_LEN:
        return total / tf.sqrt(tf.maximum(count, 1e-9))
    if strategy is PoolingStrategy.WEIGHTED_MEAN:
        weights = m * tf.cast(tf.range(1, tf.shape(h)[1] + 1), tf.float32)[None, :, None]
        return tf.reduce_sum(h * weights, axis=1) / tf.maximum(tf.reduce_sum(weights, axis=1), 1e-9)
    mean = total / tf.maximum(count, 1.0)
    maximum = tf.reduce_max(h - (1.0 - m) * 1e30, axis=1) * tf.cast(count > 0, tf.float32)
    if strategy is PoolingStrategy.REDUCE_MEAN:
        return mean
    if strategy is PoolingStrategy.REDUCE_MAX:
        return maximum
    return tf.concat([mean, maximum], axis=-1)


def head(w: Any, vectors: Any, dense: Sequence[DenseModule], normalize: bool, output_dtype: str) -> Any:
    """The pooled ``vectors`` through the model's Dense layers (sentence vectors only), then
    L2-normalized if asked, in the output dtype."""
    import tensorflow as tf

    activations = {"identity": tf.identity, "tanh": tf.tanh, "relu": tf.nn.relu, "sigmoid": tf.sigmoid}
    for i, layer in enumerate(dense):
        vectors = tf.matmul(vectors, w[f"head/dense_{i}/kernel"])
        if layer.bias:
            vectors = vectors + w[f"head/dense_{i}/bias"]
        vectors = activations[layer.activation](vectors)
    if normalize:
        vectors = tf.math.l2_normalize(vectors, axis=-1, epsilon=1e-12)
    return tf.cast(vectors, tf.float16 if output_dtype == "float16" else tf.float32)


def pooled_width(hidden: int, strategy: PoolingStrategy, layers: int) -> int:
    """The width of the pooled vector, before any Dense layer."""
    return hidden * layers * (2 if strategy is PoolingStrategy.REDUCE_MEAN_MAX else 1)
