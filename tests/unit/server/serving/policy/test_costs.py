"""A request's cost, counted before work (``server/serving/policy/costs.py``): the tokens of
model work, the bytes of the answer, the rows a client sends in one request, and sparse rows as
``[id, weight]`` pairs."""

from __future__ import annotations

import numpy as np
import pytest
from bertserve.client import tasks as t
from bertserve.client.core.chunking import request_limit
from bertserve.server.serving.policy import costs

RULE = costs.TokenRule(max_len=128, single=2, pair=3, stride=16)


def test_an_input_costs_at_most_its_bytes_and_specials_and_at_most_the_model_length() -> None:
    assert costs.input_tokens(RULE, ["hello"]) == 5 + 2
    assert costs.input_tokens(RULE, ["é" * 10]) == 20 + 2  # UTF-8 bytes, not characters
    assert costs.input_tokens(RULE, ["x" * 10_000]) == 128  # cut to the model's length
    assert costs.input_tokens(RULE, ["ab ||| cd"]) == 9 + 3  # a pair: its bytes, the pair's specials
    assert costs.input_tokens(RULE, [["hel", "##lo"]]) == 2 + 2  # pre-tokenized: a token each
    assert costs.input_tokens(RULE, ["hello"], prefix_bytes=7) == 12 + 2  # the prompt before it


def test_chunked_inputs_cost_every_window() -> None:
    # 126 tokens a window, 110 new ones after the first: 1000 bytes is 9 windows
    assert costs.input_tokens(RULE, ["x" * 1000], chunk=True) == 1000 + 2 * 9 + 16 * 8
    assert costs.input_tokens(RULE, ["x" * 1000 + " ||| y"], chunk=True) == 128  # a pair is cut, never chunked


def test_a_rerank_counts_its_query_in_every_pair() -> None:
    assert costs.pair_tokens(RULE, 99_990, [1] * 1000) == 128 * 1000
    assert costs.pair_tokens(RULE, 10, [5, 6]) == (10 + 5 + 3) + (10 + 6 + 3)
    assert costs.too_many_tokens(128_000, 128_000) is None
    message = costs.too_many_tokens(128_000, 20_000)
    assert message is not None and "128000" in message and "20000" in message and "--max-request-tokens" in message


@pytest.mark.parametrize(
    ("info", "dimensions", "row_bytes"),
    [
        ({"output_dim": 384}, None, 384 * 4),
        ({"output_dim": 384}, 128, 128 * 4),  # the dimensions kept
        ({"output_dim": 384, "output_dtype": "float16"}, None, 384 * 2),
        ({"output_dim": 384, "token_level": True, "max_seq_len": 256}, None, 384 * 256 * 4),
        ({"output_dim": 30522, "task": "sparse"}, None, 30522 * 8),  # every vocabulary entry, an id and a weight
        ({"output_dim": 1, "task": "rerank"}, None, 4),
        ({}, None, 0),  # no worker has said: nothing to count yet
    ],
)
def test_a_rows_bytes_by_what_the_model_answers(info: dict, dimensions: int | None, row_bytes: int) -> None:
    assert costs.reply_row_bytes(info, dimensions) == row_bytes


@pytest.mark.parametrize(
    ("task", "row_bytes"),
    [
        (None, 1024 * 4),  # its own task: the dense vector
        ("embed", 1024 * 4),
        ("multivector", 8192 * 1024 * 4),  # a vector at every position of its length
        ("sparse", 8192 * 8),  # a term a token, an id and a weight
        ("rerank", 4),
    ],
)
def test_a_late_models_row_is_counted_for_the_task_asked(task: str | None, row_bytes: int) -> None:
    bge_m3 = {"output_dim": 1024, "multivector_dim": 1024, "max_seq_len": 8192, "late": "bge-m3", "task": "embed"}
    assert costs.reply_row_bytes(bge_m3, None, task) == row_bytes
    colbert = {"output_dim": 96, "multivector_dim": 96, "max_seq_len": 300, "query_length": 32, "late": "colbert"}
    assert costs.reply_row_bytes({**colbert, "task": "multivector"}, None, "multivector") == 300 * 96 * 4


