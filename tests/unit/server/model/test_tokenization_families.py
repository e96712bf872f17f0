"""The tokenizer of every encoder family, against the ``tokenizers`` library itself (what
Hugging Face's fast tokenizers run), configured with the same truncation.

Each family's ``tokenizer.json`` is trained here on ``tests/data/sentences.json``, with the
model, normalizer, pre-tokenizer and post-processor its models ship: WordPiece with
BertProcessing (BERT, DistilBERT) and with MPNet's ``<s> A </s></s> B </s>``; byte-level BPE
with RobertaProcessing (RoBERTa) and with ``[CLS] A [SEP] B [SEP]`` (ModernBERT); SentencePiece
Unigram with Metaspace and XLM-R's template. The ids, type ids, truncation on both sides,
chunk windows, pre-tokenized input and ``explain``'s offsets must be the library's for every
sentence, non-ASCII text and pairs. Real tokenizers where installed, and the tiny family
models' reference ids in ``tests/data/families/`` where present, are checked the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bertserve.server.errors import ModelFileError, ModelOptionError
from bertserve.server.model.tokenization import ModelTokenizer, WordPieceTokenizer, split_pair
from real_models import REAL_MODELS
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

DATA = Path(__file__).resolve().parents[3] / "data"
SENTENCES: list[str] = json.loads((DATA / "sentences.json").read_text())
NON_ASCII = [
    "Crème brûlée, naïve café déjà vu à Zürich",
    "日本語のテキストと中文句子",
    "emoji 😀👍🏽 and flags 🇫🇷 mixed in",
    "Ελληνικά и русский текст",
    "  leading and trailing spaces   ",
    "tabs\tand\nnewlines  and   runs of spaces",
    "ﬁligree ligatures and full-width ＡＢＣ",
]
PAIRS = [f"{a} ||| {b}" for a, b in zip(SENTENCES[::2], SENTENCES[1::2], strict=False)][:40]
PAIRS += [f"{NON_ASCII[i]} ||| {NON_ASCII[-1 - i]}" for i in range(len(NON_ASCII))]
PAIRS += ["  padded ||| pair\twith  spaces ", "a|||b", "only a first side ||| "]
TEXTS = SENTENCES + NON_ASCII + PAIRS

ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _trained(tokenizer: Tokenizer, trainer: Any) -> Tokenizer:
    tokenizer.train_from_iterator(SENTENCES + NON_ASCII, trainer)
    return tokenizer


def _template(tokenizer: Tokenizer, cls: str, sep: str, pair: str) -> None:
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=pair,
        special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))],
    )


def _wordpiece(specials: list[str], unk: str) -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return _trained(tokenizer, trainers.WordPieceTrainer(vocab_size=500, special_tokens=specials, show_progress=False))


def bert() -> Tokenizer:
    tokenizer = _wordpiece(BERT_SPECIALS, "[UNK]")
    cls, sep = ("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))
    tokenizer.post_processor = processors.BertProcessing(sep, cls)
    return tokenizer


def mpnet() -> Tokenizer:
    """transformers' MPNetConverter: two ``</s>`` between the sides, the second side of type 1."""
    tokenizer = _wordpiece(["<s>", "<pad>", "</s>", "[UNK]", "<mask>"], "[UNK]")
    _template(tokenizer, "<s>", "</s>", "<s>:0 $A:0 </s>:0 </s>:0 $B:1 </s>:1")
    return tokenizer


def _byte_level_bpe(specials: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())  # no unknown token: any text is spelt in bytes
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=700, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    return _trained(tokenizer, trainer)


def roberta() -> Tokenizer:
    tokenizer = _byte_level_bpe(ROBERTA_SPECIALS)
    cls, sep = ("<s>", tokenizer.token_to_id("<s>")), ("</s>", tokenizer.token_to_id("</s>"))
    tokenizer.post_processor = processors.RobertaProcessing(sep, cls, trim_offsets=True, add_prefix_space=False)
    return tokenizer


