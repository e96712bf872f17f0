"""Noticing a caller that leaves while its request waits on the server, and the :class:`Call`
the API's checks and its gateway see of each request, whichever front end it came through.

Neither uvicorn nor FastAPI cancels a handler when its client disconnects: the handler runs
on, and the work it asked for is done for nobody. Once a request's body has been read,
the ASGI ``receive`` has nothing more to give until the connection closes (or the response
is sent), when it gives ``http.disconnect``. :func:`unless_disconnected` waits on that
beside the work, and cancels the work when it fires; the gateway then withdraws the request
from the server (``CANCEL``), so queued work of a caller who left is dropped before it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


@dataclass(frozen=True)
class Call:
    """One request as the API sees it, over HTTP or gRPC: whom the server's bounds and turns
    count it to (``key:NAME``, ``address:HOST``), a wait that ends when its caller leaves, and
    the caller's own deadline, if it gave one (a gRPC call's, on the monotonic clock)."""

    owner: str
    left: Callable[[], Awaitable[object]]
    deadline: float | None = None

    def timeout_s(self, most: float) -> float:
        """How long the call may wait for its answer: ``most``, or less if its deadline is sooner."""
        return most if self.deadline is None else min(most, self.deadline - time.monotonic())


async def unless_disconnected(work: Awaitable[T], left: Awaitable[object]) -> T:
    """The result of ``work``, unless the client leaves first (``left`` ends): then ``work``
    is cancelled (and has finished cancelling) and :class:`ClientGone` is raised."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(left)
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if task.cancelled() or task.exception() is not None:
            raise ClientGone("the client closed the connection") from None
        return task.result()  # it finished as it was told to stop
    finally:
        for pending in (task, watch):
            pending.cancel()


async def disconnected(receive: Receive) -> None:
    """Ends when an HTTP request's connection does: its ``receive``, the body already read,
    has nothing more to give until then."""
    while (await receive())["type"] != "http.disconnect":
        continue
