"""WordPiece tokenization with the ``tokenizers`` library, exactly as the model was trained.

A directory's ``tokenizer.json`` is used as it is; a bare ``vocab.txt`` gets BERT's own
pipeline (clean text, CJK characters split, accents stripped when lower-casing,
punctuation split, WordPiece with ``[UNK]``). Sentence pairs are written
``"first ||| second"``; pre-tokenized input is a list of tokens per sentence.

An input too long for ``max_len`` is cut on its right (its start is kept) or, with
``truncation_direction="left"``, on its left (its end is kept), as Hugging Face's tokenizers
do with ``truncation_side``: ``[CLS]`` and ``[SEP]`` are always kept.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from bertserve.client.protocol import PAIR_SEPARATOR, TRUNCATION_DIRECTIONS

from ..errors import ModelFileError, ModelOptionError

logger = logging.getLogger("bertserve.tokenizer")

CLS, SEP, UNK = "[CLS]", "[SEP]", "[UNK]"


@dataclass
class TokenizedBatch:
    """Token ids for a batch, padded to its longest member."""

    input_ids: np.ndarray  # int32 [batch, length]
    segment_ids: np.ndarray  # int32 [batch, length]
    lengths: np.ndarray  # int32 [batch]: real tokens, [CLS] and [SEP] included
    truncated: np.ndarray  # bool [batch]: the input did not fit in max_seq_len
    tokens: list[list[str]] | None = None
    # Chunked inputs: the input each row (a window) belongs to; None when a row is an input.
    owners: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def input_mask(self) -> np.ndarray:
        return (np.arange(self.input_ids.shape[1])[None, :] < self.lengths[:, None]).astype(np.int32)

    def take(self, index: np.ndarray) -> TokenizedBatch:
        """The rows ``index``, padded to their own longest member."""
        width = max(int(self.lengths[index].max(initial=0)), 1)
        return TokenizedBatch(
            self.input_ids[index, :width],
            self.segment_ids[index, :width],
            self.lengths[index],
            self.truncated[index],
            None if self.tokens is None else [self.tokens[i] for i in index],
        )


def tokens_per_input(batch: TokenizedBatch) -> list[list[str]] | None:
    """``batch.tokens`` with the windows of each chunked input joined, one list per input."""
    if batch.tokens is None or batch.owners is None:
        return batch.tokens
    joined: list[list[str]] = [[] for _ in range(int(batch.owners.max()) + 1)]
    for owner, tokens in zip(batch.owners.tolist(), batch.tokens, strict=True):
        joined[owner].extend(tokens)
    return joined


class WordPieceTokenizer:
    """Turns strings (or token lists) into padded id arrays, truncating to ``max_len``."""

    def __init__(
        self,
        *,
        vocab_path: str | None,
        tokenizer_json: str | None,
        do_lower_case: bool,
        max_len: int,
        stride: int = 0,
    ) -> None:
        from tokenizers import Tokenizer, normalizers

        if tokenizer_json is not None:
            try:
                tokenizer = Tokenizer.from_file(tokenizer_json)
            except Exception as exc:  # tokenizers raises a bare Exception on bad files
                raise ModelFileError(f"cannot read {tokenizer_json}: {exc}") from exc
            normalizer = tokenizer.normalizer
            lowercase = getattr(normalizer, "lowercase", None)
            if lowercase is not None and lowercase != do_lower_case:
                tokenizer.normalizer = normalizers.BertNormalizer(
                    clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=do_lower_case
                )
        elif vocab_path is not None:
            tokenizer = _bert_tokenizer(vocab_path, do_lower_case)
        else:
            raise ModelFileError("the model directory has neither tokenizer.json nor vocab.txt")
        tokenizer.no_padding()
        if not 0 <= stride < max_len - 2:
            raise ModelOptionError(f"chunk_stride must be below max_seq_len - 2 = {max_len - 2}, not {stride}")
        # stride: the tokens consecutive windows of a chunked input share
        tokenizer.enable_truncation(max_len, strategy="longest_first", stride=stride)
        self._tokenizer = tokenizer
        # the same tokenizer cutting on the left ("left") or not at all (None), made when first asked for
        self._variants: dict[str | None, Tokenizer] = {"right": tokenizer}
        self.max_len = max_len
        self.stride = stride
        cls_id, sep_id, unk_id = (tokenizer.token_to_id(t) for t in (CLS, SEP, UNK))
        if cls_id is None or sep_id is None or unk_id is None:
            raise ModelFileError("the vocabulary lacks one of [CLS], [SEP], [UNK]")
        self.cls_id: int = cls_id
        self.sep_id: int = sep_id
        self._unk_id: int = unk_id
        self._vocab_size = tokenizer.get_vocab_size()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def tokenize(
        self,
        texts: Sequence,
        *,
        is_tokenized: bool = False,
        keep_tokens: bool = False,
        chunk: bool = False,
        truncation_direction: str = "right",
    ) -> TokenizedBatch:
        """Ids of ``texts``, each cut to ``max_len`` tokens on the side ``truncation_direction``
        names; with ``chunk``, an input longer than that (not a pair) becomes windows of
        ``max_len`` tokens, rows of their own, consecutive ones sharing ``stride`` tokens
        (``.owners`` says whose each row is), whatever the side."""
        _check_direction(truncation_direction)
        left = truncation_direction == "left"
        windows: list[list[tuple[list[int], list[int], list[str], bool]]]
        if is_tokenized:
            windows = [self._encode_tokens(list(tokens), chunk, left) for tokens in texts]
        else:
            inputs = [split_pair(text) for text in texts]
            windows = [
                [(e.ids, e.type_ids, e.tokens, False) for e in (enc, *enc.overflowing)]
                if chunk and enc.overflowing and isinstance(text, str)
                else [(enc.ids, enc.type_ids, enc.tokens, bool(enc.overflowing))]
                for text, enc in zip(inputs, self._encode_batch(inputs, truncation_direction, chunk), strict=True)
            ]
        rows = [row for rows_of_input in windows for row in rows_of_input]
        owners = None
        if len(rows) > len(windows):
            owners = np.repeat(np.arange(len(windows)), [len(w) for w in windows]).astype(np.int32)
        n = len(rows)
        lengths = np.fromiter((len(r[0]) for r in rows), dtype=np.int32, count=n)
        width = max(int(lengths.max(initial=0)), 1)
        input_ids = np.zeros((n, width), dtype=np.int32)
        segment_ids = np.zeros((n, width), dtype=np.int32)
        for i, (ids, type_ids, _, _) in enumerate(rows):
            input_ids[i, : len(ids)] = ids
            segment_ids[i, : len(ids)] = type_ids
        truncated = np.fromiter((r[3] for r in rows), dtype=bool, count=n)
        tokens = [list(r[2]) for r in rows] if keep_tokens else None
        return TokenizedBatch(input_ids, segment_ids, lengths, truncated, tokens, owners)

    def explain(
        self,
        texts: Sequence[str],
        *,
        add_special_tokens: bool = True,
        truncate: bool = False,
        truncation_direction: str = "right",
    ) -> list[list[dict[str, Any]]]:
        """The tokens of each of ``texts``, to show them, in the shape of Text Embeddings
        Inference's ``/tokenize``: ``{"id", "text", "special", "start", "stop"}`` per token.

        A special token ([CLS], [SEP]) has its own text and null ``start``/``stop``; any other
        has the slice ``text[start:stop]`` of its input (``"café"`` for the token ``cafe``,
        ``"ing"`` for ``##ing``). Offsets count code points, as Python indexes a string (TEI's
        count UTF-8 bytes). They index the input as given, pairs too: a token of
        ``"a ||| b"``'s second side points past the ``|||``. The ids are those
        :meth:`tokenize` gives the model, cut as it cuts them when ``truncate``.
        """
        _check_direction(truncation_direction)
        inputs = [split_pair(text) for text in texts]
        tokenizer = self._variant(truncation_direction if truncate else None)
        encodings = tokenizer.encode_batch(inputs, add_special_tokens=add_special_tokens)
        return [_explained(text, enc) for text, enc in zip(texts, encodings, strict=True)]

    def _encode_batch(self, inputs: list, direction: str, chunk: bool) -> list:  # list[tokenizers.Encoding]
        if direction == "right":
            return self._tokenizer.encode_batch(inputs)
        if not chunk:
            return self._variant(direction).encode_batch(inputs)
        # Chunked, a single input's windows cover all of it from its start, whatever the side;
        # a pair is still cut, on the side asked for.
        pairs = [i for i, x in enumerate(inputs) if not isinstance(x, str)]
        singles = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        encodings: list = [None] * len(inputs)
        for indices, tokenizer in ((singles, self._tokenizer), (pairs, self._variant(direction))):
            if indices:
                for i, enc in zip(indices, tokenizer.encode_batch([inputs[i] for i in indices]), strict=True):
                    encodings[i] = enc
        return encodings

    def _variant(self, direction: str | None):  # -> tokenizers.Tokenizer
        found = self._variants.get(direction)
        if found is None:
            from tokenizers import Tokenizer

            found = Tokenizer.from_str(self._tokenizer.to_str())
            found.no_padding()
            if direction is None:
                found.no_truncation()
            else:
                found.enable_truncation(self.max_len, strategy="longest_first", stride=self.stride, direction=direction)
            self._variants[direction] = found
        return found

    def same_vocabulary(self, other: WordPieceTokenizer) -> bool:
        """Whether ``other`` maps every token to the same id."""
        return bool(self._tokenizer.get_vocab() == other._tokenizer.get_vocab())

    def count_tokens(self, texts: Sequence, *, is_tokenized: bool = False, chunk: bool = False) -> np.ndarray:
        """How many tokens each input becomes (after truncation; with ``chunk``, in all its
        windows), to sort and cut work by its cost."""
        if is_tokenized:
            if chunk:
                return np.fromiter((self._window_tokens(len(t)) for t in texts), dtype=np.int32, count=len(texts))
            return np.fromiter((min(len(t) + 2, self.max_len) for t in texts), dtype=np.int32, count=len(texts))
        # Without character offsets (tokenizers >= 0.20): the same ids, a fifth less time.
        encode = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)
        inputs = [split_pair(text) for text in texts]
        encodings = encode(inputs)
        if chunk:  # a pair is truncated, not chunked
            counts = (
                len(e.ids) + (sum(len(o.ids) for o in e.overflowing) if isinstance(text, str) else 0)
                for text, e in zip(inputs, encodings, strict=True)
            )
            return np.fromiter(counts, dtype=np.int32, count=len(texts))
        return np.fromiter((len(e.ids) for e in encodings), dtype=np.int32, count=len(texts))

    def _window_tokens(self, words: int) -> int:
        """Tokens in all the windows of an input of about ``words`` word pieces."""
        content, step = self.max_len - 2, self.max_len - 2 - self.stride
        windows = 1 if words <= content else 1 + -(-(words - content) // step)
        return words + 2 * windows + self.stride * (windows - 1)

    def count_whole(self, texts: Sequence[str]) -> list[int]:
        """How many tokens each of ``texts`` (no pairs) becomes uncut, without [CLS] and [SEP]:
        pieces of a long text can be counted one at a time this way, where a cut would keep
        every window of the whole text."""
        whole = self._variant(None)
        encode = getattr(whole, "encode_batch_fast", whole.encode_batch)
        return [len(e.ids) for e in encode(list(texts), add_special_tokens=False)]

    def truncated(self, texts: Sequence[str]) -> np.ndarray:
        """Which of ``texts`` are longer than ``max_len`` tokens and would be cut."""
        encodings = self._tokenizer.encode_batch([split_pair(text) for text in texts])
        return np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(texts))

    def tokens_of(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary tokens of token ids, for inputs given as ids; a leading [CLS] and a
        trailing [SEP] are dropped, since encoding adds them again."""
        ids = list(ids)
        if ids and ids[0] == self.cls_id:
            ids = ids[1:]
        if ids and ids[-1] == self.sep_id:
            ids = ids[:-1]
        tokens = []
        for i, token_id in enumerate(ids):
            token = self._tokenizer.id_to_token(token_id) if 0 <= token_id < self._vocab_size else None
            if token is None:
                raise ValueError(f"token id {token_id} at [{i}] is not in the vocabulary (0 to {self._vocab_size - 1})")
            tokens.append(token)
        if not tokens:
            raise ValueError("no token is left once [CLS] and [SEP] are dropped")
        return tokens

    def _encode_tokens(
        self, tokens: list[str], chunk: bool = False, left: bool = False
    ) -> list[tuple[list[int], list[int], list[str], bool]]:
        """Pre-tokenized input: vocabulary tokens are taken as they are, other words are
        split into word pieces; a ``|||`` token separates a pair. One row, cut on the left
        when ``left``, or with ``chunk`` the windows of a single input that does not fit."""
        if PAIR_SEPARATOR in tokens:
            cut = tokens.index(PAIR_SEPARATOR)
            sides = [tokens[:cut], tokens[cut + 1 :]]
        else:
            sides = [tokens]
        pieces: list[list[tuple[int, str]]] = []
        for side in sides:
            ids: list[tuple[int, str]] = []
            for token in side:
                token_id = self._tokenizer.token_to_id(token)
                if token_id is not None:
                    ids.append((token_id, token))
                    continue
                enc = self._tokenizer.encode(token, add_special_tokens=False)
                ids.extend(zip(enc.ids, enc.tokens, strict=True) if enc.ids else [(self._unk_id, UNK)])
            pieces.append(ids)
        budget = self.max_len - len(pieces) - 1
        truncated = sum(map(len, pieces)) > budget
        if chunk and truncated and len(pieces) == 1:
            (part,) = pieces
            step = budget - self.stride
            starts = range(0, max(1, len(part) - self.stride), step)
            return [self._with_specials([part[start : start + budget]], False) for start in starts]
        keep = _longest_first([len(part) for part in pieces], budget)
        pieces = [part[len(part) - k :] if left else part[:k] for part, k in zip(pieces, keep, strict=True)]
        return [self._with_specials(pieces, truncated)]

    def _with_specials(
        self, pieces: list[list[tuple[int, str]]], truncated: bool
    ) -> tuple[list[int], list[int], list[str], bool]:
        out_ids, out_types, out_tokens = [self.cls_id], [0], [CLS]
        for segment, part in enumerate(pieces):
            out_ids += [token_id for token_id, _ in part] + [self.sep_id]
            out_tokens += [token for _, token in part] + [SEP]
            out_types += [segment] * (len(part) + 1)
        return out_ids, out_types, out_tokens, truncated


