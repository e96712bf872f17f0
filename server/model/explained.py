"""A tokenized input shown token by token, in the shape of Text Embeddings Inference's
``/tokenize`` (:meth:`.tokenization.ModelTokenizer.explain`)."""

from __future__ import annotations

from typing import Any

from bertserve.client.protocol import PAIR_SEPARATOR


def explained(text: str, encoding: Any, starts: tuple[int, int] = (0, 0)) -> list[dict[str, Any]]:
    """One token dict per token of ``encoding`` (of ``text``, its pair's sides cut to begin
    ``starts`` characters into their stripped selves), with offsets into ``text``."""
    # tokenizers gives a pair's offsets within each side, as split_pair cut and stripped it
    if PAIR_SEPARATOR in text:
        first, second = text.split(PAIR_SEPARATOR, 1)
        second_start = len(first) + len(PAIR_SEPARATOR)
        shifts = [
            len(first) - len(first.lstrip()) + starts[0],
            second_start + len(second) - len(second.lstrip()) + starts[1],
        ]
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
