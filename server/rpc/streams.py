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
    """A stream's incoming messages, read ahead into a bounded queue by a task of their own."""

    def __init__(self, requests: AsyncIterator[M], *, room: int, idle_s: float) -> None:
        self._queue: asyncio.Queue[object] = asyncio.Queue(room)
        self._idle_s = idle_s
        self._failure: Exception | None = None
        self._reader = asyncio.ensure_future(self._read(requests))
        self.count = 0  # messages taken so far

    async def _read(self, requests: AsyncIterator[M]) -> None:
        try:
            async for message in requests:
                await self._queue.put(message)
        except Exception as exc:  # a stream that could not be read: told when its end is taken
            self._failure = exc
        await self._queue.put(_END)  # not once cancelled: nobody takes it then

    async def next(self) -> M | None:
        """The next message, waiting at most ``idle_s`` (None: the stream has ended)."""
        try:
            item = await asyncio.wait_for(self._queue.get(), self._idle_s)
        except asyncio.TimeoutError:
            raise CallError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the stream sent nothing for {self._idle_s:g} s (--grpc-idle-timeout-s); it is ended",
            ) from None
        if item is _END:
            if self._failure is not None:
                raise self._failure
            return None
        self.count += 1
        return item  # type: ignore[return-value]

    def waiting(self) -> M | None:
        """A message already here, if any (never waits)."""
        try:
            item = self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None
        if item is _END:
            self._queue.put_nowait(_END)  # seen again by next()
            return None
        self.count += 1
        return item  # type: ignore[return-value]

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
    ahead: int = 4,
) -> AsyncIterator[R]:
    """The answers to ``messages``, one a message and in their order, ``answer`` given groups of
    at most ``most`` consecutive messages of one ``key`` (their options), ``ahead`` groups at once."""
    pending: deque[tuple[int, int, asyncio.Future[Sequence[R]]]] = deque()
    held: M | None = None  # a message taken that begins the next group
    try:
        while True:
            first = held if held is not None else await messages.next()
            held = None
            if first is None:
                break
            start = messages.count - 1
            group, kind = [first], key(first)
            while len(group) < most and (following := messages.waiting()) is not None:
                if key(following) != kind:
                    held = following
                    break
                group.append(following)
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
