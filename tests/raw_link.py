"""Bare ZeroMQ frames to a running server: a PUSH to its request port and a SUB on one
client's replies, for the tests that send what no bertserve client would."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import zmq
from bertserve.client import protocol as p
from bertserve.server.testing.launcher import RunningServer


@contextlib.contextmanager
def raw_link(server: RunningServer, client: bytes) -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A bare PUSH to the request port and a SUB on ``client``'s replies, subscribed."""
    context = zmq.Context()
    push, sub = context.socket(zmq.PUSH), context.socket(zmq.SUB)
    try:
        push.linger = sub.linger = 0
        sub.connect(f"tcp://127.0.0.1:{server.port_out}")
        sub.setsockopt(zmq.SUBSCRIBE, client)
        push.connect(f"tcp://127.0.0.1:{server.port}")
        time.sleep(0.5)  # the subscription reaches the server
        yield push, sub
    finally:
        push.close()
        sub.close()
        context.term()


def raw_request(server: RunningServer, frames: list[bytes], client: bytes, timeout_s: float = 5) -> p.Reply | None:
    """Send ``frames`` and return the first reply published to ``client``, if any comes."""
    with raw_link(server, client) as (push, sub):
        push.send_multipart(frames)
        return p.decode_reply(sub.recv_multipart()) if sub.poll(int(timeout_s * 1000)) else None