def modernbert() -> Tokenizer:
    tokenizer = _byte_level_bpe(["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    _template(tokenizer, "[CLS]", "[SEP]", "[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1")
    return tokenizer


def xlm_roberta() -> Tokenizer:
    """SentencePiece Unigram as XLM-R's tokenizer.json has it (NFKC for its precompiled charsmap)."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=600, special_tokens=ROBERTA_SPECIALS[:4], unk_token="<unk>", show_progress=False
    )
    _trained(tokenizer, trainer)
    _template(tokenizer, "<s>", "</s>", "<s>:0 $A:0 </s>:0 </s>:0 $B:0 </s>:0")
    return tokenizer


# name: (how to make it, first and last special of a single input, specials of an input and of a pair, unknown)
FAMILIES: dict[str, tuple[Callable[[], Tokenizer], tuple[str, str], tuple[int, int], str | None]] = {
    "bert": (bert, ("[CLS]", "[SEP]"), (2, 3), "[UNK]"),
    "mpnet": (mpnet, ("<s>", "</s>"), (2, 4), "[UNK]"),
    "roberta": (roberta, ("<s>", "</s>"), (2, 4), None),
    "modernbert": (modernbert, ("[CLS]", "[SEP]"), (2, 3), None),
    "xlm-roberta": (xlm_roberta, ("<s>", "</s>"), (2, 4), "<unk>"),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A family's name and the path of its trained tokenizer.json."""
    name = request.param
    path = tmp_path_factory.mktemp(name) / "tokenizer.json"
    FAMILIES[name][0]().save(str(path))
    return name, str(path)


def ours(path: str, max_len: int, stride: int = 0, lower: bool = True) -> ModelTokenizer:
    return ModelTokenizer(vocab_path=None, tokenizer_json=path, do_lower_case=lower, max_len=max_len, stride=stride)


def theirs(path: str, max_len: int | None = None, side: str = "right", stride: int = 0) -> Tokenizer:
    """``path`` as transformers 5 runs it: the library's tokenizer, a Unigram model made again
    from the scores as Python's JSON parser reads them."""
    tokenizer = Tokenizer.from_file(path)
    if isinstance(tokenizer.model, models.Unigram):
        model = json.loads(Path(path).read_text())["model"]
        tokenizer.model = models.Unigram([tuple(v) for v in model["vocab"]], model["unk_id"], False)
    tokenizer.no_padding()
    if max_len is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_len, strategy="longest_first", stride=stride, direction=side)
    return tokenizer


def _rows(batch: Any) -> list[list[int]]:
    return [row[:n].tolist() for row, n in zip(batch.input_ids, batch.lengths, strict=True)]


def _types(batch: Any) -> list[list[int]]:
    return [row[:n].tolist() for row, n in zip(batch.segment_ids, batch.lengths, strict=True)]


def _side_ids(encoding: Any, side: int) -> list[int]:
    return [i for i, s in zip(encoding.ids, encoding.sequence_ids, strict=True) if s == side]


def _as_tokens(tokenizer: ModelTokenizer, text: str, whole: Tokenizer) -> list[str]:
    """``text`` as the pre-tokenized input whose tokens are its model tokens (a pair's sides
    joined by ``|||``)."""
    sides = split_pair(text)
    if isinstance(sides, str):
        return tokenizer.tokens_of(whole.encode(sides).ids)
    encoding = whole.encode(*sides)
    first, second = ([whole.id_to_token(i) for i in _side_ids(encoding, s)] for s in (0, 1))
    return [*first, "|||", *second]


# -- the model's own template ------------------------------------------------------------------


def test_the_special_tokens_are_read_from_the_post_processor(family: tuple[str, str]) -> None:
    name, path = family
    _, (first, last), specials, unk = FAMILIES[name]
    tokenizer, reference = ours(path, 32), theirs(path)
    assert (tokenizer.cls_id, tokenizer.sep_id) == (reference.token_to_id(first), reference.token_to_id(last))
    assert (tokenizer.num_special_tokens(), tokenizer.num_special_tokens(pair=True)) == specials
    assert tokenizer.unk_id == (None if unk is None else reference.token_to_id(unk))
    assert tokenizer.vocab_size == reference.get_vocab_size()
    assert WordPieceTokenizer is ModelTokenizer


@pytest.mark.parametrize("side", ["right", "left"])
def test_ids_type_ids_and_truncation_are_the_librarys(family: tuple[str, str], side: str) -> None:
    _, path = family
    for max_len in (24, 128):
        batch = ours(path, max_len).tokenize(TEXTS, truncation_direction=side, keep_tokens=True)
        expected = theirs(path, max_len, side).encode_batch([split_pair(t) for t in TEXTS])
        assert _rows(batch) == [e.ids for e in expected]
        assert _types(batch) == [e.type_ids for e in expected]
        assert batch.tokens == [e.tokens for e in expected]
        assert batch.truncated.tolist() == [bool(e.overflowing) for e in expected]
    assert batch.truncated.any() and not batch.truncated.all()


@pytest.mark.parametrize("side", ["right", "left"])
def test_pairs_are_cut_longest_first_with_the_models_specials(family: tuple[str, str], side: str) -> None:
    """Every split of a small budget between a pair's sides."""
    _, path = family
    pairs = PAIRS[::8] + PAIRS[-len(NON_ASCII) - 3 :]  # tiny budgets make the library list many windows
    for max_len in (7, 10, 13):
        tokenizer, reference = ours(path, max_len), theirs(path, max_len, side)
        batch = tokenizer.tokenize(pairs, truncation_direction=side)
        expected = reference.encode_batch([split_pair(t) for t in pairs])
        assert _rows(batch) == [e.ids for e in expected], max_len
        assert _types(batch) == [e.type_ids for e in expected], max_len
        assert (batch.lengths <= max_len).all()
        assert tokenizer.count_tokens(pairs).tolist() == batch.lengths.tolist()
        assert tokenizer.truncated(pairs).tolist() == batch.truncated.tolist()


def test_chunk_windows_are_the_librarys_overflow(family: tuple[str, str]) -> None:
    """A single input's windows (whatever the side) are the library's overflowing encodings;
    a pair is cut, not chunked."""
    _, path = family
    tokenizer, reference = ours(path, 16, stride=3), theirs(path, 16, stride=3)
    texts = [" ".join(SENTENCES[:6]), NON_ASCII[2] * 3, "short", PAIRS[0]]
    expected = reference.encode_batch([split_pair(t) for t in texts])
    windows = [[e.ids for e in (enc, *enc.overflowing)] for enc in expected[:3]]
    for side in ("right", "left"):
        batch = tokenizer.tokenize(texts, chunk=True, truncation_direction=side)
        assert batch.owners is not None
        rows = [[r for r, o in zip(_rows(batch), batch.owners, strict=True) if o == i] for i in range(4)]
        assert rows[:3] == windows
        assert rows[3] == [theirs(path, 16, side, 3).encode(*split_pair(texts[3])).ids]
        assert batch.truncated.tolist() == [False] * (len(batch) - 1) + [True]
    assert len(windows[0]) > 2
    counts = tokenizer.count_tokens(texts, chunk=True)
    assert counts.tolist() == [*(sum(map(len, w)) for w in windows), len(expected[3].ids)]


# -- pre-tokenized input and token ids ----------------------------------------------------------


@pytest.mark.parametrize("side", ["right", "left"])
def test_pre_tokenized_input_is_cut_like_text(family: tuple[str, str], side: str) -> None:
    """The model's own tokens of each text (as ids the HTTP front end reads become), given
    back pre-tokenized: the same ids, template, type ids and truncation as the text."""
    _, path = family
    whole = theirs(path)
    for max_len in (10, 24):
        tokenizer = ours(path, max_len)
        tokens = [_as_tokens(tokenizer, text, whole) for text in TEXTS]
        batch = tokenizer.tokenize(tokens, is_tokenized=True, truncation_direction=side, keep_tokens=True)
        from_text = tokenizer.tokenize(TEXTS, truncation_direction=side, keep_tokens=True)
        assert _rows(batch) == _rows(from_text)
        assert _types(batch) == _types(from_text)
        assert batch.tokens == from_text.tokens
        assert batch.truncated.tolist() == from_text.truncated.tolist()


def test_pre_tokenized_windows_are_the_texts(family: tuple[str, str]) -> None:
    _, path = family
    tokenizer = ours(path, 12, stride=2)
    texts = [" ".join(SENTENCES[:3]), NON_ASCII[0], PAIRS[1]]
    whole = theirs(path)
    tokens = [_as_tokens(tokenizer, text, whole) for text in texts]
    for side in ("right", "left"):
        from_tokens = tokenizer.tokenize(tokens, is_tokenized=True, chunk=True, truncation_direction=side)
        from_text = tokenizer.tokenize(texts, chunk=True, truncation_direction=side)
        assert _rows(from_tokens) == _rows(from_text)
        assert from_tokens.owners is not None and from_text.owners is not None
        assert from_tokens.owners.tolist() == from_text.owners.tolist()


def test_words_outside_the_vocabulary_are_split_into_the_models_tokens(family: tuple[str, str]) -> None:
    name, path = family
    tokenizer, whole = ours(path, 64), theirs(path)
    words = ["Zürich", "qwertzuiop", "日本", "😀"]
    (row,) = _rows(tokenizer.tokenize([words], is_tokenized=True))
    pieces = [
        [found] if (found := whole.token_to_id(w)) is not None else whole.encode(w, add_special_tokens=False).ids
        for w in words
    ]
    assert any(whole.token_to_id(w) is None for w in words)
    assert row == [tokenizer.cls_id, *[i for p in pieces for i in p], tokenizer.sep_id]
    assert tokenizer.tokenize([[]], is_tokenized=True).lengths.tolist() == [FAMILIES[name][2][0]]


def test_tokens_of_drops_the_models_specials_around_an_input(family: tuple[str, str]) -> None:
    name, path = family
    tokenizer, whole = ours(path, 64), theirs(path)
    encoding = whole.encode(SENTENCES[0])
    assert tokenizer.tokens_of(encoding.ids) == encoding.tokens[1:-1]
    assert tokenizer.tokens_of(encoding.ids[1:-1]) == encoding.tokens[1:-1]
    first, last = FAMILIES[name][1]
    with pytest.raises(ValueError, match=re.escape(f"no token is left once {first} and {last} are dropped")):
        tokenizer.tokens_of([tokenizer.cls_id, tokenizer.sep_id])
    with pytest.raises(ValueError, match=r"token id 100000 at \[1\] is not in the vocabulary"):
        tokenizer.tokens_of([tokenizer.cls_id, encoding.ids[1], 100000])


# -- explain: /tokenize ----------------------------------------------------------------------


def test_explain_offsets_are_the_librarys_in_the_input(family: tuple[str, str]) -> None:
    """Each token's text is its slice of the input, the library's offsets moved to where the
    side starts; special tokens have none; the tokens cover every character but spaces."""
    _, path = family
    tokenizer, whole = ours(path, 24), theirs(path)
    for text, tokens in zip(TEXTS, tokenizer.explain(TEXTS), strict=True):
        sides = split_pair(text)
        encoding = whole.encode(*sides) if isinstance(sides, tuple) else whole.encode(sides)
        assert [t["id"] for t in tokens] == encoding.ids
        for token, token_text, (start, stop), side in zip(
            tokens, encoding.tokens, encoding.offsets, encoding.sequence_ids, strict=True
        ):
            if side is None:
                assert token == {"id": token["id"], "text": token_text, "special": True, "start": None, "stop": None}
                continue
            side_text = sides[side] if isinstance(sides, tuple) else sides
            assert not token["special"]
            assert token["text"] == text[token["start"] : token["stop"]] == side_text[start:stop]
            assert token["stop"] - token["start"] == stop - start
        spans = {i for t in tokens if not t["special"] for i in range(t["start"], t["stop"])}
        cut = text.find("|||")
        separator = range(cut, cut + 3) if cut >= 0 else range(0)
        assert {i for i, c in enumerate(text) if not c.isspace() and i not in separator} <= spans, text


@pytest.mark.parametrize("side", ["right", "left"])
def test_explain_cuts_as_tokenize_does(family: tuple[str, str], side: str) -> None:
    _, path = family
    tokenizer = ours(path, 12)
    explained = tokenizer.explain(TEXTS, truncate=True, truncation_direction=side)
    assert [[t["id"] for t in tokens] for tokens in explained] == _rows(
        tokenizer.tokenize(TEXTS, truncation_direction=side)
    )
    bare = tokenizer.explain(NON_ASCII, add_special_tokens=False)
    expected = theirs(path).encode_batch(NON_ASCII, add_special_tokens=False)
    assert [[t["id"] for t in tokens] for tokens in bare] == [e.ids for e in expected]
    assert not any(t["special"] for tokens in bare for t in tokens)


def test_byte_level_tokens_of_one_character_all_point_at_it(family: tuple[str, str]) -> None:
    name, path = family
    (tokens,) = ours(path, 64).explain(["a 😀 b"])
    emoji = [t for t in tokens if t["text"] == "😀"]
    assert all((t["start"], t["stop"]) == (2, 3) for t in emoji)
    if name in ("roberta", "modernbert"):  # four bytes, in at least two tokens
        assert len(emoji) >= 2
        # RobertaProcessing trims a token's leading space from its offsets; ModernBERT's template does not
        assert [t["text"] for t in tokens if t["text"] == " b"] == ([] if name == "roberta" else [" b"])


def test_unigram_scores_are_read_as_transformers_reads_them() -> None:
    """The library's JSON reader can put a score a unit in the last place off, which decides
    exact ties: ``425000000`` is ``0`` + ``00000`` to transformers 5, ``00000`` + ``0`` to
    ``Tokenizer.from_file`` with the xlm_roberta family model's scores."""
    path = DATA / "families" / "xlm_roberta" / "tokenizer.json"
    if not path.is_file():
        pytest.skip("no tests/data/families/xlm_roberta: make it with benchmarks/make_family_references.py")
    tokenizer = ours(str(path), 128)
    held = json.loads(tokenizer._tokenizer.model.__getstate__())["vocab"]
    assert held == json.loads(path.read_text())["model"]["vocab"]
    for side in ("right", "left"):
        (tokens,) = tokenizer.tokenize(["Emax=425000000,"], keep_tokens=True, truncation_direction=side).tokens or [[]]
        assert tokens[-5:-2] == ["5", "0", "00000"]
    assert [t["text"] for t in tokenizer.explain(["425000000"])[0][-3:-1]] == ["0", "00000"]
    assert Tokenizer.from_file(str(path)).encode("Emax=425000000,").tokens[-5:-2] == ["5", "00000", "0"]


# -- options and refusals ---------------------------------------------------------------------


def test_do_lower_case_overrides_only_berts_normalizer(family: tuple[str, str]) -> None:
    name, path = family
    texts = ["Describe The Usual PROPERTIES of Unix", "Crème Brûlée"]
    kept = ours(path, 64, lower=False).tokenize(texts)
    if name in ("bert", "mpnet"):
        cased = theirs(path)
        normalizer = cased.normalizer
        normalizer.lowercase = False
        cased.normalizer = normalizer
        assert _rows(kept) == [e.ids for e in cased.encode_batch(texts)]
        assert _rows(kept) != [e.ids for e in theirs(path).encode_batch(texts)]
    else:  # the model's own normalizer, whatever do_lower_case says
        for lower in (False, True):
            assert _rows(ours(path, 64, lower=lower).tokenize(texts)) == [
                e.ids for e in theirs(path).encode_batch(texts)
            ]


def test_a_tokenizer_without_special_tokens_is_refused(tmp_path: Path) -> None:
    tokenizer = bert()
    tokenizer.post_processor = None
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ModelFileError, match=r"adds no special tokens around an input.*TemplateProcessing"):
        ours(str(tmp_path / "tokenizer.json"), 32)


def test_lengths_leave_room_for_the_models_specials(family: tuple[str, str]) -> None:
    name, path = family
    single, pair = FAMILIES[name][2]
    with pytest.raises(ModelOptionError, match=f"adds {pair} special tokens to a pair"):
        ours(path, pair)
    with pytest.raises(ModelOptionError, match=f"chunk_stride must be below .* {single} special tokens = {8 - single}"):
        ours(path, 8, stride=8 - single)
    ours(path, 8, stride=7 - single)


def test_same_vocabulary_compares_the_template_too(family: tuple[str, str], tmp_path: Path) -> None:
    name, path = family
    assert ours(path, 16).same_vocabulary(ours(path, 32, stride=3))
    other = Tokenizer.from_file(path)
    cls, sep = FAMILIES[name][1]
    other.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep} {sep}",
        pair=f"{cls} $A {sep} $B {sep}",
        special_tokens=[(cls, other.token_to_id(cls)), (sep, other.token_to_id(sep))],
    )
    other.save(str(tmp_path / "tokenizer.json"))
    assert not ours(path, 16).same_vocabulary(ours(str(tmp_path / "tokenizer.json"), 16))


