"""The truncation side and ``explain`` (tokens for display, in TEI's /tokenize shape), on the
tiny vocabulary and on the real all-MiniLM-L6-v2 tokenizer, whose ids are checked against
Hugging Face's (``tests/data/st_options_reference.npz``, made by
``benchmarks/make_st_reference.py``)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest
from bertserve.server import Encoder
from bertserve.server.model.tokenization import WordPieceTokenizer
from bertserve.server.testing import tiny_bert

DATA = Path(__file__).resolve().parents[3] / "data"
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world"]
WORDS += ["one", "two", "three", "good", "bad", "new", "old"]


@pytest.fixture(scope="module")
def st_reference() -> dict[str, np.ndarray]:
    with np.load(DATA / "st_options_reference.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def minilm_tokenizer(minilm: str) -> WordPieceTokenizer:
    return WordPieceTokenizer(
        vocab_path=None, tokenizer_json=os.path.join(minilm, "tokenizer.json"), do_lower_case=True, max_len=128
    )


@pytest.fixture(scope="module")
def tiny_json(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model with a tokenizer.json (tiny_hf has vocab.txt alone)."""
    directory = str(tmp_path_factory.mktemp("tiny_json"))
    return tiny_bert.write_tiny_bert(directory, "huggingface", seed=3, tokenizer_json=True)


def _tiny(directory: str, max_len: int, *, from_json: bool = False, lower: bool = True) -> WordPieceTokenizer:
    return WordPieceTokenizer(
        vocab_path=None if from_json else os.path.join(directory, "vocab.txt"),
        tokenizer_json=os.path.join(directory, "tokenizer.json") if from_json else None,
        do_lower_case=lower,
        max_len=max_len,
    )


def _rows(batch) -> list[list[int]]:
    return [row[:length].tolist() for row, length in zip(batch.input_ids, batch.lengths, strict=True)]


# -- the real tokenizer against Hugging Face's ----------------------------------------------


@pytest.mark.minilm
def test_explain_ids_are_hugging_faces(minilm_tokenizer: WordPieceTokenizer, st_reference) -> None:
    sentences = st_reference["sentences"].tolist()
    explained = minilm_tokenizer.explain(sentences)
    assert len(explained) == len(sentences) == 148
    for i, tokens in enumerate(explained):
        expected = st_reference["hf_ids"][i, : st_reference["hf_lengths"][i]].tolist()
        assert [t["id"] for t in tokens] == expected, sentences[i]
    # The long rows are explained whole: explain does not cut unless asked.
    assert max(len(t) for t in explained) == st_reference["hf_ids"].shape[1] > 128


@pytest.mark.minilm
def test_explain_without_special_tokens(minilm_tokenizer: WordPieceTokenizer, st_reference) -> None:
    sentences = st_reference["sentences"].tolist()
    for i, tokens in enumerate(minilm_tokenizer.explain(sentences, add_special_tokens=False)):
        expected = st_reference["hf_ids"][i, 1 : st_reference["hf_lengths"][i] - 1].tolist()
        assert [t["id"] for t in tokens] == expected
        assert not any(t["special"] for t in tokens)


@pytest.mark.minilm
@pytest.mark.parametrize("side", ["right", "left"])
def test_truncation_on_either_side_is_hugging_faces(
    minilm_tokenizer: WordPieceTokenizer, st_reference, side: str
) -> None:
    sentences = st_reference["sentences"].tolist()
    ids, lengths = st_reference[f"hf_ids_{side}128"], st_reference[f"hf_lengths_{side}128"]
    batch = minilm_tokenizer.tokenize(sentences, truncation_direction=side)
    np.testing.assert_array_equal(batch.input_ids, ids[:, : batch.input_ids.shape[1]])
    np.testing.assert_array_equal(batch.lengths, lengths)
    np.testing.assert_array_equal(batch.truncated, st_reference["hf_lengths"] > 128)
    assert set(st_reference["long_rows"].tolist()) <= set(np.flatnonzero(batch.truncated).tolist())
    explained = minilm_tokenizer.explain(sentences, truncate=True, truncation_direction=side)
    assert [[t["id"] for t in tokens] for tokens in explained] == _rows(batch)


