"""A rogue head: a fake ROUTER on loopback answers a real ``bertserve worker``.

Its WELCOME names a file outside the worker's model directory (an absolute path, a ``../``
path) or a model class the worker's command line did not name: the worker refuses it with a
line that says why, exits with code 2 and starts no worker process (so it opens no such file,
and imports no such class: the class's module would leave a mark if imported). A WELCOME that
keeps the rules is taken, so the refusals are the rules' doing. Under CURVE a worker given
``--server-key`` does not even say HELLO to a head holding another key.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from bertserve.client import protocol as p
from bertserve.server.serving.protocol import wire
from bertserve.server.testing.launcher import RunningServer, free_port, start_worker_host
from faulty_model import pythonpath_env

pytestmark = pytest.mark.timeout(120)

MODEL = "faulty_model:FaultyModel"


class RogueHead:
    """A ROUTER that answers every HELLO with ``welcome``, and remembers what it was sent."""

    def __init__(self, context: zmq.Context, welcome: dict[str, Any], curve_secret: bytes | None = None) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        if curve_secret is not None:
            self.socket.curve_secretkey = curve_secret
            self.socket.curve_publickey = zmq.curve_public(curve_secret)
            self.socket.curve_server = True
        self.port = free_port()
        self.socket.bind(f"tcp://127.0.0.1:{self.port}")
        self.welcome = p.dumps(
            {"model": {}, "model_class": None, "tuned": False, "heartbeat_timeout_ms": 10_000, **welcome}
        )
        self.kinds: list[bytes] = []

    def serve(self, host: RunningServer, seconds: float, until: bytes | None = None) -> None:
        """Answer for ``seconds``, or until ``host`` exits (or sends a message of kind ``until``)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and host.process.poll() is None and until not in self.kinds:
            if not self.socket.poll(100):
                continue
            frames = self.socket.recv_multipart()
            self.kinds.append(frames[1])
            if frames[1] == wire.HELLO:
                self.socket.send_multipart([frames[0], wire.WELCOME, self.welcome])


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def evil_module(tmp_path: Path) -> Path:
    """A model class whose module leaves a mark when imported; returns where the mark would be."""
    mark = tmp_path / "imported"
    (tmp_path / "evil_model.py").write_text(f"open({str(mark)!r}, 'w').close()\n\n\nclass EvilModel:\n    pass\n")
    return mark


def env_with(tmp_path: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{tmp_path}{os.pathsep}{pythonpath_env()['PYTHONPATH']}"}


@pytest.mark.parametrize(
    ("welcome", "flags", "said"),
    [
        ({"model": {"vocab_name": "/etc/passwd"}}, (), "vocab_name: Value error, '/etc/passwd' is not a plain"),
        ({"model": {"config_name": "../../outside.json"}}, (), "config_name: Value error, '../../outside.json'"),
        ({"model": {"ckpt_name": "sub/../../../model.ckpt"}}, (), "ckpt_name"),
        ({"model_class": "evil_model:EvilModel"}, (), "pass --model-class evil_model:EvilModel if you trust that code"),
        ({"model_class": "evil_model:EvilModel"}, ("--model-class", MODEL), f"was started with --model-class {MODEL}"),
    ],
    ids=["absolute-vocab", "dotdot-config", "dotdot-ckpt", "class-not-given", "other-class"],
)
def test_a_worker_refuses_a_rogue_heads_welcome(
    tiny_google: str,
    tmp_path: Path,
    context: zmq.Context,
    evil_module: Path,
    welcome: dict[str, Any],
    flags: tuple[str, ...],
    said: str,
) -> None:
    rogue = RogueHead(context, welcome)
    host = start_worker_host(
        rogue.port, "--model-dir", tiny_google, *flags, env=env_with(tmp_path), expect_joined=False
    )
    try:
        rogue.serve(host, 60)
        assert host.process.wait(30) == 2
    finally:
        if host.process.poll() is None:
            host.stop()
        host.wait_stopped()
    log = host.tail(200)
    assert "refused the WELCOME of the head" in log and said in log, log
    assert "joined the head" not in log and "worker 0" not in log, log
    assert not evil_module.exists(), "the worker imported the class the head named"
    assert rogue.kinds and set(rogue.kinds) <= {wire.HELLO}, rogue.kinds  # no READY: no worker process ran


def test_a_welcome_that_keeps_the_rules_is_taken(tiny_google: str, tmp_path: Path, context: zmq.Context) -> None:
    rogue = RogueHead(context, {"model": {"vocab_name": "vocab.txt", "max_seq_len": 32}, "model_class": MODEL})
    host = start_worker_host(
        rogue.port, "--model-dir", tiny_google, "--model-class", MODEL, env=env_with(tmp_path), expect_joined=False
    )
    try:
        rogue.serve(host, 60, until=wire.READY)  # its worker process runs, and registers
        assert wire.READY in rogue.kinds, host.tail(100)
        assert "joined the head" in host.tail(200)
    finally:
        host.stop()


def test_a_worker_with_a_server_key_does_not_talk_to_a_head_with_another(
    tiny_google: str, tmp_path: Path, context: zmq.Context
) -> None:
    from bertserve.server.security import keygen

    real_public, _ = keygen(tmp_path / "head", "server")
    _, worker_secret = keygen(tmp_path / "worker", "worker")
    _, rogue_secret = zmq.curve_keypair()
    rogue = RogueHead(context, {}, curve_secret=rogue_secret)
    host = start_worker_host(
        rogue.port,
        "--model-dir",
        tiny_google,
        "--server-key",
        str(real_public),
        "--client-cert",
        str(worker_secret),
        env=env_with(tmp_path),
        expect_joined=False,
    )
    try:
        rogue.serve(host, 8)  # the host says HELLO every second, to a head it can authenticate
        assert rogue.kinds == [] and host.process.poll() is None
        assert "joined the head" not in host.tail(200)
    finally:
        host.stop()


def test_a_worker_without_a_server_key_drops_a_frame_past_the_link_limit(
    tiny_google: str, tmp_path: Path, context: zmq.Context
) -> None:
    """A head that sends a frame larger than any job needs loses its connection at the frame's
    header: the worker never holds it (nor logs it as a malformed message), and joins again."""
    from bertserve.server.serving.protocol.link import MAX_FRAME_BYTES

    rogue = RogueHead(context, {})
    monitor = rogue.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    host = start_worker_host(rogue.port, "--model-dir", tiny_google, env=env_with(tmp_path), expect_joined=False)
    try:
        assert rogue.socket.poll(30_000), "the worker said no HELLO"
        peer, kind, _ = rogue.socket.recv_multipart()
        assert kind == wire.HELLO
        huge = bytearray(MAX_FRAME_BYTES + 1)
        rogue.socket.send_multipart([peer, wire.HEARTBEAT, huge], copy=False)
        del huge
        assert monitor.poll(30_000), "the worker kept a connection that sent it a frame past its limit"
        rogue.serve(host, 5, until=wire.HELLO)  # and it comes back
        assert host.process.poll() is None
    finally:
        monitor.close(linger=0)
        host.stop()
    assert "dropped a malformed message" not in host.tail(200)
