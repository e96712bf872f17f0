"""Rotary positions, as every rotary family computes them: the angles of positions 0 .. L - 1
in fp32, and queries or keys turned by them in the rotate-half form (the first half of the
rotated values paired with the second)."""

from __future__ import annotations

from typing import Any

import numpy as np


def angles(theta: float, dim: int, length: Any, ntk_factor: float = 1.0) -> tuple[Any, Any]:
    """cos and sin [length, dim] of the rotary positions 0 .. length - 1 over ``dim`` values,
    the base ``theta``; ``ntk_factor`` > 1 scales them as GTE's fixed NTK scaling does (its
    base times the factor, each frequency divided by factor ** (2 / dim)), at every length."""
    import tensorflow as tf

    # in float32 throughout, as the references compute them
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    inverse = np.float32(1.0) / np.float32(theta * ntk_factor) ** exponents
    if ntk_factor != 1.0:
        inverse = inverse / np.float32(ntk_factor ** (2 / dim))
    freqs = tf.cast(tf.range(length), tf.float32)[:, None] * tf.constant(inverse)[None, :]
    both = tf.concat([freqs, freqs], axis=-1)
    return tf.cos(both), tf.sin(both)


def rotate(t: Any, cos: Any, sin: Any, dim: int = 0) -> Any:
    """``t`` [..., length, head_dim] turned by the rotary angles, over its first ``dim`` values
    (0: all of them; NomicBERT's fraction of a head leaves the rest as they are)."""
    import tensorflow as tf

    if dim and dim != t.shape[-1]:
        turned, kept = t[..., :dim], t[..., dim:]
        return tf.concat([rotate(turned, cos, sin), kept], axis=-1)
    first, second = tf.split(t, 2, axis=-1)
    return t * cos + tf.concat([-second, first], axis=-1) * sin