def test_an_answer_past_the_limit_says_how_many_inputs_fit() -> None:
    limit = 32 << 20
    assert costs.too_large_reply(21_845, 384 * 4, limit) is None
    message = costs.too_large_reply(100_000, 384 * 4, limit, " as JSON")
    assert message is not None and "send at most 21845 inputs" in message and "--max-reply-bytes" in message
    assert costs.reply_rows(1024, 10_000) == 1  # one input is always answered
    assert costs.reply_rows(1024, 0) is None


def test_clients_split_by_the_rows_an_answer_holds() -> None:
    assert request_limit({"max_request_size": 100_000, "max_reply_rows": 21_845}) == 21_845
    assert request_limit({"max_request_size": 500}) == 500
    assert request_limit({"max_reply_rows": 7}) == 7
    assert request_limit({}) is None


def test_sparse_rows_travel_as_pairs_and_read_back_as_the_dense_rows() -> None:
    rng = np.random.default_rng(0)
    dense = np.where(rng.random((5, 700)) < 0.03, rng.random((5, 700)).astype(np.float32) + 0.01, 0)
    dense[3] = 0  # a row with no term
    pairs = t.sparse_pairs(dense)
    assert pairs.shape == (5, int((dense != 0).sum(axis=1).max()), 2) and pairs.dtype == np.float32
    for by_pairs, by_dense in zip(t.sparse_rows(pairs), t.sparse_rows(dense), strict=True):
        assert by_pairs.indices.tolist() == by_dense.indices.tolist()
        np.testing.assert_array_equal(by_pairs.values, by_dense.values)
    for by_pairs, by_dense in zip(t.sparse_rows(pairs, 3), t.sparse_rows(dense, 3), strict=True):
        assert by_pairs.indices.tolist() == by_dense.indices.tolist()
    big = np.zeros((1, 250_002), np.float32)
    big[0, 250_001] = 1.5
    assert t.sparse_rows(t.sparse_pairs(big))[0].indices.tolist() == [250_001]  # ids past 2**16 exact


def test_a_late_models_token_vectors_are_counted_by_each_inputs_size() -> None:
    bge_m3 = {"output_dim": 1024, "multivector_dim": 1024, "max_seq_len": 8192, "late": "bge-m3"}
    sizes = costs.token_answer_bytes(bge_m3, ["a short text", "x" * 100_000], "multivector", 4)
    assert sizes == [(12 + costs.LATE_EXTRA_TOKENS) * 1024 * 4, 8192 * 1024 * 4]  # at most the model's length
    colbert = {"output_dim": 96, "multivector_dim": 96, "max_seq_len": 300, "query_length": 32, "late": "colbert"}
    assert costs.token_answer_bytes(colbert, ["q"], "multivector", 4, query=True) == [32 * 96 * 4]  # expanded
    packed = costs.token_answer_bytes(bge_m3, ["ab"], "outputs:embed,sparse,multivector", 4)
    assert packed == [(1 + 1 + 6 + 1) * 1024 * 4]  # counts, dense, 6 vectors, 12 sparse values in a row
    assert costs.answers_by_token(bge_m3, "multivector") and not costs.answers_by_token(bge_m3, "sparse")
    assert not costs.answers_by_token({"task": "embed"}, "multivector")
    assert costs.too_large_answer([10, 20, 30], 60) is None
    message = costs.too_large_answer([10, 20, 30, 40], 60, how="or ask for binary")
    assert message is not None and "send at most 3 of these inputs" in message and message.endswith("binary")
    assert costs.too_large_answer([100], 60) is None  # one input is always answered
    assert "send at most 1 of" in (costs.too_large_answer([100, 1], 60) or "")
