"""The port probe against peers that do not play fair: one that streams without end is heard
only so far, and what a peer names itself is quoted printable and short."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import zmq
from bertserve.client.probe import PROBE_FOR_S, PeerProbe

GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)


def _serving(answer: bytes, then: bytes = b"", endless: bool = False) -> Iterator[int]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        try:
            connection.sendall(answer + then)
            while endless and not stop.is_set():
                connection.sendall(b"\x00" * 65536)  # a frame's body that never ends
        except OSError:
            pass
        finally:
            stop.wait(5)
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        listener.close()


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.term()


def _probe(context: zmq.Context, port: int) -> PeerProbe:
    started = time.monotonic()
    probe = PeerProbe(context, f"tcp://127.0.0.1:{port}", ipv6=False, now=started)
    while not probe.done:
        assert time.monotonic() - started < PROBE_FOR_S + 2, "the probe did not finish"
        probe.advance(time.monotonic())
        time.sleep(0.01)
    return probe


def test_a_peer_that_streams_without_end_is_heard_only_so_far(context: zmq.Context) -> None:
    long_frame = b"\x06" + (1 << 40).to_bytes(8, "big")  # a long command frame, a TiB announced
    for port in _serving(GREETING, long_frame, endless=True):
        probe = _probe(context, port)
        assert probe.peer is not None and probe.peer.zeromq
        assert len(probe._heard) <= 64 + 512


def test_what_a_peer_calls_itself_is_quoted_printable_and_short(context: zmq.Context) -> None:
    name = b"\x1b[31mPUB" + b"x" * 100
    ready = b"\x05READY" + b"\x0bSocket-Type" + len(name).to_bytes(4, "big") + name
    for port in _serving(GREETING, b"\x04" + bytes([len(ready)]) + ready):
        probe = _probe(context, port)
    assert probe.peer is not None and probe.peer.socket_type is not None
    assert probe.peer.socket_type.isprintable() and len(probe.peer.socket_type) <= 40
    assert "\x1b" not in probe.peer.socket_type