@pytest.mark.minilm
def test_the_sides_differ_on_long_inputs_only(minilm_tokenizer: WordPieceTokenizer, st_reference) -> None:
    right, left = st_reference["hf_ids_right128"], st_reference["hf_ids_left128"]
    long_rows = st_reference["long_rows"]
    short = np.setdiff1d(np.flatnonzero(st_reference["hf_lengths"] <= 128), long_rows)
    np.testing.assert_array_equal(right[short], left[short])
    for row in long_rows:
        whole = st_reference["hf_ids"][row, : st_reference["hf_lengths"][row]]
        assert left[row, 0] == whole[0] and left[row, -1] == whole[-1]  # [CLS] ... [SEP]
        np.testing.assert_array_equal(left[row, 1:-1], whole[-127:-1])  # the end of the input
        np.testing.assert_array_equal(right[row, 1:-1], whole[1:127])  # its start


@pytest.mark.minilm
@pytest.mark.parametrize("side", ["right", "left"])
def test_pre_tokenized_input_is_cut_like_text(minilm_tokenizer: WordPieceTokenizer, st_reference, side: str) -> None:
    rows = [*st_reference["long_rows"].tolist(), 0, 1, 135]
    tokens = [
        minilm_tokenizer.tokens_of(st_reference["hf_ids"][row, : st_reference["hf_lengths"][row]].tolist())
        for row in rows
    ]
    batch = minilm_tokenizer.tokenize(tokens, is_tokenized=True, truncation_direction=side)
    expected = [
        st_reference[f"hf_ids_{side}128"][row, : st_reference[f"hf_lengths_{side}128"][row]].tolist() for row in rows
    ]
    assert _rows(batch) == expected
    assert batch.truncated.tolist() == [True] * len(st_reference["long_rows"]) + [False] * 3


@pytest.mark.minilm
def test_chunked_windows_do_not_depend_on_the_side(minilm_tokenizer: WordPieceTokenizer, st_reference) -> None:
    """Windows cover all of a single input whichever the side; a pair is still cut, on its side."""
    long_text = str(st_reference["sentences"][st_reference["long_rows"][-1]])
    pair = f"{long_text} ||| {long_text}"
    for is_tokenized in (False, True):
        inputs: list = [long_text, pair, "a short one"]
        if is_tokenized:
            inputs = [
                [t["text"] if not t["special"] else "|||" for t in e[1:-1]] for e in minilm_tokenizer.explain(inputs)
            ]
        right = minilm_tokenizer.tokenize(inputs, is_tokenized=is_tokenized, chunk=True)
        left = minilm_tokenizer.tokenize(inputs, is_tokenized=is_tokenized, chunk=True, truncation_direction="left")
        assert right.owners is not None and left.owners is not None
        np.testing.assert_array_equal(right.owners, left.owners)
        windows = right.owners == 0
        np.testing.assert_array_equal(right.input_ids[windows], left.input_ids[windows])
        pair_row = int(np.flatnonzero(right.owners == 1)[0])
        unchunked = minilm_tokenizer.tokenize(inputs[1:2], is_tokenized=is_tokenized, truncation_direction="left")
        assert _rows(left.take(np.array([pair_row]))) == _rows(unchunked)
        assert _rows(right.take(np.array([pair_row]))) != _rows(unchunked)


# -- explain: TEI's token dicts ----------------------------------------------------------------


@pytest.mark.minilm
def test_explain_gives_code_point_offsets_into_the_input(minilm_tokenizer: WordPieceTokenizer) -> None:
    text = "café naïve 😀 日本 walking"
    (tokens,) = minilm_tokenizer.explain([text])
    assert tokens == [
        {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None},
        {"id": 7668, "text": "café", "special": False, "start": 0, "stop": 4},
        {"id": 15743, "text": "naïve", "special": False, "start": 5, "stop": 10},
        {"id": 100, "text": "😀", "special": False, "start": 11, "stop": 12},
        {"id": 1864, "text": "日", "special": False, "start": 13, "stop": 14},
        {"id": 1876, "text": "本", "special": False, "start": 14, "stop": 15},
        {"id": 3788, "text": "walking", "special": False, "start": 16, "stop": 23},
        {"id": 102, "text": "[SEP]", "special": True, "start": None, "stop": None},
    ]


