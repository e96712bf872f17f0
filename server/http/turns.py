"""The HTTP process's tokenizing turns: its tokenizing work runs in threads, a bounded number
at a time and fairly shared between callers (:class:`Tokenizing`)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

AT_ONCE = 2
"""Tokenizing turns run at once in the HTTP process; the rest wait."""

T = TypeVar("T")


class Tokenizing:
    """Tokenizing work of the HTTP process, in threads: :data:`AT_ONCE` turns at a time, and
    one at a time for each caller (``owner``: its principal or address), so that what it holds
    is bounded however many requests come, and no caller holds every turn. Waiting callers
    take turns round robin, whatever number of requests each sends. A caller that leaves
    while it waits gives its place up; one that leaves while its turn runs lets the thread end
    (it cannot be stopped), and only then is its turn passed on. Long work is cut into turns
    by its callers, so a caller who left starts no more of it."""

    def __init__(self, at_once: int = AT_ONCE) -> None:
        self._free = at_once
        self._busy: set[str] = set()  # owners whose turn runs
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}  # each owner's waiters, in order
        self._order: deque[str] = deque()  # owners with waiters, in the order their turns come

    async def run(self, work: Callable[..., T], *args: Any, owner: str = "", **kwargs: Any) -> T:
        await self._take(owner)
        running = asyncio.ensure_future(asyncio.to_thread(work, *args, **kwargs))
        try:
            return await asyncio.shield(running)
        finally:
            if running.done():
                self._give(owner)
            else:  # its caller left while its thread runs: the turn is passed on when the thread ends
                running.add_done_callback(lambda done: self._left(owner, done))

    def _left(self, owner: str, done: asyncio.Future[Any]) -> None:
        if not done.cancelled():
            done.exception()  # nobody waits for what it gave: read, so it is not reported as lost
        self._give(owner)

    async def _take(self, owner: str) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(owner)
        if queue is None:
            queue = self._waiting[owner] = deque()
            self._order.append(owner)
        queue.append(waiter)
        self._hand_out()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # its turn came as it was cancelled: pass it on
                self._give(owner)
            else:
                self._forget(owner, waiter)
            raise

    def _give(self, owner: str) -> None:
        self._busy.discard(owner)
        self._free += 1
        self._hand_out()

    def _hand_out(self) -> None:
        """Turns to the waiting owners whose turn is next, round robin, none to a busy owner."""
        for _ in range(len(self._order)):
            if self._free <= 0:
                return
            owner = self._order.popleft()
            if owner in self._busy:
                self._order.append(owner)
                continue
            queue = self._waiting[owner]
            waiter = queue.popleft()
            if queue:
                self._order.append(owner)
            else:
                del self._waiting[owner]
            self._free -= 1
            self._busy.add(owner)
            waiter.set_result(None)

    def _forget(self, owner: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(owner)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        if not queue:
            del self._waiting[owner]
            self._order.remove(owner)
