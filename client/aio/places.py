"""The sends of an event loop waiting their turn for a place in a
:class:`~bertserve.client.core.window.ReplyWindow`: the asyncio client's, and the HTTP front end's.

The window itself only counts (no sockets, the clock passed in); :class:`AsyncPlaces` is the
waiting, on the loop, first come first.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from ..core.window import ReplyWindow


class AsyncPlaces:
    """The sends of one event loop waiting for a place in ``window``, first come first.

    :meth:`take` reserves a place (waiting while the window is full); the sender then calls
    ``window.sent`` (the place is used) or :meth:`give_back`. Whoever frees a place (a reply
    in, a request abandoned) calls :meth:`hand_out`.
    """

    def __init__(self, window: ReplyWindow) -> None:
        self.window = window
        self._turns: deque[asyncio.Future[None]] = deque()

    async def take(self, deadline: float, closed: Callable[[], bool]) -> bool:
        """Reserve a place, waiting behind earlier senders while the window is full; ``False``
        if none came by ``deadline`` (``time.monotonic()``). Once ``closed()`` the wait ends
        (the caller tells the closing apart)."""
        if not self._turns and self.window.has_room(time.monotonic()):
            self.window.reserve()
            return True
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._turns.append(turn)
        taken = False
        try:
            while not turn.done():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                # At most a second at a time: an abandoned request's place frees itself when its grace runs out.
                await asyncio.wait([turn], timeout=min(remaining, 1.0))
                if not turn.done():
                    self.hand_out()
            if closed():
                return False
            taken = True
            return True
        finally:
            if not turn.done():
                turn.cancel()  # hand_out skips it
            elif not taken and not turn.cancelled():  # given a place it will not use
                self.give_back()

    def give_back(self) -> None:
        """A place :meth:`take` reserved that was not used."""
        self.window.unreserve()
        self.hand_out()

    def hand_out(self) -> None:
        """Give the free places to the sends waiting for one, first come first."""
        while self._turns and self.window.has_room(time.monotonic()):
            turn = self._turns.popleft()
            if not turn.done():
                self.window.reserve()
                turn.set_result(None)

    def wake_all(self) -> None:
        """End every wait (the connection is closing): each :meth:`take` sees ``closed()``."""
        turns, self._turns = self._turns, deque()
        for turn in turns:
            if not turn.done():
                turn.set_result(None)
