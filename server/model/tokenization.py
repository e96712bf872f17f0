"""Tokenization with the ``tokenizers`` library, exactly as the model was trained: WordPiece
(BERT, DistilBERT, MPNet), byte-level BPE (RoBERTa, ModernBERT) and SentencePiece Unigram
(XLM-RoBERTa) alike, with the special tokens and token type ids of the model's own
post-processor (:mod:`.tokenizer_files` reads them). Sentence pairs are written
``"first ||| second"``; pre-tokenized input is a list of tokens per sentence.

An input too long for ``max_len`` is cut on its right (its start is kept) or, with
``truncation_direction="left"``, on its left (its end is kept), as Hugging Face's tokenizers
do with ``truncation_side``; a pair's sides are cut ``longest_first``, and the special tokens
are always kept. That is the library's own truncation, as Hugging Face's fast tokenizers run
it, for pre-tokenized input too: its tokens are turned into ids, which a twin of the model's
tokenizer whose words are ids tokenizes, with the same post-processor and truncation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from bertserve.client.protocol import PAIR_SEPARATOR, TRUNCATION_DIRECTIONS

from ..errors import ModelOptionError
from .explained import explained
from .pair_cuts import cut_pair, cut_starts
from .tokenizer_files import id_twin, read_tokenizer, special_tokens, unk_id
from .yes_no import PairTemplate, template_processor

logger = logging.getLogger("bertserve.tokenizer")

Row = tuple[list[int], list[int], list[str], bool]  # ids, type ids, tokens, truncated


@dataclass
class TokenizedBatch:
    """Token ids for a batch, padded to its longest member."""

    input_ids: np.ndarray  # int32 [batch, length]
    segment_ids: np.ndarray  # int32 [batch, length]
    lengths: np.ndarray  # int32 [batch]: real tokens, the special tokens included
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


class ModelTokenizer:
    """Turns strings (or token lists) into padded id arrays, truncating to ``max_len``, with the model's own
    tokenizer: any of WordPiece, BPE and Unigram (``WordPieceTokenizer``, its name when BERT's was the only one).

    ``cls_id`` and ``sep_id`` are the first and last special tokens of a single input
    (``[CLS]``/``[SEP]``, ``<s>``/``</s>``); ``unk_id`` is the unknown token's id, None for a
    model that has none (byte-level BPE spells any text in its bytes)."""

    def __init__(
        self,
        *,
        vocab_path: str | None,
        tokenizer_json: str | None,
        do_lower_case: bool,
        max_len: int,
        stride: int = 0,
        pair_template: PairTemplate | None = None,
        add_special_tokens: bool = True,  # False: a static model's, whose tokens are its text's (.static)
    ) -> None:
        tokenizer = read_tokenizer(vocab_path, tokenizer_json, do_lower_case)
        tokenizer.post_processor = tokenizer.post_processor if add_special_tokens else None
        if pair_template is not None:  # a causal LM reranking: its template's turns are kept as special tokens
            tokenizer.post_processor = template_processor(tokenizer, pair_template)
        self._pair_template = pair_template
        self._specials = specials = special_tokens(tokenizer, tokenizer_json or vocab_path, add_special_tokens)
        if max_len <= specials.pair:
            raise ModelOptionError(
                f"max_seq_len {max_len} leaves no room for text: the model adds {specials.pair} special "
                "tokens to a pair; raise max_seq_len"
            )
        if not 0 <= stride < max_len - specials.single:
            raise ModelOptionError(
                f"chunk_stride must be below max_seq_len minus the model's {specials.single} special tokens "
                f"= {max_len - specials.single}, not {stride}"
            )
        tokenizer.no_padding()
        # stride: the tokens consecutive windows of a chunked input share
        tokenizer.enable_truncation(max_len, strategy="longest_first", stride=stride)
        self._tokenizer = tokenizer
        self.max_len = max_len
        self.stride = stride
        # copies of the tokenizer cutting on the left ("left") or not at all (None), and its
        # twins reading ids ("ids-right", "ids-left"), each made when first asked for
        self._variants: dict[str | None, Any] = {"right": tokenizer}
        self.cls_id: int = (specials.prefix or specials.suffix or (-1,))[0]  # -1: none
        self.sep_id: int = (specials.suffix or specials.prefix or (-1,))[-1]
        self.unk_id: int | None = unk_id(tokenizer)
        self._vocab_size = tokenizer.get_vocab_size()

    @property
    def templated(self) -> bool:
        """Whether a pair is written into the model's own template (:mod:`.yes_no`)."""
        return self._pair_template is not None

    vocab_size = property(lambda self: self._vocab_size)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        """The text of token ``ids`` (TEI's ``Decode``); a ValueError names an id past the largest."""
        if ids and (most := self.largest_id()[0]) < (top := max(ids)):
            raise ValueError(f"ids[{list(ids).index(top)}] = {top} is past this model's largest token id, {most}")
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def largest_id(self) -> tuple[int, str]:
        """The largest id the tokenizer can give, and its token: of the vocabulary (which may
        have gaps), its added tokens and the special tokens its post-processor writes."""
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        token, largest = max(vocab.items(), key=lambda item: item[1], default=("", -1))
        for special in (*self._specials.prefix, *self._specials.suffix):
            if special > largest:
                token, largest = f"the special token {special} its post-processor writes", special
        return largest, token

    def num_special_tokens(self, *, pair: bool = False) -> int:
        """How many special tokens the model adds to a single input, or to a pair."""
        return self._specials.pair if pair else self._specials.single

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
        (``.owners`` says whose each row is), whatever the side.

        Pre-tokenized input (``is_tokenized``): vocabulary tokens are taken as they are, other
        words are split into the model's tokens (an unknown token where that gives none); a
        ``|||`` token separates a pair."""
        _check_direction(truncation_direction)
        if is_tokenized:
            inputs: list = [self._id_words(list(tokens)) for tokens in texts]
            if self._pair_template is not None and any(isinstance(item, tuple) for item in inputs):
                raise ModelOptionError(
                    "this reranker writes a query and a document into its own template: send the pair as text "
                    "(query ||| document), not as tokens"
                )
        else:
            inputs = self._cut_pairs([self._split(text) for text in texts], truncation_direction)
        encodings = self._encode_batch(inputs, truncation_direction, chunk, ids=is_tokenized)
        windows: list[list[Row]] = []
        for item, enc in zip(inputs, encodings, strict=True):
            if chunk and enc.overflowing and not isinstance(item, tuple):
                windows.append([self._row(e, False, is_tokenized, keep_tokens) for e in (enc, *enc.overflowing)])
            else:
                windows.append([self._row(enc, bool(enc.overflowing), is_tokenized, keep_tokens)])
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
        tokens = [r[2] for r in rows] if keep_tokens else None
        return TokenizedBatch(input_ids, segment_ids, lengths, truncated, tokens, owners)

    def _row(self, enc: Any, truncated: bool, from_ids: bool, keep_tokens: bool) -> Row:
        tokens: list[str] = []
        if keep_tokens:  # the twin reading ids has the ids' digits for tokens
            tokens = [self._tokenizer.id_to_token(i) for i in enc.ids] if from_ids else list(enc.tokens)
        return enc.ids, enc.type_ids, tokens, truncated

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

        A special token ([CLS], ``</s>``) has its own text and null ``start``/``stop``; any
        other has the slice ``text[start:stop]`` of its input (``"café"`` for the token
        ``cafe``, ``"ing"`` for ``##ing``, ``"hello"`` for ``Ġhello`` and ``▁hello``: the
        library trims a token's leading space where the model says so). Offsets count code
        points, as Python indexes a string (TEI's count UTF-8 bytes); byte-level tokens that
        each hold part of one character all point at that character. They index the input as
        given, pairs too: a token of ``"a ||| b"``'s second side points past the ``|||``. The
        ids are those :meth:`tokenize` gives the model, cut as it cuts them when ``truncate``.
        """
        _check_direction(truncation_direction)
        whole = [self._split(text) for text in texts]
        inputs = self._cut_pairs(whole, truncation_direction) if truncate else whole
        tokenizer = self._variant(truncation_direction if truncate else None)
        encodings = tokenizer.encode_batch(inputs, add_special_tokens=add_special_tokens)
        templated = self._pair_template is not None
        return [  # a pair written into the model's template is shown as that text
            explained(
                side if templated and isinstance(side, str) else text, enc, cut_starts(side, cut, truncation_direction)
            )
            for text, enc, side, cut in zip(texts, encodings, whole, inputs, strict=True)
        ]

    def _encode_batch(self, inputs: list, direction: str, chunk: bool, ids: bool = False) -> list:
        """``tokenizers.Encoding`` of each of ``inputs`` (texts, or the words :meth:`_id_words` makes)."""
        kind = "ids-" if ids else ""
        if direction == "right" or not chunk:
            return self._variant(kind + direction).encode_batch(inputs, is_pretokenized=ids)
        # Chunked, a single input's windows cover all of it from its start, whatever the side;
        # a pair is still cut, on the side asked for.
        encodings: list = [None] * len(inputs)
        for pairs, variant in ((False, kind + "right"), (True, kind + direction)):
            indices = [i for i, x in enumerate(inputs) if isinstance(x, tuple) == pairs]
            if indices:
                found = self._variant(variant).encode_batch([inputs[i] for i in indices], is_pretokenized=ids)
                for i, enc in zip(indices, found, strict=True):
                    encodings[i] = enc
        return encodings

    def _variant(self, name: str | None):  # -> tokenizers.Tokenizer
        """The tokenizer cutting on the side ``name`` says (``right``, ``left``; None: not at
        all); ``ids-right`` and ``ids-left``: its twins reading ids."""
        found = self._variants.get(name)
        if found is None:
            from tokenizers import Tokenizer

            if name is not None and name.startswith("ids-"):
                found = id_twin(self._tokenizer, self._vocab_size)
                name_of_side: str | None = name[len("ids-") :]
            else:
                found = Tokenizer.from_str(self._tokenizer.to_str())
                found.model = self._tokenizer.model  # as read, not as written and read again
                name_of_side = name
            found.no_padding()
            if name_of_side is None:
                found.no_truncation()
            else:
                found.enable_truncation(
                    self.max_len, strategy="longest_first", stride=self.stride, direction=name_of_side
                )
            self._variants[name] = found
        return found

    def _id_words(self, tokens: list[str]) -> list[str] | tuple[list[str], list[str]]:
        """Pre-tokenized input as the words of the twin reading ids: each token's id, or
        the ids of the model's tokens it is split into; a pair as a tuple of its two sides."""
        whole = self._variant(None)
        sides: list[list[str]] = []
        for side in _split_tokens(tokens):
            ids: list[int] = []
            for token in side:
                token_id = self._tokenizer.token_to_id(token)
                if token_id is not None:
                    ids.append(token_id)
                    continue
                pieces = whole.encode(token, add_special_tokens=False).ids
                ids.extend(pieces if pieces or self.unk_id is None else [self.unk_id])
            sides.append([str(i) for i in ids])
        return (sides[0], sides[1]) if len(sides) == 2 else sides[0]

    def same_vocabulary(self, other: ModelTokenizer) -> bool:
        """Whether ``other`` has the same ids for every token, and the same special tokens."""
        return bool(self._specials == other._specials and self._tokenizer.get_vocab() == other._tokenizer.get_vocab())

    def count_tokens(self, texts: Sequence, *, is_tokenized: bool = False, chunk: bool = False) -> np.ndarray:
        """How many tokens each input becomes (after truncation; with ``chunk``, in all its
        windows), to sort and cut work by its cost (pre-tokenized input: about as many)."""
        if is_tokenized:
            if chunk:
                return np.fromiter((self._window_tokens(len(t)) for t in texts), dtype=np.int32, count=len(texts))
            single = self._specials.single
            return np.fromiter((min(len(t) + single, self.max_len) for t in texts), dtype=np.int32, count=len(texts))
        # Without character offsets (tokenizers >= 0.20): the same ids, a fifth less time.
        encode = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)
        inputs = self._cut_pairs([self._split(text) for text in texts], "right")
        encodings = encode(inputs)
        if chunk:  # a pair is truncated, not chunked
            counts = (
                len(e.ids) + (sum(len(o.ids) for o in e.overflowing) if isinstance(text, str) else 0)
                for text, e in zip(inputs, encodings, strict=True)
            )
            return np.fromiter(counts, dtype=np.int32, count=len(texts))
        return np.fromiter((len(e.ids) for e in encodings), dtype=np.int32, count=len(texts))

    def _window_tokens(self, words: int) -> int:
        """Tokens in all the windows of an input of about ``words`` tokens."""
        single = self._specials.single
        content, step = self.max_len - single, self.max_len - single - self.stride
        windows = 1 if words <= content else 1 + -(-(words - content) // step)
        return words + single * windows + self.stride * (windows - 1)

    def count_whole(self, texts: Sequence[str]) -> list[int]:
        """How many tokens each of ``texts`` (no pairs) becomes uncut, without the special
        tokens: pieces of a long text can be counted one at a time this way, where a cut would
        keep every window of the whole text."""
        whole = self._variant(None)
        encode = getattr(whole, "encode_batch_fast", whole.encode_batch)
        return [len(e.ids) for e in encode(list(texts), add_special_tokens=False)]

    def truncated(self, texts: Sequence[str]) -> np.ndarray:
        """Which of ``texts`` are longer than ``max_len`` tokens and would be cut."""
        encodings = self._tokenizer.encode_batch(self._cut_pairs([self._split(text) for text in texts], "right"))
        return np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(texts))

    def _split(self, text: str) -> str | tuple[str, str]:
        """:func:`split_pair`'s answer; a pair written into the model's template, where it has
        one (:mod:`.yes_no`), as one text."""
        item = split_pair(text)
        if self._pair_template is not None and isinstance(item, tuple):
            return self._pair_template.text(*item)
        return item

    def _cut_pairs(self, inputs: list, direction: str) -> list:
        """``inputs`` (as :func:`split_pair` gives them) with each long pair cut to what the
        model keeps of it (:func:`.pair_cuts.cut_pair`): the same tokens, without tokenizing
        every window of one long side against every window of the other."""
        return [cut_pair(self, item[0], item[1], direction) if isinstance(item, tuple) else item for item in inputs]

    def tokens_of(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary tokens of token ids, for inputs given as ids; the special tokens the
        model puts before and after an input (``[CLS]``, ``[SEP]``; ``<s>``, ``</s>``) are
        dropped where the ids start and end with them, since encoding adds them again."""
        ids = list(ids)
        prefix, suffix = self._specials.prefix, self._specials.suffix
        if prefix and tuple(ids[: len(prefix)]) == prefix:
            ids = ids[len(prefix) :]
        if suffix and tuple(ids[-len(suffix) :]) == suffix:
            ids = ids[: -len(suffix)]
        tokens = []
        for i, token_id in enumerate(ids):
            token = self._tokenizer.id_to_token(token_id) if 0 <= token_id < self._vocab_size else None
            if token is None:
                raise ValueError(f"token id {token_id} at [{i}] is not in the vocabulary (0 to {self._vocab_size - 1})")
            tokens.append(token)
        if not tokens:
            around = " and ".join(self._tokenizer.id_to_token(i) for i in prefix + suffix)
            raise ValueError(f"no token is left once {around} are dropped")
        return tokens


WordPieceTokenizer = ModelTokenizer
"""The name :class:`ModelTokenizer` had when it knew only WordPiece."""


def _split_tokens(tokens: list[str]) -> list[list[str]]:
    if PAIR_SEPARATOR in tokens:
        cut = tokens.index(PAIR_SEPARATOR)
        return [tokens[:cut], tokens[cut + 1 :]]
    return [tokens]


def _check_direction(direction: str) -> None:
    if direction not in TRUNCATION_DIRECTIONS:
        raise ValueError(f"truncation_direction must be 'right' or 'left', not {direction!r}")


def split_pair(text: str) -> str | tuple[str, str]:
    """A sentence pair's two sides (``first ||| second``), cut and stripped; else the one text."""
    if PAIR_SEPARATOR in text:
        first, second = text.split(PAIR_SEPARATOR, 1)
        return first.strip(), second.strip()
    return text
