"""Ctrl-C on ``bertserve encode`` and on ``BertClient.encode``: the requests in flight are
withdrawn from the server (CANCEL), so it drops their queued work instead of computing
vectors nobody reads; the server's ``requests_cancelled`` counts them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer, start_server
from faulty_model import pythonpath_env, sentences

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def paced(tiny_google: str) -> Iterator[RunningServer]:
    """50 ms a model run of at most 8 texts: 400 lines take seconds, long enough to interrupt."""
    server = start_server(
        "--model-dir",
        tiny_google,
        "--max-seq-len",
        "32",
        "--model-class",
        "faulty_model:PacedModel",
        "--max-batch-size",
        "8",
        env=pythonpath_env(),
        timeout=60,
    )
    yield server
    server.stop()


def _status(server: RunningServer) -> dict:
    with BertClient(**server.client_kwargs, timeout=10_000) as bc:
        return bc.server_status


def _wait_for(predicate, seconds: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_ctrl_c_on_bertserve_encode_withdraws_its_requests(paced: RunningServer, tmp_path: Path) -> None:
    before = _status(paced)
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(sentences(400)) + "\n", encoding="utf-8")
    ports = ["--host", "127.0.0.1", "--port", str(paced.port), "--port-out", str(paced.port_out)]
    argv = [sys.executable, "-m", "bertserve.server.cli", "encode", str(lines), "-o", str(tmp_path / "v.npy")]
    process = subprocess.Popen([*argv, *ports, "--batch-size", "16"], stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _status(paced)["requests_received"] >= before["requests_received"] + 2)
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 130
    finally:
        if process.poll() is None:
            process.kill()
    _wait_for(lambda: _status(paced)["requests_in_flight"] == 0)
    after = _status(paced)
    assert after["requests_cancelled"] > before["requests_cancelled"], after
    assert not (tmp_path / "v.npy").exists()


def test_ctrl_c_in_one_encode_call_withdraws_its_request(paced: RunningServer) -> None:
    before = _status(paced)
    with BertClient(**paced.client_kwargs, timeout=60_000) as bc:
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            bc.encode(sentences(300))  # 38 runs of 50 ms: still computing at 0.3 s
        timer.cancel()
        assert not bc._connection.transport.pending  # nothing kept for the withdrawn call
    _wait_for(lambda: _status(paced)["requests_in_flight"] == 0)
    assert _status(paced)["requests_cancelled"] == before["requests_cancelled"] + 1
