"""Long inputs in windows (``long_inputs="chunk"``): the ``Encoder`` against windows cut and
combined by hand, the tokenizer's windows, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from bertserve.server.config.model import ModelConfig, PoolingStrategy
from bertserve.server.errors import ModelOptionError
from bertserve.server.model.chunking import combine
from bertserve.server.model.encoder import Encoder
from bertserve.server.model.model_dir import inspect_model
from bertserve.server.model.tokenization import WordPieceTokenizer

MAX_LEN = 16
LONG = " ".join(f"the quick brown fox number {i} jumps over the lazy dog" for i in range(9))
TEXTS = [LONG, "a short one", LONG[: len(LONG) // 2], "the end"]


def word_pieces(model_dir: str, text: str) -> list[str]:
    """Every word piece of ``text``, uncut."""
    model = inspect_model(ModelConfig.of(model_dir=model_dir))
    whole = WordPieceTokenizer(
        vocab_path=model.vocab_path,
        tokenizer_json=model.tokenizer_json,
        do_lower_case=model.do_lower_case,
        max_len=100_000,
    )
    tokens = whole.tokenize([text], keep_tokens=True).tokens
    assert tokens is not None
    return tokens[0][1:-1]


def by_hand(encoder: Encoder, model_dir: str, text: str, stride: int) -> np.ndarray:
    """``text`` cut into windows of ``MAX_LEN`` tokens by hand, each encoded on its own, the
    vectors combined as the pooling says."""
    pieces = word_pieces(model_dir, text)
    content = MAX_LEN - 2
    starts = [0]
    while starts[-1] + content < len(pieces):
        starts.append(starts[-1] + content - stride)
    windows = [pieces[start : start + content] for start in starts]
    vectors = encoder.encode(windows, is_tokenized=True, normalize=False).astype(np.float64)
    weights = np.asarray([len(w) + (0 if encoder.spec.mask_cls_sep else 2) for w in windows], np.float64)
    layers = len(encoder.spec.pooling_layer)
    blocks = vectors.reshape(len(windows), layers, -1)
    strategy = encoder.spec.pooling_strategy
    if strategy is PoolingStrategy.REDUCE_MEAN:
        out = (blocks * weights[:, None, None]).sum(0) / weights.sum()
    elif strategy is PoolingStrategy.REDUCE_MAX:
        out = blocks.max(0)
    else:
        half = blocks.shape[-1] // 2
        mean = (blocks[:, :, :half] * weights[:, None, None]).sum(0) / weights.sum()
        out = np.concatenate([mean, blocks[:, :, half:].max(0)], axis=-1)
    out = out.reshape(-1)
    return out / np.linalg.norm(out) if encoder.spec.normalize else out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize(
    ("options", "stride"),
    [
        ({}, 0),
        ({}, 5),
        ({"pooling_strategy": "REDUCE_MAX", "pooling_layer": (-1,)}, 3),
        ({"pooling_strategy": "REDUCE_MEAN_MAX", "pooling_layer": (-1, -2), "normalize": True}, 4),
        ({"mask_cls_sep": True, "normalize": True}, 2),
    ],
)
def test_chunking_equals_windows_cut_and_combined_by_hand(
    tiny_hf: str, session_graph_dir: str, options: dict, stride: int
) -> None:
    encoder = Encoder(tiny_hf, max_seq_len=MAX_LEN, chunk_stride=stride, graph_dir=session_graph_dir, **options)
    got = encoder.encode(TEXTS, long_inputs="chunk")
    truncated = encoder.encode(TEXTS)
    for i in (0, 2):  # the long ones
        assert cosine(got[i], by_hand(encoder, tiny_hf, TEXTS[i], stride)) >= 0.99999
        assert cosine(got[i], truncated[i]) < 0.99999  # the rest of the text counted
    np.testing.assert_allclose(got[[1, 3]], truncated[[1, 3]], atol=1e-5)  # short ones are untouched


def test_a_chunking_encoder_chunks_by_default_and_truncates_on_request(tiny_hf: str, session_graph_dir: str) -> None:
    chunking = Encoder(tiny_hf, max_seq_len=MAX_LEN, long_inputs="chunk", graph_dir=session_graph_dir)
    plain = Encoder(tiny_hf, max_seq_len=MAX_LEN, graph_dir=session_graph_dir)
    np.testing.assert_allclose(chunking.encode(TEXTS), plain.encode(TEXTS, long_inputs="chunk"), atol=1e-5)
    np.testing.assert_allclose(chunking.encode(TEXTS, long_inputs="truncate"), plain.encode(TEXTS), atol=1e-5)
    _, tokens = chunking.encode(TEXTS, show_tokens=True)
    assert len(tokens) == len(TEXTS) and tokens[1] == ["[CLS]", "a", "short", "one", "[SEP]"]
    assert tokens[0].count("[CLS]") == len(tokens[0]) // MAX_LEN + 1  # one per window


@pytest.mark.parametrize("strategy", ["CLS_TOKEN", "SEP_TOKEN", "NONE", "CLS_POOLED"])
def test_poolings_of_one_position_or_every_token_refuse_to_chunk(
    tiny_hf: str, session_graph_dir: str, strategy: str
) -> None:
    layer = {"pooling_layer": (-1,)} if strategy == "CLS_POOLED" else {}
    with pytest.raises(ModelOptionError, match="long_inputs=chunk needs REDUCE_MEAN"):
        Encoder(tiny_hf, pooling_strategy=strategy, long_inputs="chunk", graph_dir=session_graph_dir, **layer)
    encoder = Encoder(tiny_hf, pooling_strategy=strategy, graph_dir=session_graph_dir, **layer)
    with pytest.raises(ModelOptionError, match=strategy):
        encoder.encode(TEXTS, long_inputs="chunk")


def test_the_tokenizer_cuts_text_and_token_lists_into_the_same_windows(tiny_hf: str) -> None:
    model = inspect_model(ModelConfig.of(model_dir=tiny_hf))
    tokenizer = WordPieceTokenizer(
        vocab_path=model.vocab_path,
        tokenizer_json=model.tokenizer_json,
        do_lower_case=model.do_lower_case,
        max_len=MAX_LEN,
        stride=3,
    )
    texts = [LONG, "short", "a pair of sentences that is long enough to be cut ||| and its second half here"]
    from_text = tokenizer.tokenize(texts, chunk=True)
    pieces = [word_pieces(tiny_hf, t) for t in texts[:2]]
    from_tokens = tokenizer.tokenize(pieces, is_tokenized=True, chunk=True)
    assert from_text.owners is not None and from_tokens.owners is not None
    windows = int((from_text.owners == 0).sum())
    np.testing.assert_array_equal(from_tokens.input_ids, from_text.input_ids[: windows + 1])
    assert (from_text.lengths <= MAX_LEN).all()
    assert from_text.owners.tolist() == [0] * windows + [1, 2]  # a pair is truncated, not chunked
    assert from_text.truncated.tolist() == [False] * (windows + 1) + [True]
    counts = tokenizer.count_tokens(texts, chunk=True)
    assert counts.tolist() == np.bincount(from_text.owners, weights=from_text.lengths).astype(int).tolist()


def test_combine_weighs_means_by_tokens_and_takes_maxima() -> None:
    vectors = np.asarray([[1.0, 0.0, 4.0, -1.0], [3.0, 2.0, 0.0, 5.0], [7.0, 7.0, 7.0, 7.0]], np.float32)
    owners, weights = np.asarray([0, 0, 1]), np.asarray([3, 1, 9])
    mean = combine(vectors, owners, weights, strategy=PoolingStrategy.REDUCE_MEAN, layers=1)
    np.testing.assert_allclose(mean, [[1.5, 0.5, 3.0, 0.5], [7, 7, 7, 7]])
    maximum = combine(vectors, owners, weights, strategy=PoolingStrategy.REDUCE_MAX, layers=1)
    np.testing.assert_allclose(maximum, [[3, 2, 4, 5], [7, 7, 7, 7]])
    both = combine(vectors, owners, weights, strategy=PoolingStrategy.REDUCE_MEAN_MAX, layers=2)
    # layer blocks [mean, max] of width 1: (1|0 and 3|2) and (4|-1 and 0|5)
    expected = np.asarray([[1.5, 2.0, 3.0, 5.0], [7, 7, 7, 7]])
    np.testing.assert_allclose(both, expected, rtol=1e-6)
