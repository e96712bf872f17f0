"""Long sentence pairs cut before they are tokenized (``server/model/pair_cuts.py``): for every
family's tokenizer (WordPiece, byte-level BPE, SentencePiece Unigram), either truncation side
and an even or odd room, the cut pair gives the ids the whole pair gives, and says it was cut
when the whole pair is; and what is tokenized stays near the model's length, however long the
sides (whole, the library tokenizes every window of one side with every window of the other)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from bertserve.server.model.explained import explained as shown
from bertserve.server.model.pair_cuts import cut_pair, cut_starts, long_side
from bertserve.server.model.tokenization import ModelTokenizer, split_pair

pytestmark = pytest.mark.timeout(120)

DATA = Path(__file__).resolve().parents[3] / "data"
TOKENIZERS = {
    "wordpiece": DATA / "tasks" / "rerank_bert",
    "byte-level BPE": DATA / "families" / "roberta",
    "unigram": DATA / "families" / "xlm_roberta",
    "mpnet": DATA / "families" / "mpnet",
}
WORDS = ["the", "quick", "brown", "fox", "jumps", "über", "naïve", "café", "日本語", "don't", "3.14", "e-mail", "🙂"]
SPACES = [" ", " ", " ", "  ", "\n", "\t", " \n "]


def _text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    parts = []
    for _ in range(words):
        parts += [rng.choice(WORDS) + rng.choice(["", "", "s", ",", "."]), rng.choice(SPACES)]
    return "".join(parts).strip()


def _tokenizer(folder: Path, max_len: int) -> ModelTokenizer:
    return ModelTokenizer(
        vocab_path=None, tokenizer_json=str(folder / "tokenizer.json"), do_lower_case=False, max_len=max_len
    )


LENGTHS = [(400, 400), (400, 300), (40, 400), (400, 12), (60, 55), (3, 4)]


@pytest.mark.parametrize("family", list(TOKENIZERS))
@pytest.mark.parametrize("max_len", [32, 33])
def test_a_cut_pair_gives_the_whole_pairs_ids(family: str, max_len: int) -> None:
    tokenizer = _tokenizer(TOKENIZERS[family], max_len)
    for seed, (first_words, second_words) in enumerate(LENGTHS):
        first, second = _text(seed, first_words), _text(seed + 100, second_words)
        for direction in ("right", "left"):
            whole = tokenizer._variant(direction).encode(first, second)
            cut = tokenizer.tokenize([f"{first} ||| {second}"], truncation_direction=direction)
            got = cut.input_ids[0, : cut.lengths[0]].tolist()
            assert got == list(whole.ids), (family, first_words, second_words, direction)
            assert bool(cut.truncated[0]) == bool(whole.overflowing)
            assert tokenizer.truncated([f"{first} ||| {second}"])[0] == bool(whole.overflowing)
            kept = cut_pair(tokenizer, first, second, direction)
            if long_side(tokenizer, first) and long_side(tokenizer, second):  # both long: cut near the length
                assert all(len(side) < 2_000 for side in kept), (family, first_words, second_words)
            else:  # one short side: tokenized whole, at the long side's cost alone
                assert kept == (first, second)


@pytest.mark.parametrize("direction", ["right", "left"])
def test_tokenize_explains_a_cut_pair_at_its_place_in_the_input(direction: str) -> None:
    tokenizer = _tokenizer(TOKENIZERS["wordpiece"], 32)
    text = f"  {_text(1, 300)}  |||  {_text(2, 250)} "
    explained = tokenizer.explain([text], truncate=True, truncation_direction=direction)
    whole = tokenizer._variant(direction).encode_batch([split_pair(text)])  # the pair uncut, as before
    assert explained == [shown(text, whole[0])]


def test_short_pairs_and_cut_starts_are_left_as_they_are() -> None:
    tokenizer = _tokenizer(TOKENIZERS["wordpiece"], 32)
    assert cut_pair(tokenizer, "a short one", "another", "right") == ("a short one", "another")
    assert cut_starts(("abcdef", "xyz"), ("def", "z"), "left") == (3, 2)
    assert cut_starts(("abcdef", "xyz"), ("abc", "x"), "right") == (0, 0)
    assert cut_starts("one text", "one text", "left") == (0, 0)