# -- real tokenizers and the family models' reference ids ----------------------------------------


@pytest.mark.parametrize("model", REAL_MODELS, ids=lambda m: m.name)
def test_real_tokenizers_are_the_librarys(model: Any) -> None:
    directory = model.find()
    if directory is None:
        pytest.skip(model.missing)
    path = str(Path(directory) / "tokenizer.json")
    tokenizer = ours(path, 128)
    for side in ("right", "left"):
        batch = tokenizer.tokenize(TEXTS, truncation_direction=side)
        expected = theirs(path, 128, side).encode_batch([split_pair(t) for t in TEXTS])
        assert _rows(batch) == [e.ids for e in expected]
        assert _types(batch) == [e.type_ids for e in expected]
    whole = theirs(path)
    tokens = [_as_tokens(tokenizer, text, whole) for text in TEXTS]
    assert _rows(tokenizer.tokenize(tokens, is_tokenized=True)) == _rows(tokenizer.tokenize(TEXTS))


def _family_references() -> list[Path]:
    return sorted((DATA / "families").glob("*.npz")) if (DATA / "families").is_dir() else []


@pytest.mark.parametrize("npz", _family_references() or [None], ids=lambda p: p.stem if p else "none")
def test_the_family_models_reference_ids(npz: Path | None) -> None:
    """The ids transformers' tokenizer gave each tiny family model (``benchmarks/make_family_references.py``):
    its sentences cut on either side to the model's ``max_seq_length``, and its pairs."""
    if npz is None:
        pytest.skip("no tests/data/families/*.npz: make them with benchmarks/make_family_references.py")
    path = npz.with_suffix("") / "tokenizer.json"
    with np.load(npz) as data:
        reference = {key: data[key] for key in data.files}
    tokenizer = ours(str(path), json.loads(str(reference["meta"]))["max_seq_length"])
    sentences = reference["sentences"].tolist()
    for side, suffix in (("right", ""), ("left", "_left")):
        batch = tokenizer.tokenize(sentences, truncation_direction=side)
        ids, lengths = reference["ids" + suffix], reference["lengths" + suffix]
        assert _rows(batch) == [row[:n].tolist() for row, n in zip(ids, lengths, strict=True)], side
        assert batch.truncated.tolist() == (reference["untruncated_lengths"] > tokenizer.max_len).tolist()
    pairs = [f"{a} ||| {b}" for a, b in zip(reference["pairs_first"], reference["pairs_second"], strict=True)]
    batch = tokenizer.tokenize(pairs)
    assert batch.lengths.tolist() == reference["pair_lengths"].tolist()
    width = batch.input_ids.shape[1]
    np.testing.assert_array_equal(batch.input_ids, reference["pair_ids"][:, :width])
    np.testing.assert_array_equal(batch.segment_ids, reference["pair_type_ids"][:, :width])
