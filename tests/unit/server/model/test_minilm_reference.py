"""The real all-MiniLM-L6-v2 weights against the numbers of the model's reference
implementation (``tests/data``), on all 130 inputs with max_seq_len 128."""

from __future__ import annotations

import numpy as np
import pytest
from bertserve.server import Encoder
from checks import cosine_rows

pytestmark = pytest.mark.minilm

STRATEGIES = ["REDUCE_MEAN", "REDUCE_MAX", "REDUCE_MEAN_MAX", "CLS_TOKEN", "SEP_TOKEN"]
THRESHOLD = {"fp32": 0.99999, "fp16": 0.999, "bf16": 0.999}  # bf16's is --dtype auto's on a CPU with bf16 instructions
# The pooling tests run every batch on TensorFlow: converting each of their graphs to LiteRT
# would cost 8 s apiece. The LiteRT path has its own test below, and the tiny model's tests
# compare it with TensorFlow for every pooling.
TF_ONLY = {"lite_max_tokens": 0}


def test_token_ids_are_identical(minilm: str, session_graph_dir: str, reference, reference_sentences) -> None:
    encoder = Encoder(minilm, max_seq_len=128, graph_dir=session_graph_dir)
    batch = encoder.tokenize(reference_sentences)
    ids = np.zeros_like(reference["input_ids"])
    ids[:, : batch.input_ids.shape[1]] = batch.input_ids
    np.testing.assert_array_equal(ids, reference["input_ids"])
    np.testing.assert_array_equal(batch.lengths, reference["lengths"])
    assert batch.truncated.tolist() == (reference["lengths"] == 128).tolist()


def test_vocab_txt_alone_tokenizes_the_same(minilm: str, tmp_path, reference, reference_sentences) -> None:
    """Without tokenizer.json, BERT's pipeline built from vocab.txt gives the same ids."""
    from bertserve.server.model.tokenization import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(
        vocab_path=f"{minilm}/vocab.txt", tokenizer_json=None, do_lower_case=True, max_len=128
    )
    batch = tokenizer.tokenize(reference_sentences)
    np.testing.assert_array_equal(batch.input_ids, reference["input_ids"][:, : batch.input_ids.shape[1]])


# Every pooling in fp32; the reduced precisions change the encoder layers, not the pooling, so
# they are checked with REDUCE_MEAN_MAX, which pools both ways.
POOLING_CASES = [(strategy, "fp32") for strategy in STRATEGIES] + [("REDUCE_MEAN_MAX", d) for d in ("bf16", "fp16")]


@pytest.mark.parametrize(("strategy", "dtype"), POOLING_CASES)
def test_pooling_at_layers_minus_one_and_minus_two(
    minilm: str, session_graph_dir: str, reference, reference_sentences, strategy: str, dtype: str
) -> None:
    # Both layers in one graph: pooling_layer [-1, -2] concatenates their results.
    encoder = Encoder(
        minilm,
        max_seq_len=128,
        pooling_strategy=strategy,
        pooling_layer=[-1, -2],
        normalize=False,
        dtype=dtype,
        graph_dir=session_graph_dir,
        **TF_ONLY,
    )
    got = encoder.encode(reference_sentences)
    assert got.dtype == np.float32
    width = got.shape[1] // 2
    for part, layer in ((got[:, :width], -1), (got[:, width:], -2)):
        similarity = cosine_rows(part, reference[f"{strategy}_{layer}"])
        assert similarity.min() >= THRESHOLD[dtype], (strategy, layer, dtype, similarity.min())


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_cls_pooled(minilm: str, session_graph_dir: str, reference, reference_sentences, dtype: str) -> None:
    encoder = Encoder(
        minilm,
        max_seq_len=128,
        pooling_strategy="CLS_POOLED",
        normalize=False,
        dtype=dtype,
        graph_dir=session_graph_dir,
        **TF_ONLY,
    )
    assert cosine_rows(encoder.encode(reference_sentences), reference["CLS_POOLED"]).min() >= THRESHOLD[dtype]


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_token_vectors(minilm: str, session_graph_dir: str, reference, reference_sentences, dtype: str) -> None:
    encoder = Encoder(
        minilm,
        max_seq_len=128,
        pooling_strategy="NONE",
        pooling_layer=-1,
        normalize=False,
        dtype=dtype,
        graph_dir=session_graph_dir,
        **TF_ONLY,
    )
    got = encoder.encode(reference_sentences[:16])
    want = reference["NONE_-1"]
    assert got.shape == want.shape == (16, 128, 384)
    lengths = reference["lengths"][:16]
    for row, n in enumerate(lengths):
        assert cosine_rows(got[row, :n], want[row, :n]).min() >= THRESHOLD[dtype]
        assert not got[row, n:].any()


def test_model_defaults_are_normalized_mean_of_the_last_layer(
    minilm: str, session_graph_dir: str, reference, reference_sentences
) -> None:
    encoder = Encoder(minilm, max_seq_len=128, graph_dir=session_graph_dir)
    assert encoder.config.pooling_strategy.value == "REDUCE_MEAN" and encoder.config.normalize
    want = reference["REDUCE_MEAN_-1"] / np.linalg.norm(reference["REDUCE_MEAN_-1"], axis=1, keepdims=True)
    got = encoder.encode(reference_sentences)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert cosine_rows(got, want).min() >= 0.99999
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert Encoder(minilm, graph_dir=session_graph_dir).config.max_seq_len == 256  # the model's own


def test_reduced_precision_graphs_are_half_the_size(minilm: str, session_graph_dir: str) -> None:
    sizes = {
        dtype: Encoder(minilm, max_seq_len=128, dtype=dtype, graph_dir=session_graph_dir, **TF_ONLY).graph_size
        for dtype in ("fp32", "fp16", "bf16")
    }
    for dtype in ("fp16", "bf16"):
        assert 0.45 <= sizes[dtype] / sizes["fp32"] <= 0.55, sizes


def test_single_sentences_on_litert_match_the_reference(
    minilm: str, session_graph_dir: str, reference, reference_sentences
) -> None:
    """The small-run path (one sentence at a time, on LiteRT) against the same numbers."""
    encoder = Encoder(minilm, max_seq_len=128, lite_max_tokens=128, graph_dir=session_graph_dir)
    assert encoder.uses_lite
    want = reference["REDUCE_MEAN_-1"] / np.linalg.norm(reference["REDUCE_MEAN_-1"], axis=1, keepdims=True)
    got = np.concatenate([encoder.encode([sentence]) for sentence in reference_sentences])
    assert cosine_rows(got, want).min() >= 0.99999
    np.testing.assert_allclose(got, want, atol=1e-4)
