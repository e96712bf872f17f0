"""Inputs of an exact length: runs of the corpus's sentences put end to end, each begun at a
word and counted by the model's tokenizer; every input a different text (``lengths.py``'s
inputs, and ``latency.py``'s paced queries)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


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
    (a word's pieces counted anew) is passed over. ``tokenizer`` must not truncate."""
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
