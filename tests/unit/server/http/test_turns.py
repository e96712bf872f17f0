"""The HTTP process's tokenizing turns (``server/http/turns.py``): they are bounded, fair per
caller, and stop for a caller who left; and a rerank's sides cut to what a pair keeps give the
pair's own tokens (``server/http/lengths.py``)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from bertserve.server.http.lengths import GROUP_CHARS, first_cut_pair, rerank_sides, side_groups
from bertserve.server.http.turns import Tokenizing
from bertserve.server.model.tokenization import ModelTokenizer

pytestmark = pytest.mark.timeout(60)

RERANKER = Path(__file__).resolve().parents[3] / "data" / "tasks" / "rerank_bert"


class Gate:
    """Work that runs until it is let go, telling who started it."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = threading.Event()

    def work(self, name: str) -> str:
        self.started.append(name)
        assert self.release.wait(10)
        return name


async def _until(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_one_caller_never_holds_every_turn() -> None:
    async def scenario() -> list[str]:
        pool, gate = Tokenizing(at_once=2), Gate()
        flood = [asyncio.ensure_future(pool.run(gate.work, f"a{i}", owner="a")) for i in range(5)]
        await _until(lambda: len(gate.started) == 1)
        await asyncio.sleep(0.1)
        assert gate.started == ["a0"]  # its second request waits though a turn is free
        other = asyncio.ensure_future(pool.run(gate.work, "b0", owner="b"))
        await _until(lambda: len(gate.started) == 2)
        gate.release.set()
        await asyncio.gather(*flood, other)
        return gate.started

    started = asyncio.run(scenario())
    assert started[:2] == ["a0", "b0"] and sorted(started) == ["a0", "a1", "a2", "a3", "a4", "b0"]


def test_waiting_callers_take_turns_round_robin() -> None:
    async def scenario() -> list[str]:
        pool, gate = Tokenizing(at_once=1), Gate()
        first = asyncio.ensure_future(pool.run(gate.work, "a0", owner="a"))
        await _until(lambda: gate.started == ["a0"])
        rest = [asyncio.ensure_future(pool.run(gate.work, f"a{i}", owner="a")) for i in (1, 2, 3)]
        await asyncio.sleep(0.05)
        rest += [asyncio.ensure_future(pool.run(gate.work, "b1", owner="b"))]
        await asyncio.sleep(0.05)
        gate.release.set()
        await asyncio.gather(first, *rest)
        return gate.started

    assert asyncio.run(scenario()) == ["a0", "a1", "b1", "a2", "a3"]  # b's one request is not last


def test_a_caller_who_left_gives_its_place_up_and_its_running_turn_ends_with_its_thread() -> None:
    async def scenario() -> tuple[list[str], bool]:
        pool, gate = Tokenizing(at_once=1), Gate()
        running = asyncio.ensure_future(pool.run(gate.work, "a0", owner="a"))
        await _until(lambda: gate.started == ["a0"])
        left = asyncio.ensure_future(pool.run(gate.work, "b0", owner="b"))
        after = asyncio.ensure_future(pool.run(gate.work, "c0", owner="c"))
        await asyncio.sleep(0.05)
        left.cancel()  # b left while it waited
        running.cancel()  # a left while its turn ran: its thread runs on
        await asyncio.sleep(0.1)
        overlapped = gate.started != ["a0"]  # nothing began beside a thread still running
        gate.release.set()
        await after
        return gate.started, overlapped

    started, overlapped = asyncio.run(scenario())
    assert not overlapped
    assert started == ["a0", "c0"]  # b's work never began


def _tokenizer(max_len: int = 128) -> ModelTokenizer:
    return ModelTokenizer(
        vocab_path=None, tokenizer_json=str(RERANKER / "tokenizer.json"), do_lower_case=True, max_len=max_len
    )


async def _now(work: object, *args: object) -> object:
    return work(*args)  # type: ignore[operator]


def _words(start: int, count: int) -> str:
    return " ".join(f"word{i}" for i in range(start, start + count))


QUERIES = [_words(0, 1500), _words(0, 700), "a short query", _words(0, 40)]
DOCUMENTS = [
    "short one",
    "the quick brown fox " * 400,  # past a piece, past the model
    _words(5000, 900),  # longer than the second query, shorter than the first, in tokens
    _words(9000, 1800),  # longer than every query
    "x",
    "y " * 30,
]


@pytest.mark.parametrize("max_len", [128, 129])  # an odd room for text gives the longer side one more
@pytest.mark.parametrize("direction", ["right", "left"])
@pytest.mark.parametrize("query", QUERIES, ids=["1500-words", "700-words", "short", "40-words"])
def test_rerank_sides_cut_to_what_each_pair_keeps_tokenize_as_the_whole_pairs(
    query: str, direction: str, max_len: int
) -> None:
    tokenizer = _tokenizer(max_len)
    kept_query, kept = asyncio.run(rerank_sides(_now, tokenizer, query, DOCUMENTS, direction))
    whole = tokenizer.tokenize([f"{query} ||| {d}" for d in DOCUMENTS], truncation_direction=direction)
    cut = tokenizer.tokenize([f"{kept_query} ||| {d}" for d in kept], truncation_direction=direction)
    assert whole.lengths.tolist() == cut.lengths.tolist()
    for row in range(len(DOCUMENTS)):
        n = whole.lengths[row]
        assert whole.input_ids[row, :n].tolist() == cut.input_ids[row, :n].tolist(), row
    # the workers, tokenizing the pairs as sent, say of each what they would of the whole pair
    assert cut.truncated.tolist() == whole.truncated.tolist()
    first = asyncio.run(first_cut_pair(_now, tokenizer, kept_query, kept))
    assert first == (int(np.argmax(whole.truncated)) if whole.truncated.any() else None)
    assert len(kept_query) + sum(map(len, kept)) < 40_000  # nothing long is sent whole


class _Counting:
    """A tokenizer that counts how often it tokenizes."""

    def __init__(self, tokenizer: object) -> None:
        self._tokenizer, self.calls = tokenizer, 0

    def __getattr__(self, name: str) -> object:
        found = getattr(self._tokenizer, name)
        if callable(found) and name in ("count_whole", "truncated", "tokenize"):
            self.calls += 1
        return found


def test_a_rerank_with_no_side_long_enough_to_cut_is_not_tokenized_here() -> None:
    tokenizer = _Counting(_tokenizer(128))
    documents = ["short one", "y " * 30, "9 " * 127]  # 127 tokens in 254 characters: cut, with the query
    query, kept = asyncio.run(rerank_sides(_now, tokenizer, "a short query", documents, "right"))
    assert (query, kept, tokenizer.calls) == ("a short query", documents, 0)
    assert asyncio.run(first_cut_pair(_now, tokenizer, query, kept)) == 2  # refusing asks, and tokenizes


def test_side_groups_bound_a_turns_characters() -> None:
    texts = ["a" * 1000] * 200 + ["b" * (GROUP_CHARS * 2)] + ["c"] * 3
    groups = list(side_groups(texts))
    assert sorted(i for group in groups for i in group) == list(range(len(texts)))
    for group in groups:
        assert len(group) == 1 or sum(len(texts[i]) for i in group) <= GROUP_CHARS
