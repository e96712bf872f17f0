"""Attack: many large request frames at once on the ZeroMQ request port must not run the head
out of memory.

ZeroMQ reads a frame whole before the ventilator sees it, and bounds its receive queue per
connection only, so what bounds the head is the frame size limit (``--max-message-bytes``,
16 MiB by default: a larger frame is dropped as its header arrives, unread) and the bound on
what the texts of admitted requests may hold (``--max-queued-bytes``). Each test samples the
head's resident memory (the server process and its children, the workers left out) while 32
connections send at once, and checks that it never grew by more than 300 MiB, that every
request was answered or refused, and that the server serves the right vectors after.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import zmq
from bertserve.client import BertClient, ServerBusyError, protocol as p
from bertserve.server.testing.launcher import RunningServer, start_server
from faulty_model import expected, pythonpath_env, sentences, wait_for

CONNECTIONS = 32
HEADROOM_MIB = 300
QUEUED_MIB = 12  # --max-queued-bytes of the server here, in MiB
MIB = 2**20


def peak_while(server: RunningServer, action: Callable[[], None]) -> tuple[float, float]:
    """The head's resident memory before ``action`` and at its peak while it runs, in MiB."""
    with BertClient(**server.client_kwargs, timeout=30_000) as client:
        workers = {int(worker["pid"]) for worker in client.server_status["workers"]}
        client.encode(["warm"])
    idle = peak = server.family_rss_mib(workers)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.02):
            peak = max(peak, server.family_rss_mib(workers))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        action()
    finally:
        done.set()
        sampler.join(5)
    return idle, peak


def long_texts(count: int, chars: int) -> list[str]:
    """``count`` texts of about ``chars`` characters, each of fewer words than the model keeps."""
    texts = []
    for text in sentences(count, seed=3):
        words = text.split()
        texts.append(" ".join(word * (chars // len(text) + 1) for word in words))
    return texts


def still_serves(server: RunningServer) -> dict[str, object]:
    """Encode a request right, then the server's status once it has let go of every request:
    the reply can reach the client before its worker's DONE reaches the head, which is when the
    head lets go of the request's bytes, so the status is read again until it has (a request
    never let go of fails here, after 10 s)."""
    texts = sentences(50, seed=5)
    with BertClient(**server.client_kwargs, timeout=30_000) as client:
        np.testing.assert_allclose(client.encode(texts), expected(texts), atol=1e-6)
        return wait_for(
            lambda: (status := client.server_status)["queued_bytes"] == 0 and status,
            timeout=10,
            what="the head letting go of the answered requests",
        )


@pytest.fixture(scope="module")
def server(tiny_google: str) -> Iterator[RunningServer]:
    running = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        "faulty_model:FaultyModel",
        "--max-queued-bytes",
        str(QUEUED_MIB * MIB),
        "--bulk-slowdown",
        "0",
        env=pythonpath_env(),
    )
    yield running
    running.stop()


@pytest.mark.timeout(180)
def test_32_frames_of_60_mb_at_once_are_dropped_unread(server: RunningServer) -> None:
    texts = long_texts(20_000, 3_600)
    frames = p.encode_request(b"raw-sender", p.ENCODE, 1, {"count": len(texts)}, texts)
    assert len(frames[-1]) > 60_000_000
    with BertClient(**server.client_kwargs, timeout=30_000) as client:  # ours refuses to send it
        limit = client.server_config["max_message_bytes"]
        assert limit == min(16, QUEUED_MIB) * MIB  # the default, at most --max-queued-bytes
        with pytest.raises(ValueError, match="max_message_bytes"):
            client.encode(texts)
    context = zmq.Context()
    sockets = []

    def send_all() -> None:
        for _ in range(CONNECTIONS):
            sock = context.socket(zmq.PUSH)
            sock.linger = 0
            sock.sndtimeo = 30_000
            sock.connect(f"tcp://127.0.0.1:{server.port}")
            sockets.append(sock)
        senders = [
            threading.Thread(
                target=sock.send_multipart,
                args=([f"raw-{i}".encode(), *frames[1:]],),
                kwargs={"copy": False},
                daemon=True,
            )
            for i, sock in enumerate(sockets)
        ]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(60)
        threading.Event().wait(3)  # ZeroMQ's I/O threads push the frames out meanwhile

    try:
        idle, peak = peak_while(server, send_all)
    finally:
        for sock in sockets:
            sock.close(linger=0)
        context.term()
    assert peak - idle < HEADROOM_MIB, f"the head grew from {idle:.0f} MiB to {peak:.0f} MiB"
    status = still_serves(server)
    assert status["queued_bytes"] == 0
    assert server.process.poll() is None
    print(f"32 frames of {len(frames[-1]) / 1e6:.0f} MB: head idle {idle:.0f} MiB, peak {peak:.0f} MiB")


@pytest.mark.timeout(180)
def test_32_requests_under_the_frame_limit_are_answered_or_busy_within_the_byte_bound(server: RunningServer) -> None:
    """Frames of about 1.7 MB, each 1,000 texts that hold about 1.8 MiB once parsed: a 12 MiB
    --max-queued-bytes takes some at a time, and the rest are refused with busy."""
    texts = long_texts(1_000, 2_000)
    size = len(p.dumps(texts)) / 1e6
    want = expected(texts)
    outcomes: list[str] = []
    statuses: list[int] = []

    def one() -> None:
        with BertClient(**server.client_kwargs, timeout=120_000) as client:
            try:
                vectors = client.encode(texts)
            except ServerBusyError as exc:
                outcomes.append("busy" if "--max-queued-bytes" in str(exc) else f"busy: {exc}")
                return
            except Exception as exc:
                outcomes.append(repr(exc))
                return
            outcomes.append("ok" if np.allclose(vectors, want, atol=1e-6) else "wrong")

    def watch(stop: threading.Event) -> None:
        with BertClient(**server.client_kwargs, timeout=30_000) as client:
            while not stop.wait(0.05):
                statuses.append(int(client.server_status["queued_bytes"]))

    def send_all() -> None:
        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(stop,), daemon=True)
        watcher.start()
        clients = [threading.Thread(target=one, daemon=True) for _ in range(CONNECTIONS)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(150)
        stop.set()
        watcher.join(10)

    idle, peak = peak_while(server, send_all)
    assert len(outcomes) == CONNECTIONS, outcomes
    assert set(outcomes) <= {"ok", "busy"}, outcomes
    assert "ok" in outcomes and "busy" in outcomes, outcomes
    assert max(statuses, default=0) <= QUEUED_MIB * MIB
    assert peak - idle < HEADROOM_MIB, f"the head grew from {idle:.0f} MiB to {peak:.0f} MiB"
    status = still_serves(server)
    assert status["queued_bytes"] == 0
    held = max(statuses, default=0) / MIB
    print(
        f"32 requests of {size:.1f} MB: {outcomes.count('ok')} answered, {outcomes.count('busy')} busy; at most "
        f"{held:.0f} MiB of texts held; head idle {idle:.0f} MiB, peak {peak:.0f} MiB"
    )
