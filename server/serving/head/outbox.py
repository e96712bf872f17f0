"""The ventilator's line to the sink, which never blocks: messages ZeroMQ cannot take at
once wait in an outbox, in order, and go out as the sink reads."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import zmq

from ..protocol import wire
from ..protocol.formats import ReplyFormat

MAX_WAITING = 10_000  # messages waiting for the sink before the ventilator stops reading clients


class SinkOutbox:
    def __init__(self, context: zmq.Context, address: str) -> None:
        self.context = context
        self.address = address
        self.waiting: deque[list[Any]] = deque()
        self.socket = self._connect()

    def _connect(self) -> zmq.Socket:
        socket = self.context.socket(zmq.PUSH)
        socket.linger = 2000
        socket.sndhwm = 100_000
        socket.connect(self.address)
        return socket

    def __len__(self) -> int:
        return len(self.waiting)

    @property
    def full(self) -> bool:
        """A stalled sink: the ventilator reads no more clients until it catches up."""
        return len(self.waiting) >= MAX_WAITING

    def send(self, frames: list[Any]) -> None:
        if not self.waiting:
            try:
                self.socket.send_multipart(frames, zmq.NOBLOCK)
                return
            except zmq.Again:
                pass
        self.waiting.append(frames)

    def publish(self, fmt: ReplyFormat, frames: list[Any]) -> None:
        """A reply for the sink to send as it is, laid out by ``fmt``."""
        self.send([wire.PUBLISH, fmt.name, *frames])

    def flush(self) -> None:
        while self.waiting:
            try:
                self.socket.send_multipart(self.waiting[0], zmq.NOBLOCK)
            except zmq.Again:
                return
            self.waiting.popleft()

    def reconnect(self) -> None:
        """A new sink: what waited for the dead one (registrations of requests it lost) is dropped."""
        self.socket.close(linger=0)
        self.socket = self._connect()
        self.waiting.clear()

    def drain(self, timeout_s: float) -> None:
        """Send what waits, for at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.waiting and time.monotonic() < deadline:
            if self.socket.poll(50, zmq.POLLOUT):
                self.flush()

    def close(self) -> None:
        self.socket.close()
