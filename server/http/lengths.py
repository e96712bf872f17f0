"""The text limits every HTTP path applies before it tokenizes, and the tokenizing the HTTP
process does itself (``/tokenize``, and ``/embed``'s refusal of over-long inputs), bounded in
memory whatever the text.

The ``tokenizers`` library encodes a text whole before it cuts it, and keeps what it cut as
windows: a megabyte of ``.`` is a million tokens, held twice. So nothing here hands it more
than a bounded piece at a time. Where only "is it longer than the model takes?" matters, a
text is counted a piece of :data:`PIECE_CHARS` characters at a time (cut after a space where
there is one, so no word is split), and counting stops once past the model's length. A
``/tokenize`` answer holds at most :data:`TOKENIZE_TOKENS` tokens, counted the same way before
any is made; with ``truncate``, a text is cut to the pieces that hold the tokens kept before it
is tokenized. A rerank's long query and documents are tokenized once each, and cut to what
their pairs keep before any pair is written (:func:`rerank_sides`), so no long query is
tokenized again for every document; which pairs are cut, the workers say. The HTTP process
runs this work off its event loop, in turns (:class:`.turns.Tokenizing`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import numpy as np
from bertserve.client.protocol import PAIR_SEPARATOR

from ..model.pair_cuts import kept_or_whole, kept_sides, long_side
from ..model.tokenization import split_pair
from .schemas import HTTPError

PIECE_CHARS = 4096
"""The most characters handed to the tokenizer at once for a long text."""
GROUP_CHARS = 65_536
"""The most characters of short texts handed to the tokenizer at once."""
TOKENIZE_TOKENS = 32_768
"""The most tokens one ``/tokenize`` answer holds (each about 400 bytes while it is made)."""


def check_text_limits(texts: Sequence[Any], name: str, *, max_inputs: int, max_chars: int) -> list[Any]:
    """``texts`` if within ``--max-request-size`` inputs of ``--max-text-chars`` characters
    each (a pre-tokenized input: its tokens' characters), before anything tokenizes them; else 413."""
    if len(texts) > max_inputs:
        raise HTTPError(
            413,
            f"the request has {len(texts)} inputs; this server takes at most {max_inputs} per request",
            code="limit",
        )
    for index, text in enumerate(texts):
        size = len(text) if isinstance(text, str) else sum(map(len, text))
        if size > max_chars:
            raise HTTPError(
                413,
                f"{name}[{index}] has {size} characters; this server takes at most {max_chars}",
                param=name,
                code="limit",
            )
    return list(texts)


def check_pair_limits(query: str, documents: Sequence[str], name: str, *, max_inputs: int, max_chars: int) -> None:
    """:func:`check_text_limits` of the pairs of ``query`` and each of ``documents``, each pair
    an input, without writing a pair; else 413."""
    if len(documents) > max_inputs:
        raise HTTPError(
            413,
            f"the request has {len(documents)} inputs; this server takes at most {max_inputs} per request",
            code="limit",
        )
    around = len(query) + len(PAIR_SEPARATOR) + 2
    for index, document in enumerate(documents):
        if around + len(document) > max_chars:
            raise HTTPError(
                413,
                f"{name}[{index}] has {around + len(document)} characters with the query; this server takes at "
                f"most {max_chars}",
                param=name,
                code="limit",
            )


def pieces(text: str, size: int = PIECE_CHARS) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of consecutive pieces of ``text``, each at most ``size`` characters,
    cut after the last space of its second half where there is one."""
    start = 0
    while start < len(text):
        stop = min(start + size, len(text))
        if stop < len(text):
            stop = _after_last_space(text, start + size // 2, stop) or stop
        yield start, stop
        start = stop


def _after_last_space(text: str, low: int, high: int) -> int | None:
    for index in range(high - 1, low - 1, -1):
        if text[index].isspace():
            return index + 1
    return None


def _sides(text: str) -> list[str]:
    """A sentence pair's two sides (as the tokenizer cuts and strips them), or the one text."""
    split = split_pair(text)
    return list(split) if isinstance(split, tuple) else [split]


def _specials(tokenizer: Any, text: str) -> int:
    """The special tokens the model adds to ``text``: around an input, and between a pair's
    sides (``[SEP]`` for BERT, ``</s></s>`` for RoBERTa's kind)."""
    return int(tokenizer.num_special_tokens(pair=PAIR_SEPARATOR in text))


def count_up_to(tokenizer: Any, sides: Sequence[str], most: int) -> int:
    """The tokens of ``sides`` (no specials), counted a piece at a time; once past ``most`` the
    count stops, and is only known to be more than ``most``."""
    total = 0
    for side in sides:
        for start, stop in pieces(side):
            total += tokenizer.count_whole([side[start:stop]])[0]
            if total > most:
                return total
    return total


def first_over_long(tokenizer: Any, texts: Sequence[str]) -> int | None:
    """The index of the first of ``texts`` longer than ``tokenizer.max_len`` tokens (its
    specials counted), or None (:func:`over_long`)."""
    return next(iter(over_long(tokenizer, texts, first=True)), None)


def over_long(tokenizer: Any, texts: Sequence[str], *, first: bool = False) -> list[int]:
    """The indexes of ``texts`` longer than ``tokenizer.max_len`` tokens (its specials
    counted); with ``first``, only the first: short texts are tokenized together,
    :data:`GROUP_CHARS` at a time, and a long one a piece at a time until it is known to be
    past the length."""
    group: list[int] = []
    found: list[int] = []

    def over_in_group() -> None:
        if group:
            over = tokenizer.truncated([texts[i] for i in group])
            found.extend(i for i, cut in zip(group, over, strict=True) if cut)
            group.clear()

    chars = 0
    for index, text in enumerate(texts):
        long = len(text) > PIECE_CHARS
        if not long:
            group.append(index)
            chars += len(text)
            if chars < GROUP_CHARS:
                continue
        over_in_group()  # a full group, or the short texts before a long one
        chars = 0
        if found and first:
            return found[:1]
        if long and count_up_to(tokenizer, _sides(text), most := tokenizer.max_len - _specials(tokenizer, text)) > most:
            found.append(index)
            if first:
                return found
    over_in_group()
    return found[:1] if first else found


def tokens_answered(
    tokenizer: Any, texts: Sequence[str], *, add_special_tokens: bool, truncate: bool, most: int = TOKENIZE_TOKENS
) -> None:
    """413 unless ``/tokenize``'s answer for ``texts`` holds at most ``most`` tokens, counted
    a piece at a time before any is made."""
    total = 0
    for text in texts:
        specials = _specials(tokenizer, text) if add_special_tokens else 0
        if truncate:
            total += min(count_up_to(tokenizer, _sides(text), tokenizer.max_len) + specials, tokenizer.max_len)
        else:
            total += count_up_to(tokenizer, _sides(text), most - total) + specials
        if total > most:
            how = "" if truncate else "; pass truncate=true to have each cut to the model's length"
            raise HTTPError(
                413, f"the answer would hold more than {most} tokens: send fewer or shorter inputs{how}", code="limit"
            )


def explain_bounded(
    tokenizer: Any, texts: Sequence[str], *, add_special_tokens: bool, truncate: bool, direction: str
) -> list[list[dict[str, Any]]]:
    """``tokenizer.explain`` of ``texts`` (``/tokenize``'s answer), in groups of at most
    :data:`GROUP_CHARS` characters; with ``truncate``, each single text is first cut to the
    pieces holding the tokens kept, on the side ``direction`` keeps, and its offsets told in
    the whole text."""
    answer: list[list[dict[str, Any]]] = []
    group: list[tuple[str, int]] = []  # a text to explain, and where it starts in its input
    chars = 0
    for text in texts:
        start, stop = (0, len(text))
        if truncate and PAIR_SEPARATOR not in text:
            start, stop = _kept_span(tokenizer, text, direction)
        group.append((text[start:stop], start))
        chars += stop - start
        if chars >= GROUP_CHARS:
            answer += _explain(tokenizer, group, add_special_tokens, truncate, direction)
            group, chars = [], 0
    return answer + _explain(tokenizer, group, add_special_tokens, truncate, direction)


def _kept_span(tokenizer: Any, text: str, direction: str) -> tuple[int, int]:
    """The shortest run of ``text``'s pieces, from the end that truncation keeps, holding more
    tokens than the model takes (or the whole text): cut there, it keeps the same tokens."""
    spans = list(pieces(text))
    if direction == "left":
        spans.reverse()
    total = 0
    for taken, (start, stop) in enumerate(spans, 1):
        total += tokenizer.count_whole([text[start:stop]])[0]
        if total > tokenizer.max_len:
            kept = spans[:taken]
            return min(s for s, _ in kept), max(e for _, e in kept)
    return 0, len(text)


def side_groups(texts: Sequence[str]) -> Iterator[list[int]]:
    """The indices of ``texts`` in groups of at most :data:`GROUP_CHARS` characters (a long
    text alone): the work of one tokenizing turn each."""
    group: list[int] = []
    chars = 0
    for index, text in enumerate(texts):
        if group and chars + len(text) > GROUP_CHARS:
            yield group
            group, chars = [], 0
        group.append(index)
        chars += len(text)
    if group:
        yield group


Run = Callable[..., Awaitable[Any]]


async def rerank_sides(
    run: Run, tokenizer: Any, query: str, documents: Sequence[str], direction: str
) -> tuple[str, list[str]]:
    """The query and documents of a rerank cut to what each pair keeps of them: the query
    tokenized once and each long document once, whole, in turns that ``run`` gives
    (``run(work, *args)``), each of at most :data:`GROUP_CHARS` characters. A rerank with no
    side long enough to be cut (:func:`..model.pair_cuts.long_side`) is not tokenized here at
    all; which pairs the model cuts, the workers say with their scores.

    Each pair of a long query and a long document is cut as :func:`..model.pair_cuts.cut_pair`
    cuts one pair, with the query cut once for all: long enough to stay longer than each long
    document it is longer than, and each such document at least as long as the query where it
    was, so every pair keeps the tokens it keeps whole. A short query is never cut, so then
    only the long documents are counted."""
    long_query = long_side(tokenizer, query)
    counted = [i for i, document in enumerate(documents) if long_query or long_side(tokenizer, document)]
    if not counted and not long_query:
        return query, list(documents)
    room = tokenizer.max_len - tokenizer.num_special_tokens(pair=True)
    sides = [documents[i] for i in counted]
    (query_tokens,) = await run(tokenizer.count_whole, [query])
    counts: list[int] = []
    for group in side_groups(sides):
        counts += await run(tokenizer.count_whole, [sides[i] for i in group])
    kept: list[tuple[str, int]] = []
    for group in side_groups(sides):
        texts, wholes = [sides[i] for i in group], [counts[i] for i in group]
        kept += await run(kept_sides, tokenizer, texts, wholes, direction, room)

    def both_long(i: int) -> bool:
        return 2 * min(query_tokens, counts[i]) > room

    need = max([room] + [kept[i][1] for i in range(len(kept)) if both_long(i) and query_tokens > counts[i]])
    query_kept, query_count = await run(kept_or_whole, tokenizer, query, query_tokens, direction, need)
    for i in range(len(kept)):
        if both_long(i) and counts[i] >= query_tokens and kept[i][1] < query_count:
            kept[i] = await run(kept_or_whole, tokenizer, sides[i], counts[i], direction, query_count - 1)
    cut = list(documents)
    for i, (text, _) in zip(counted, kept, strict=True):
        cut[i] = text
    return query_kept, cut


async def first_cut_pair(run: Run, tokenizer: Any, query: str, documents: Sequence[str]) -> int | None:
    """The index of the first pair of ``query`` and one of ``documents`` (as
    :func:`rerank_sides` cut them) that the model cuts, or None: each pair tokenized as the
    workers tokenize it, in turns that ``run`` gives. Only a rerank that refuses over-long
    pairs (``truncate: false``) asks, before anything is sent."""
    for group in side_groups(documents):
        pairs = [f"{query}{PAIR_SEPARATOR}{documents[i]}" for i in group]
        truncated = await run(tokenizer.truncated, pairs)
        if truncated.any():
            return group[int(np.argmax(truncated))]
    return None


def _explain(
    tokenizer: Any, group: list[tuple[str, int]], add_special_tokens: bool, truncate: bool, direction: str
) -> list[list[dict[str, Any]]]:
    if not group:
        return []
    explained = tokenizer.explain(
        [text for text, _ in group],
        add_special_tokens=add_special_tokens,
        truncate=truncate,
        truncation_direction=direction,
    )
    for tokens, (_, shift) in zip(explained, group, strict=True):
        if shift:
            for token in tokens:
                if token["start"] is not None:
                    token["start"] += shift
                    token["stop"] += shift
    return explained
