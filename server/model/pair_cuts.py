"""Sentence pairs cut before they are tokenized, to what the model keeps of them.

The ``tokenizers`` library truncates a pair ``longest_first`` after it has tokenized both sides
whole, and lists what it cut as overflowing windows: for a pair, every window of one side with
every window of the other. Two sides of 17,000 characters cost 3 s, and the cost grows with
the product of their lengths, while the model keeps ``max_len`` tokens. So the long sides of
such a pair are cut first, at a space, to the fewest characters that still hold more tokens
than the model keeps (:func:`kept_side`), and the pair of cut sides keeps exactly the tokens
of the whole pair.

Why that is exact: ``longest_first`` gives a pair ``room`` tokens (the model's length less the
pair's special tokens). A side of at most ``room / 2`` tokens is kept whole and the other cut
to the rest; two longer sides keep ``room / 2`` each, the longer one the odd token. A side cut
to more than ``room`` tokens therefore keeps what it kept whole, provided that, of two long
sides, the same one is still the longer (:func:`cut_pair` makes sure). A cut falls on a space,
where no token crosses it, and the token at the cut is never among those kept.
"""

from __future__ import annotations

import re
from typing import Any

_SPACE = re.compile(r"\s")

STEP_CHARS = 64
"""The least characters a cut grows by; it starts at the model's length and doubles."""


def kept_side(tokenizer: Any, text: str, direction: str, more_than: int) -> tuple[str, int] | None:
    """``text`` cut at a space to hold more than ``more_than`` tokens (no specials) from the end
    ``direction`` keeps (``right``: its start), with that count: the cut grows from the model's
    length in characters, doubling, so it costs at most about twice the tokenizing of what it
    keeps. None when no cut shorter than ``text`` holds as many."""
    size = max(STEP_CHARS, tokenizer.max_len)
    while size < len(text):
        cut = _cut(text, size, direction)
        if cut is None:
            return None
        count = tokenizer.count_whole([cut])[0]
        if count > more_than:
            return cut, count
        size *= 2
    return None


def _cut(text: str, size: int, direction: str) -> str | None:
    """The part of ``text`` from the end ``direction`` keeps, at least ``size`` characters long
    and ending at a space (stripped); None if no space comes before the other end."""
    if direction == "left":
        for start in range(len(text) - size, 0, -1):
            if text[start - 1].isspace():
                return text[start:].lstrip()
        return None
    space = _SPACE.search(text, size)
    return text[: space.start()].rstrip() if space is not None else None


def long_side(tokenizer: Any, text: str) -> bool:
    """Whether ``text`` has characters enough to be cut (at least twice the first cut)."""
    return len(text) > 2 * max(STEP_CHARS, tokenizer.max_len)


def cut_pair(tokenizer: Any, first: str, second: str, direction: str) -> tuple[str, str]:
    """The pair ``first ||| second`` (its sides stripped) cut to what the model keeps of it:
    tokenized as it is, it gives the tokens the whole pair gives, and is cut if it is. Only a
    pair of two long sides is cut: with one short side the library's cost is the long one's."""
    if not (long_side(tokenizer, first) and long_side(tokenizer, second)):
        return first, second
    room = tokenizer.max_len - tokenizer.num_special_tokens(pair=True)
    whole_first, whole_second = tokenizer.count_whole([first, second])
    if whole_first + whole_second <= room:
        return first, second
    cut_first, kept_first = kept_or_whole(tokenizer, first, whole_first, direction, room)
    cut_second, kept_second = kept_or_whole(tokenizer, second, whole_second, direction, room)
    if 2 * min(whole_first, whole_second) > room and (kept_first > kept_second) != (whole_first > whole_second):
        if whole_first > whole_second:  # the first is the longer whole: it stays the longer
            cut_first, _ = kept_or_whole(tokenizer, first, whole_first, direction, kept_second)
        else:  # the second is at least as long whole: it stays so
            cut_second, _ = kept_or_whole(tokenizer, second, whole_second, direction, kept_first - 1)
    return cut_first, cut_second


def kept_or_whole(tokenizer: Any, text: str, whole: int, direction: str, more_than: int) -> tuple[str, int]:
    """``text`` cut by :func:`kept_side` if it holds more than ``more_than`` tokens (``whole``)
    and a cut holds as many, with its tokens; else ``text`` and ``whole``."""
    if whole > more_than and long_side(tokenizer, text):
        kept = kept_side(tokenizer, text, direction, more_than)
        if kept is not None:
            return kept
    return text, whole


def kept_sides(
    tokenizer: Any, texts: list[str], wholes: list[int], direction: str, more_than: int
) -> list[tuple[str, int]]:
    """:func:`kept_or_whole` of each of ``texts``, of ``wholes`` tokens."""
    return [
        kept_or_whole(tokenizer, text, whole, direction, more_than) for text, whole in zip(texts, wholes, strict=True)
    ]


def cut_starts(whole: str | tuple[str, str], cut: str | tuple[str, str], direction: str) -> tuple[int, int]:
    """Where each side of a pair ``cut`` by :func:`cut_pair` starts in the side it was cut from
    (a side cut on the left keeps the end of it; one cut on the right, its start)."""
    if not isinstance(whole, tuple) or not isinstance(cut, tuple) or direction != "left":
        return (0, 0)
    return (len(whole[0]) - len(cut[0]), len(whole[1]) - len(cut[1]))
