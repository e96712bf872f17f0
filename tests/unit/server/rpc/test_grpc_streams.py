"""A stream's messages answered in groups (server/rpc/streams.py): one answer a message in the
messages' order whatever the groups, a group never mixing options nor larger than its bounds
(messages, bytes), an idle stream ended, and a failed group naming the stream's messages it
held."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest
from bertserve.server.http.schemas import HTTPError
from bertserve.server.rpc.status import CallError
from bertserve.server.rpc.streams import Messages, answered


async def _sent(items: list[tuple[str, int]], pause_every: int = 0) -> AsyncIterator[tuple[str, int]]:
    for i, item in enumerate(items):
        if pause_every and i % pause_every == 0:
            await asyncio.sleep(0.01)  # the next ones arrive while the last groups are answered
        yield item


def _weight(item: tuple[str, int]) -> int:
    return 10 + item[1] % 7  # messages of a few sizes


def _run(
    items: list[tuple[str, int]],
    most: int,
    *,
    pause_every: int = 0,
    fail_at: int | None = None,
    most_bytes: int = 10**9,
    room_bytes: int = 10**9,
) -> tuple:
    groups: list[list[tuple[str, int]]] = []

    async def answer(group: Sequence[tuple[str, int]]) -> list[int]:
        groups.append(list(group))
        await asyncio.sleep(0.002 * (len(groups) % 3))  # groups finish out of order
        if fail_at is not None and any(value == fail_at for _, value in group):
            raise HTTPError(422, f"inputs[{[v for _, v in group].index(fail_at)}] is empty", param="inputs")
        return [value * 10 for _, value in group]

    async def main() -> list[int]:
        messages = Messages(_sent(items, pause_every), room=16, room_bytes=room_bytes, idle_s=5, weigh=_weight)
        replies = answered(messages, lambda item: item[0], answer, most=most, most_bytes=most_bytes, ahead=3)
        return [reply async for reply in replies]

    return asyncio.run(main()), groups


def test_every_message_is_answered_once_in_order() -> None:
    items = [("a" if i % 7 < 5 else "b", i) for i in range(500)]
    replies, groups = _run(items, most=32, pause_every=40)
    assert replies == [i * 10 for i in range(500)]
    assert all(1 <= len(group) <= 32 for group in groups)
    assert all(len({kind for kind, _ in group}) == 1 for group in groups)  # one set of options a request
    assert len(groups) < 500  # messages that arrive together go together


def test_a_group_holds_at_most_its_bytes_whatever_the_stream_reads_ahead() -> None:
    items = [("a", i) for i in range(300)]
    replies, groups = _run(items, most=64, most_bytes=60, room_bytes=100)
    assert replies == [i * 10 for i in range(300)]
    assert all(len(group) == 1 or sum(map(_weight, group[1:])) <= 60 for group in groups)
    assert max(len(group) for group in groups) <= 1 + 60 // 10


def test_a_failed_group_names_the_stream_messages_it_held() -> None:
    with pytest.raises(HTTPError) as failed:
        _run([("a", i) for i in range(100)], most=8, fail_at=42)
    assert "the stream's message" in failed.value.message
    assert "inputs[" in failed.value.message


def test_an_idle_stream_is_ended_with_deadline_exceeded() -> None:
    async def idle() -> AsyncIterator[int]:
        yield 1
        await asyncio.sleep(30)
        yield 2

    async def main() -> list[int]:
        messages = Messages(idle(), room=4, room_bytes=100, idle_s=0.2, weigh=lambda item: 1)

        async def answer(group: Sequence[int]) -> list[int]:
            return list(group)

        return [reply async for reply in answered(messages, lambda item: 0, answer, most=4, most_bytes=100)]

    with pytest.raises(CallError) as ended:
        asyncio.run(asyncio.wait_for(main(), 10))
    assert ended.value.code is grpc.StatusCode.DEADLINE_EXCEEDED


def test_an_empty_stream_has_no_answer() -> None:
    assert _run([], most=4) == ([], [])
