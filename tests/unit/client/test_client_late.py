"""The late-interaction helpers every client shares: several outputs packed in one array and
read back whole (counts in the first row, rows of the widest output's width, any subset and
order of outputs, ids exact), ``outputs`` checked, the compact forms of token vectors, the zero
rows of a padded answer left out, and MaxSim as ColBERT and BGE-M3 score."""

from __future__ import annotations

import numpy as np
import pytest
from bertserve.client import late, tasks as t


def answers(rng: np.random.Generator, rows: int = 3, dim: int = 8) -> dict[str, np.ndarray]:
    pairs = np.zeros((rows, 5, 2), np.float32)
    vectors = np.zeros((rows, 6, dim), np.float32)
    for i in range(rows):
        terms = i + 2  # 2, 3, 4 terms; padded with [0, 0]
        pairs[i, :terms, 0] = np.sort(rng.choice(250_000, terms, replace=False))
        pairs[i, :terms, 1] = rng.uniform(0.1, 2.0, terms)
        vectors[i, : 6 - i] = rng.standard_normal((6 - i, dim))
    return {"embed": rng.standard_normal((rows, dim)).astype(np.float32), "sparse": pairs, "multivector": vectors}


@pytest.mark.parametrize("outputs", [("embed", "sparse", "multivector"), ("multivector", "embed"), ("sparse",)])
def test_outputs_packed_in_one_array_read_back_whole(outputs: tuple[str, ...]) -> None:
    given = answers(np.random.default_rng(0))
    packed = late.pack_outputs({key: given[key] for key in outputs}, outputs, width=8)
    assert packed.dtype == np.float32 and packed.ndim == 3
    read = late.unpack_outputs(packed, outputs, {"embed": 8, "multivector": 8})
    for i, answer in enumerate(read):
        assert set(answer) == set(outputs)
        if "embed" in outputs:
            np.testing.assert_array_equal(answer["embed"], given["embed"][i])
        if "sparse" in outputs:
            (expected,) = t.sparse_rows(given["sparse"][i : i + 1])
            np.testing.assert_array_equal(answer["sparse"].indices, expected.indices)  # ids past 2**16, exact
            np.testing.assert_array_equal(answer["sparse"].values, expected.values)
        if "multivector" in outputs:
            np.testing.assert_array_equal(answer["multivector"], given["multivector"][i, : 6 - i])


def test_outputs_are_checked() -> None:
    assert late.check_outputs(["sparse", "embed"]) == ("sparse", "embed")
    for bad, message in (
        ("embed", "non-empty list"),
        ([], "non-empty list"),
        (["dense"], "not 'dense'"),
        (["embed"] * 2, "twice"),
    ):
        with pytest.raises(ValueError, match=message):
            late.check_outputs(bad)


def test_token_vectors_in_their_forms_and_without_padding() -> None:
    vectors = np.zeros((2, 4, 16), np.float32)
    vectors[0, :3] = np.random.default_rng(1).standard_normal((3, 16))
    vectors[1, :1] = 1.0
    rows = late.multivector_rows(vectors)
    assert [row.shape for row in rows] == [(3, 16), (1, 16)]
    assert late.multivector_form(rows[0], "float16").dtype == np.float16
    assert late.multivector_form(rows[0], "binary").shape == (3, 2)  # 16 bits: 2 bytes a vector
    np.testing.assert_array_equal(late.multivector_form(rows[1], "ubinary"), [[255, 255]])
    with pytest.raises(ValueError, match="unknown multivector type 'int8'"):
        late.multivector_form(rows[0], "int8")


def test_maxsim_sums_or_averages_each_query_tokens_best_match() -> None:
    query = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    document = np.array([[0.6, 0.8], [1.0, 0.0], [0.0, 0.5]], np.float32)
    assert late.maxsim(query, document) == pytest.approx(1.0 + 0.8)
    assert late.maxsim(query, document, mean=True) == pytest.approx(0.9)