@pytest.mark.minilm
def test_every_token_text_is_its_slice_of_the_input(minilm_tokenizer: WordPieceTokenizer, st_reference) -> None:
    sentences = [*st_reference["sentences"].tolist(), "  padded ||| pair\twith  spaces ", "a|||b"]
    for text, tokens in zip(sentences, minilm_tokenizer.explain(sentences), strict=True):
        for token in tokens:
            if token["special"]:
                assert token["start"] is None and token["stop"] is None
                assert token["text"] in ("[CLS]", "[SEP]")
            else:
                assert 0 <= token["start"] < token["stop"] <= len(text)
                assert token["text"] == text[token["start"] : token["stop"]]
        starts = [t["start"] for t in tokens if not t["special"]]
        assert starts == sorted(starts)


def test_word_pieces_show_their_part_of_the_word(tiny_hf: str) -> None:
    (tokens,) = _tiny(tiny_hf, 32).explain(["Walking dogs"])
    assert [(t["text"], t["start"], t["stop"]) for t in tokens] == [
        ("[CLS]", None, None),
        ("Walk", 0, 4),
        ("ing", 4, 7),
        ("dog", 8, 11),
        ("s", 11, 12),
        ("[SEP]", None, None),
    ]


def test_pair_offsets_index_the_whole_input(tiny_hf: str) -> None:
    tokenizer = _tiny(tiny_hf, 32)
    text = "  hello  world ||| the dog  "
    (tokens,) = tokenizer.explain([text])
    assert [(t["text"], t["start"], t["stop"], t["special"]) for t in tokens] == [
        ("[CLS]", None, None, True),
        ("hello", 2, 7, False),
        ("world", 9, 14, False),
        ("[SEP]", None, None, True),
        ("the", 19, 22, False),
        ("dog", 23, 26, False),
        ("[SEP]", None, None, True),
    ]
    assert [t["id"] for t in tokens] == _rows(tokenizer.tokenize([text]))[0]


