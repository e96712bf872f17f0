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


def request_socket(context: zmq.Context, message_limit: int) -> zmq.Socket:
    """The socket requests come in on, taking frames of at most ``message_limit`` bytes (not bound yet)."""
    frontend = context.socket(zmq.PULL)
    frontend.linger = 0
    frontend.maxmsgsize = message_limit  # a larger frame is dropped unread
    # Requests one connection may have waiting in this process, read but not yet taken: at most
    # ~64 MiB of them. ZeroMQ bounds this per connection only; the ventilator takes them as they
    # come, and refuses what does not fit --max-queued-bytes.
    frontend.rcvhwm = max(1, min(1000, 64 * 2**20 // message_limit))
    return frontend


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
