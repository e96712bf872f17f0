"""Fixtures for the end-to-end tests: real server processes on free ports.

A server that no test kills, stops, swaps or reconfigures is started once a session (once
per pytest-xdist worker) and shared by every file whose flags agree.
"""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
from bertserve.server.testing.launcher import RunningServer, start_server


@pytest.fixture(scope="session")
def tiny_server(tiny_google: str, session_graph_dir: str) -> Iterator[RunningServer]:
    """The tiny BERT on TensorFlow, for the tests whose point is its vectors (test_server,
    test_fairness, test_cli_encode_lines, test_legacy_client: hence the tokens for old clients)."""
    server = start_server(
        "--model-dir",
        tiny_google,
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        "32",
        "--max-batch-size",
        "16",
        "--max-latency-ms",
        "5",
        "--show-tokens-to-client",
    )
    yield server
    server.stop()


@pytest.fixture
def bertserve_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """``bertserve ARGS`` run by its ``main`` in this process, for a command that starts no
    process (a client command, ``embed``, a start refused for its flags): its exit code and
    what it printed, as ``subprocess.run`` would give them. The logging and the environment
    that ``main`` sets up are put back after the test."""
    from bertserve.server.cli.main import main

    ours, tensorflow = logging.getLogger("bertserve"), logging.getLogger("tensorflow")
    saved = (ours.handlers[:], ours.level, ours.propagate, tensorflow.level)
    for name in ("TF_CPP_MIN_LOG_LEVEL", "PROMETHEUS_MULTIPROC_DIR"):  # main may set them: restored at teardown
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["bertserve", *args], code, out, err)

    try:
        yield run
    finally:
        ours.handlers[:] = saved[0]
        ours.setLevel(saved[1])
        ours.propagate = saved[2]
        tensorflow.setLevel(saved[3])