@pytest.mark.parametrize("from_json", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_explain_cuts_as_tokenize_does(tiny_hf: str, tiny_json: str, from_json: bool, side: str) -> None:
    tokenizer = _tiny(tiny_json if from_json else tiny_hf, 6, from_json=from_json)
    texts = ["the quick brown fox jumps over", "hello", "one two three ||| good bad new", "你好世界中文"]
    explained = tokenizer.explain(texts, truncate=True, truncation_direction=side)
    assert [[t["id"] for t in tokens] for tokens in explained] == _rows(
        tokenizer.tokenize(texts, truncation_direction=side)
    )
    whole = tokenizer.explain(texts)
    assert [len(t) for t in whole] == [8, 3, 9, 8]
    assert [len(t) for t in explained] == [6, 3, 6, 6]
    if side == "left":
        assert [t["text"] for t in explained[0]] == ["[CLS]", "brown", "fox", "jumps", "over", "[SEP]"]
        assert [t["text"] for t in explained[2]] == ["[CLS]", "three", "[SEP]", "bad", "new", "[SEP]"]
        assert [t["text"] for t in explained[3]] == ["[CLS]", "世", "界", "中", "文", "[SEP]"]
    else:
        assert [t["text"] for t in explained[2]] == ["[CLS]", "one", "[SEP]", "good", "bad", "[SEP]"]


def test_explain_of_nothing(tiny_hf: str) -> None:
    assert _tiny(tiny_hf, 8).explain([]) == []


# -- the truncation side on the tiny vocabulary ------------------------------------------------


@pytest.mark.parametrize("from_json", [False, True])
def test_left_keeps_the_end(tiny_hf: str, tiny_json: str, from_json: bool) -> None:
    tokenizer = _tiny(tiny_json if from_json else tiny_hf, 6, from_json=from_json)
    texts = ["the quick brown fox jumps over", "one two three ||| good bad new old"]
    right = tokenizer.tokenize(texts, keep_tokens=True)
    left = tokenizer.tokenize(texts, keep_tokens=True, truncation_direction="left")
    assert right.tokens == [
        ["[CLS]", "the", "quick", "brown", "fox", "[SEP]"],
        ["[CLS]", "one", "[SEP]", "good", "bad", "[SEP]"],
    ]
    assert left.tokens == [
        ["[CLS]", "brown", "fox", "jumps", "over", "[SEP]"],
        ["[CLS]", "three", "[SEP]", "new", "old", "[SEP]"],
    ]
    assert left.truncated.tolist() == right.truncated.tolist() == [True, True]
    np.testing.assert_array_equal(left.segment_ids, right.segment_ids)


@pytest.mark.parametrize("from_json", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_pre_tokenized_pairs_are_cut_like_text_pairs(tiny_hf: str, tiny_json: str, from_json: bool, side: str) -> None:
    """Every split of the budget, as the tokenizers library's longest_first makes it."""
    for max_len in (5, 6, 7, 8):
        tokenizer = _tiny(tiny_json if from_json else tiny_hf, max_len, from_json=from_json)
        for a, b in itertools.product(range(7), repeat=2):
            first, second = WORDS[:a], WORDS[len(WORDS) - b :]
            if not first:
                continue
            text = " ".join(first) + (" ||| " + " ".join(second) if second else "")
            tokens = first + (["|||", *second] if second else [])
            as_text = tokenizer.tokenize([text], truncation_direction=side)
            as_tokens = tokenizer.tokenize([tokens], is_tokenized=True, truncation_direction=side)
            assert _rows(as_tokens) == _rows(as_text), (max_len, a, b)
            assert as_tokens.truncated.tolist() == as_text.truncated.tolist()


def test_counts_and_truncated_flags_do_not_depend_on_the_side(tiny_hf: str) -> None:
    tokenizer = _tiny(tiny_hf, 6)
    texts = ["the quick brown fox jumps over", "hello", "one two three ||| good bad new"]
    counts = tokenizer.count_tokens(texts).tolist()
    for side in ("right", "left"):
        batch = tokenizer.tokenize(texts, truncation_direction=side)
        assert batch.lengths.tolist() == counts == [6, 3, 6]
        assert batch.truncated.tolist() == tokenizer.truncated(texts).tolist() == [True, False, True]


def test_the_left_tokenizer_keeps_the_case_setting(tiny_json: str) -> None:
    """A tokenizer.json that lower-cases, used with do_lower_case=False: its left-cutting and
    explaining copies keep the override (the tiny vocabulary is lower-case: "Hello" is unknown)."""
    tokenizer = _tiny(tiny_json, 8, from_json=True, lower=False)
    right = tokenizer.tokenize(["Hello world"], keep_tokens=True)
    left = tokenizer.tokenize(["Hello world"], keep_tokens=True, truncation_direction="left")
    assert right.tokens == left.tokens == [["[CLS]", "[UNK]", "world", "[SEP]"]]
    assert [t["id"] for t in tokenizer.explain(["Hello world"])[0]] == _rows(right)[0]


@pytest.mark.parametrize("direction", ["up", "Left", "", None])
def test_an_unknown_direction_is_refused(tiny_hf: str, direction) -> None:
    tokenizer = _tiny(tiny_hf, 8)
    with pytest.raises(ValueError, match=r"truncation_direction must be 'right' or 'left'"):
        tokenizer.tokenize(["hello"], truncation_direction=direction)
    with pytest.raises(ValueError, match=r"truncation_direction must be 'right' or 'left'"):
        tokenizer.tokenize([["hello"]], is_tokenized=True, truncation_direction=direction)
    with pytest.raises(ValueError, match=r"truncation_direction must be 'right' or 'left'"):
        tokenizer.explain(["hello"], truncation_direction=direction)


def test_the_encoder_passes_the_side_on(tiny_hf: str, session_graph_dir: str) -> None:
    encoder = Encoder(tiny_hf, max_seq_len=6, graph_dir=session_graph_dir)
    text = ["the quick brown fox jumps over"]
    assert encoder.tokenize(text, keep_tokens=True).tokens == [["[CLS]", "the", "quick", "brown", "fox", "[SEP]"]]
    left = encoder.tokenize(text, keep_tokens=True, truncation_direction="left")
    assert left.tokens == [["[CLS]", "brown", "fox", "jumps", "over", "[SEP]"]]
    assert left.truncated.tolist() == [True]
    with pytest.raises(ValueError, match="truncation_direction"):
        encoder.tokenize(text, truncation_direction="middle")
