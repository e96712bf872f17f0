"""Layer norm in its two spellings (:mod:`bertserve.server.model.norm`): the one oneDNN fuses
and the one LiteRT's converter takes compute the same thing, at any rank, with BERT's tiny
epsilon kept as it is (``tf.nn.fused_batch_norm`` would raise it to 1.001e-5)."""

from __future__ import annotations

import numpy as np
import pytest
from bertserve.server.model import norm


def _reference(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    out = (x64 - mean) / np.sqrt(x64.var(-1, keepdims=True) + eps) * gamma
    return out if beta is None else out + beta


def _graph_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, eps: float, *, for_lite: bool) -> np.ndarray:
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None] * (x.ndim - 1) + [x.shape[-1]], tf.float32)])
    def run(t):
        with norm.building_for_lite(for_lite):
            return norm.layer_norm(t, tf.constant(gamma), None if beta is None else tf.constant(beta), eps)

    return run(tf.constant(x)).numpy()


@pytest.mark.parametrize("shape", [(7, 32), (3, 5, 32)])
@pytest.mark.parametrize("with_beta", [True, False])
@pytest.mark.parametrize("for_lite", [True, False])
def test_both_forms_are_layer_norm(shape: tuple[int, ...], with_beta: bool, for_lite: bool) -> None:
    rng = np.random.default_rng(0)
    x = (rng.normal(size=shape) * 3 + 1).astype(np.float32)
    x[0] = 0.25  # a row with no variance: epsilon alone keeps it finite
    gamma = rng.normal(size=shape[-1]).astype(np.float32)
    beta = rng.normal(size=shape[-1]).astype(np.float32) if with_beta else None
    got = _graph_norm(x, gamma, beta, 1e-12, for_lite=for_lite)
    want = _reference(x, gamma, beta, 1e-12)
    np.testing.assert_allclose(got[1:], want[1:], rtol=1e-4, atol=1e-4)
    flat = np.zeros_like(gamma) if beta is None else beta  # a constant row normalizes to 0, then shifts
    np.testing.assert_allclose(got[0], np.broadcast_to(flat, got[0].shape), atol=1e-4)


def test_the_fused_form_keeps_a_tiny_epsilon() -> None:
    """With eps 1e-12 a row of variance 1e-8 normalizes to unit variance; at 1.001e-5 it would not."""
    x = (np.arange(64, dtype=np.float32).reshape(2, 32) - 15.5) * 1e-4
    gamma = np.ones(32, np.float32)
    got = _graph_norm(x, gamma, None, 1e-12, for_lite=False)
    assert np.allclose(got.std(-1), 1.0, atol=1e-3)
