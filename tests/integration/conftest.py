"""Fixtures for the end-to-end tests: real server processes on free ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from bertserve.server.testing.launcher import RunningServer, start_server


@pytest.fixture(scope="module")
def tiny_server(tiny_google: str, session_graph_dir: str) -> Iterator[RunningServer]:
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
    )
    yield server
    server.stop()
