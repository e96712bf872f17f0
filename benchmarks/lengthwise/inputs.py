"""Inputs of an exact length: runs of the corpus's sentences put end to end, each begun at a
word and counted by the model's tokenizer; every input a different text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lengthwise.plan import Plan


@dataclass(frozen=True)
class TokenStream:
    """The corpus's sentences end to end: the text, its tokens' character spans, and which
    tokens begin a word (a text cut there tokenizes as it did in the stream)."""

    text: str
    spans: list[tuple[int, int]]
    word_starts: np.ndarray

    @classmethod
    def of(cls, tokenizer: Any, corpus: Sequence[str]) -> TokenStream:
        text = " ".join(corpus)
        encoding = tokenizer.encode(text, add_special_tokens=False)
        words = encoding.word_ids
        starts = [i for i, word in enumerate(words) if i == 0 or word != words[i - 1]]
        return cls(text, list(encoding.offsets), np.asarray(starts))

    def cut(self, start: int, tokens: int) -> str:
        return self.text[self.spans[start][0] : self.spans[start + tokens - 1][1]]


def exact_inputs(stream: TokenStream, tokenizer: Any, length: int, count: int, seed: int) -> list[str]:
    """``count`` different texts of exactly ``length`` tokens, ``[CLS]`` and ``[SEP]``
    included, from random word starts of ``stream``; the rare cut that tokenizes otherwise
    (a word's pieces counted anew) is passed over."""
    body = length - 2
    starts = stream.word_starts[stream.word_starts <= len(stream.spans) - body]
    order = np.random.default_rng(seed).permutation(starts)
    texts: list[str] = []
    seen: set[str] = set()
    for begin in range(0, len(order), count):
        candidates = [stream.cut(int(start), body) for start in order[begin : begin + count]]
        for text, encoding in zip(candidates, tokenizer.encode_batch(candidates), strict=True):
            if len(encoding.ids) == length and text not in seen:
                seen.add(text)
                texts.append(text)
        if len(texts) >= count:
            return texts[:count]
    raise SystemExit(f"the corpus holds {len(texts)} different inputs of {length} tokens, not {count}: pass --corpus")


@dataclass(frozen=True)
class LengthInputs:
    """Every input at one length: a warm-up batch, and each repeat's bulk and one-input sets."""

    tokens: int
    warm: list[str]
    bulk: list[list[str]]
    single: list[list[str]]  # the warm-up inputs first

    def everything(self) -> list[str]:
        return [*self.warm, *(t for texts in self.bulk for t in texts), *(t for texts in self.single for t in texts)]


def length_inputs(stream: TokenStream, tokenizer: Any, length: int, plan: Plan, batch_size: int) -> LengthInputs:
    per_bulk, per_single = max(plan.bulk_tokens // length, 1), plan.warmup + plan.single
    texts = exact_inputs(stream, tokenizer, length, batch_size + plan.repeats * (per_bulk + per_single), seed=length)
    warm, rest = texts[:batch_size], texts[batch_size:]
    bulk = [rest[r * per_bulk : (r + 1) * per_bulk] for r in range(plan.repeats)]
    rest = rest[plan.repeats * per_bulk :]
    single = [rest[r * per_single : (r + 1) * per_single] for r in range(plan.repeats)]
    return LengthInputs(length, warm, bulk, single)
