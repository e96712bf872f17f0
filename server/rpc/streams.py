"""A stream's messages answered in groups, in order (:func:`answered`).

TEI's streams send one input a message and answer each with one message. Sent to the head one by
one, 10,000 messages would be 10,000 requests, each with its own checks and round trip. Here the
messages that have arrived while the last groups were being answered, with the same options, go
as one request (at most ``most`` of them), a few groups in flight at once; the answers still come
back one a message, in the order the messages came. A stream whose caller sends nothing for
``idle_s`` is ended (DEADLINE_EXCEEDED), so an idle stream holds no place for ever; a failed group
ends the stream with its status, its message saying which messages it held.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

import grpc

from ..http.schemas import HTTPError
from .status import CallError

M = TypeVar("M")
R = TypeVar("R")

_END = object()


class Messages(Generic[M]):
    """A stream's incoming messages, read ahead by a task of their own into a queue bounded in
    messages (``room``) and bytes (``room_bytes``; a message larger than that is still taken
    alone), so that a stream holds little whatever its caller sends; the caller's further
    messages wait in gRPC's flow control."""

    def __init__(
        self,
        requests: AsyncIterator[M],
        *,
        room: int,
        room_bytes: int,
        idle_s: float,
        weigh: Callable[[M], int] = lambda message: int(message.ByteSize()),  # type: ignore[attr-defined]
    ) -> None:
        self._held: deque[tuple[M, int]] = deque()
        self._bytes = 0
        self._room, self._room_bytes, self._idle_s, self._weigh = room, room_bytes, idle_s, weigh
        self._arrived, self._taken = asyncio.Event(), asyncio.Event()
        self._ended = False
        self._failure: Exception | None = None
        self._reader = asyncio.ensure_future(self._read(requests))
        self.count = 0  # messages taken so far

    async def _read(self, requests: AsyncIterator[M]) -> None:
        try:
            async for message in requests:
                size = self._weigh(message)
                while self._held and (len(self._held) >= self._room or self._bytes + size > self._room_bytes):
                    self._taken.clear()
                    await self._taken.wait()
                self._held.append((message, size))
                self._bytes += size
                self._arrived.set()
        except Exception as exc:  # a stream that could not be read: told when its end is taken
            self._failure = exc
        self._ended = True
        self._arrived.set()

    async def next(self) -> M | None:
        """The next message, waiting at most ``idle_s`` for it (None: the stream has ended)."""
        while not self._held and not self._ended:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), self._idle_s)
            except asyncio.TimeoutError:
                raise CallError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the stream sent nothing for {self._idle_s:g} s (--grpc-idle-timeout-s); it is ended",
                ) from None
        if self._held:
            return self.take()
        if self._failure is not None:
            raise self._failure
        return None

    def peek(self) -> tuple[M, int] | None:
        """The next message already here and its size in bytes, if any (never waits)."""
        return self._held[0] if self._held else None

    def take(self) -> M:
        """The message :meth:`peek` showed."""
        message, size = self._held.popleft()
        self._bytes -= size
        self.count += 1
        self._taken.set()
        return message

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


async def answered(
    messages: Messages[M],
    key: Callable[[M], Hashable],
    answer: Callable[[Sequence[M]], Awaitable[Sequence[R]]],
    *,
    most: int,
    most_bytes: int,
    ahead: int = 4,
) -> AsyncIterator[R]:
    """The answers to ``messages``, one a message and in their order, ``answer`` given groups of
    consecutive messages of one ``key`` (their options), at most ``most`` of them and
    ``most_bytes`` (but for a message larger alone), ``ahead`` groups at once."""
    pending: deque[tuple[int, int, asyncio.Future[Sequence[R]]]] = deque()
    try:
        while (first := await messages.next()) is not None:
            start, kind = messages.count - 1, key(first)
            group, weight = [first], 0
            while len(group) < most and (following := messages.peek()) is not None:
                message, size = following
                if key(message) != kind or weight + size > most_bytes:
                    break
                group.append(messages.take())
                weight += size
            pending.append((start, len(group), asyncio.ensure_future(answer(group))))
            while pending and (len(pending) >= ahead or pending[0][2].done()):
                for reply in await _done(*pending.popleft()):
                    yield reply
        while pending:
            for reply in await _done(*pending.popleft()):
                yield reply
    finally:
        for _, _, task in pending:
            task.cancel()
        await messages.close()


async def _done(start: int, size: int, task: asyncio.Future[Sequence[R]]) -> Sequence[R]:
    """A group's answers; its failure says which of the stream's messages it held (counted
    from 0; an input ``inputs[i]`` of a group is the message ``start + i``)."""
    try:
        return await task
    except HTTPError as exc:
        where = f"message {start}" if size == 1 else f"messages {start} to {start + size - 1} (inputs[i]: {start} + i)"
        exc.message = f"the stream's {where}: {exc.message}"
        raise