def _longest_first(lengths: list[int], budget: int) -> list[int]:
    """How many tokens of each side to keep, as the ``tokenizers`` library's ``longest_first``
    keeps them: the shorter side whole if it takes at most half the budget, else half each,
    the odd token to the longer side (to the second of equals)."""
    if sum(lengths) <= budget:
        return lengths
    if len(lengths) == 1:
        return [budget]
    first, second = lengths
    short = min(first, second, budget // 2)
    return [budget - short, short] if first > second else [short, budget - short]


def _check_direction(direction: str) -> None:
    if direction not in TRUNCATION_DIRECTIONS:
        raise ValueError(f"truncation_direction must be 'right' or 'left', not {direction!r}")


def _explained(text: str, encoding: Any) -> list[dict[str, Any]]:
    """One token dict per token of ``encoding`` (of ``text``), with offsets into ``text``."""
    # tokenizers gives a pair's offsets within each side, as split_pair cut and stripped it
    if PAIR_SEPARATOR in text:
        first, second = text.split(PAIR_SEPARATOR, 1)
        second_start = len(first) + len(PAIR_SEPARATOR)
        shifts = [len(first) - len(first.lstrip()), second_start + len(second) - len(second.lstrip())]
    else:
        shifts = [0]
    tokens = []
    columns = (encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask, encoding.sequence_ids)
    for token_id, token, (start, stop), special, side in zip(*columns, strict=True):
        if special or side is None:
            tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
        else:
            start, stop = start + shifts[side], stop + shifts[side]
            tokens.append({"id": token_id, "text": text[start:stop], "special": False, "start": start, "stop": stop})
    return tokens


def split_pair(text: str) -> str | tuple[str, str]:
    """A sentence pair's two sides (``first ||| second``), cut and stripped; else the one text."""
    if PAIR_SEPARATOR in text:
        first, second = text.split(PAIR_SEPARATOR, 1)
        return first.strip(), second.strip()
    return text


def _bert_tokenizer(vocab_path: str, do_lower_case: bool):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    try:
        wordpiece = models.WordPiece.from_file(vocab_path, unk_token=UNK, max_input_chars_per_word=100)
    except Exception as exc:
        raise ModelFileError(f"cannot read vocabulary {vocab_path}: {exc}") from exc
    tokenizer = Tokenizer(wordpiece)
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=do_lower_case
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    if cls_id is None or sep_id is None:
        raise ModelFileError(f"{vocab_path} lacks [CLS] or [SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )
    return tokenizer
