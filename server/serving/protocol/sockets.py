"""What the loops of the head and of a worker host do alike with their ZeroMQ sockets."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq


def bound(context: zmq.Context, kind: int, address: str) -> zmq.Socket:
    """A socket of ``kind`` bound to ``address``, that drops what it holds when closed."""
    sock = context.socket(kind)
    sock.linger = 0
    sock.bind(address)
    return sock


def drain(sock: zmq.Socket, handle: Callable[[list[Any]], None], *, copy: bool = True, seconds: float = 1.0) -> None:
    """Handle what ``sock`` holds, for at most ``seconds`` so the other sockets get a turn,
    and not once a handler has closed it."""
    until = time.monotonic() + seconds
    while time.monotonic() < until and not sock.closed:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            return
        handle(frames)
