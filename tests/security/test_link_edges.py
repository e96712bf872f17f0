"""The worker link's edges under attack: a real head on loopback, and raw DEALER sockets that
play hosts, some joined (with the head's model sha256), some never.

- A READY whose model description carries keys the link does not declare (``protocol``,
  ``server_version``, ``curve``, ``max_message_bytes``) is refused: the worker is not
  registered, and a new client still reads the head's own protocol and limits.
- What a remote worker reports of its model lives as long as that worker: once it has left,
  CONFIG no longer says it.
- Ten peers that never said HELLO flood the link with large RESULT headers: the head parses
  none of them, so a CONFIG round trip stays fast (p99 under 20 ms).
- A RESULT whose header is far larger than its job could need is refused before it is
  parsed: its worker is broken (FORGET), and the job runs again on another worker.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from bertserve.client import BertClient, __version__ as client_version, protocol as p
from bertserve.server.model.checksum import tree_sha256
from bertserve.server.serving.protocol import wire
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from faulty_model import expected, pythonpath_env, wait_for

pytestmark = pytest.mark.timeout(120)

MODEL = "faulty_model:FaultyModel"
FLOODERS = 10
CONFIG_P99_MS = 20.0


class Peer:
    """A raw DEALER on the worker link, as a host (or a stranger) would hold it."""

    def __init__(self, context: zmq.Context, port: int, identity: bytes) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.identity = identity
        self.socket.linger = 0
        self.socket.sndhwm = 8  # a head that stops reading blocks the sender, not the test's memory
        self.socket.sndtimeo = 20_000  # and fails the test rather than hanging it
        self.socket.connect(f"tcp://127.0.0.1:{port}")

    def send(self, frames: list[Any]) -> None:
        self.socket.send_multipart(frames, copy=False)

    def expect(self, kind: bytes, timeout: float = 10.0) -> list[bytes]:
        """The next message of ``kind`` from the head (others are skipped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.socket.poll(100):
                frames = self.socket.recv_multipart()
                if frames[0] == kind:
                    return frames
        raise AssertionError(f"the head sent no {kind!r} within {timeout:.0f} s")

    def join(self, sha: str, workers: int = 4) -> None:
        hello = {
            "link": wire.LINK_VERSION,
            "version": "edge",
            "hostname": "edge",
            "model_sha256": sha,
            "workers": workers,
        }
        self.send([wire.HELLO, p.dumps(hello)])
        self.expect(wire.WELCOME)

    def ready(self, name: bytes, model: dict[str, Any] | None = None, credits: int = 1) -> None:
        ready: dict[str, Any] = {"worker": 0, "pid": 4242, "credits": credits, "hostname": "edge"}
        if model is not None:
            ready["model"] = model
        self.send([wire.READY, name, p.dumps(ready)])

    def close(self) -> None:
        self.socket.close(linger=0)


@pytest.fixture(scope="module")
def worker_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def head(tiny_google: str, worker_port: int) -> Iterator[RunningServer]:
    """A head with no local worker: every worker it has joins over the link."""
    running = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        MODEL,
        "--num-worker",
        "0",
        "--worker-port",
        str(worker_port),
        "--max-latency-ms",
        "1",
        "--heartbeat-timeout-ms",
        "30000",
        "--job-timeout-ms",
        "30000",
        env=pythonpath_env(),
        timeout=90,
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def sha(tiny_google: str) -> str:
    return tree_sha256(tiny_google, None)


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def client(head: RunningServer, **options: Any) -> BertClient:
    return BertClient(**head.client_kwargs, timeout=options.pop("timeout", 20_000), **options)


def workers(head: RunningServer) -> list[dict[str, Any]]:
    with client(head) as bc:
        return list(bc.server_status["workers"])


def test_a_rogue_ready_cannot_rewrite_what_a_new_client_reads(
    head: RunningServer, worker_port: int, context: zmq.Context, sha: str
) -> None:
    with client(head) as bc:
        before = bc.server_config
    rogue = Peer(context, worker_port, b"rogue-ready")
    try:
        rogue.join(sha)
        rogue.ready(
            b"w0-1",
            {
                "output_dim": 16,
                "protocol": 999,
                "server_version": "0.0.1-rogue",
                "curve": True,
                "max_message_bytes": 10,
            },
        )
        rogue.ready(b"w1-1")  # a worker that keeps the rules, read after the rogue one
        wait_for(lambda: any(w["remote"] for w in workers(head)), 20, "the rule-keeping worker registering")
        assert len(workers(head)) == 1, "a READY with undeclared model keys registered its worker"
        with client(head) as fresh:  # a rewritten protocol would raise ProtocolVersionError here
            after = fresh.server_config
        for key in ("protocol", "server_version", "curve", "max_message_bytes"):
            assert after[key] == before[key], key
        assert after["protocol"] == p.PROTOCOL_VERSION and after["server_version"] == client_version
    finally:
        rogue.send([wire.BYE])
        wait_for(lambda: not workers(head), 20, "the rogue host leaving")
        rogue.close()


def test_what_a_remote_worker_says_of_its_model_leaves_with_it(
    head: RunningServer, worker_port: int, context: zmq.Context, sha: str
) -> None:
    peer = Peer(context, worker_port, b"says-and-leaves")
    try:
        peer.join(sha)
        peer.ready(b"w0-1", {"output_dim": 99, "max_seq_len": 7})
        wait_for(lambda: workers(head), 20, "the worker registering")
        with client(head) as bc:
            assert bc.server_config["output_dim"] == 99  # the only worker of the model says so
        peer.send([wire.BYE])
        wait_for(lambda: not workers(head), 20, "the host leaving")
        with client(head) as bc:
            config = bc.server_config
        assert config.get("output_dim") != 99 and config.get("max_seq_len") != 7, "the description outlived its worker"
        assert config["models"][0]["output_dim"] != 99
    finally:
        peer.close()


def _flood_header(parts: int) -> bytes:
    """A RESULT header that is costly to parse: ``parts`` parts of one row each."""
    return p.dumps(
        {"parts": [{"key": f"k{i}", "rows": [0]} for i in range(parts)], "dtype": "float32", "shape": [parts, 16]}
    )


def _config_round_trips(head: RunningServer, seconds: float) -> list[float]:
    """Milliseconds of each CONFIG round trip, one after another for ``seconds``."""
    times = []
    with client(head, timeout=10_000) as bc:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            bc.server_config  # noqa: B018 - the round trip is the point
            times.append((time.perf_counter() - started) * 1000)
    return times


def p99(times: list[float]) -> float:
    return float(np.percentile(times, 99))


def test_peers_that_never_joined_cost_the_heads_loop_nothing(
    head: RunningServer, worker_port: int, context: zmq.Context
) -> None:
    calm = _config_round_trips(head, 1.0)
    small, large = _flood_header(5_000), _flood_header(550_000)  # about 0.13 MiB and 15 MiB
    stop = threading.Event()
    sent = [0] * FLOODERS
    errors: list[str] = []
    peers = [Peer(context, worker_port, f"stranger-{i}".encode()) for i in range(FLOODERS)]

    def flood(index: int) -> None:
        peer = peers[index]
        try:
            while not stop.is_set():
                header = large if sent[index] % 100 == 0 else small
                peer.send([wire.RESULT, b"w0-1", b"1", header, b""])
                sent[index] += 1
                while peer.socket.poll(0):  # BYE: it is not joined
                    peer.socket.recv_multipart()
                time.sleep(0.01)
        except zmq.ZMQError as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(FLOODERS)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        flooded = _config_round_trips(head, 4.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        for peer in peers:
            peer.close()
    print(
        f"CONFIG p99 {p99(calm):.1f} ms calm, {p99(flooded):.1f} ms while {FLOODERS} strangers sent {sum(sent)} "
        f"RESULTs (median {statistics.median(flooded):.1f} ms, {len(flooded)} round trips)"
    )
    assert not errors, errors
    assert sum(sent) >= 10 * FLOODERS
    assert p99(flooded) < CONFIG_P99_MS, (p99(calm), p99(flooded))
    assert head.process.poll() is None


def test_a_result_header_larger_than_its_job_needs_is_refused_unread(
    head: RunningServer, worker_port: int, context: zmq.Context, sha: str
) -> None:
    peer = Peer(context, worker_port, b"swollen-result")
    texts = ["one swollen answer"]
    try:
        peer.join(sha)
        peer.ready(b"w0-1", {"output_dim": 16})
        wait_for(lambda: workers(head), 20, "the worker registering")
        with client(head, timeout=30_000) as bc:
            bc.encode(texts, blocking=False)
            _, worker, job_id, raw_header, _ = peer.expect(wire.JOB)
            header = {
                "parts": p.loads(raw_header)["parts"],
                "dtype": "float32",
                "shape": [1, 16],
                "tokens": [["x" * (4 << 20)]],
            }
            vectors = np.ascontiguousarray(expected(texts), dtype=np.float32).tobytes()
            peer.send([wire.RESULT, worker, job_id, p.dumps(header), vectors])
            forget = peer.expect(wire.FORGET)
            assert forget[1] == worker, forget
            peer.ready(b"w0-2", {"output_dim": 16})  # its replacement: the job runs again there
            _, worker, job_id, raw_header, _ = peer.expect(wire.JOB)
            header = {"parts": p.loads(raw_header)["parts"], "dtype": "float32", "shape": [1, 16], "truncated": [False]}
            peer.send([wire.RESULT, worker, job_id, p.dumps(header), vectors])
            peer.send([wire.DONE, p.dumps({"job": job_id.decode(), "worker": worker.decode(), "seconds": 0.01})])
            np.testing.assert_allclose(bc.fetch_all(concat=True), expected(texts), atol=1e-6)
    finally:
        peer.send([wire.BYE])
        wait_for(lambda: not workers(head), 20, "the host leaving")
        peer.close()
