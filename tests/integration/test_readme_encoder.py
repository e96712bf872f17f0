"""``Encoder()`` loads the default model as quietly as ``bertserve start`` does (nothing of
TensorFlow's on stderr), unless ``verbose=True``. The documentation's ``Encoder`` examples run
as written, with nothing on stderr, in tests/integration/test_doc_examples.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.minilm

# What TensorFlow, CUDA, oneDNN and absl write as TensorFlow loads on a machine like CI's.
_NOISE = re.compile(
    r"^[IWEF]\d{4} |^(INFO|WARNING|ERROR): |cuda|cuInit|TF-TRT|oneDNN|absl|tensorflow|Warning", re.M | re.I
)


def _run(code: str, graph_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, outside the repository, with no TensorFlow log level
    set (the user's default) and the run's graph cache."""
    environ = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    environ.update(BERTSERVE_GRAPH_DIR=str(graph_dir), **env)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=graph_dir, env=environ, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def graph_dir(session_graph_dir: str) -> Path:
    """The run's graph cache: the default model's graph is built once, by whichever test needs it first."""
    return Path(session_graph_dir)


def test_encoder_is_as_quiet_as_the_server_unless_verbose(minilm: str, graph_dir: Path) -> None:
    code = (
        "import warnings; warnings.simplefilter('default')\n"  # Python's warnings shown, as a developer's -W would
        "from bertserve.server import Encoder\n"
        "encoder = Encoder({})\n"
        "print(encoder.encode(['hello world']).shape)\n"
    )
    quiet = _run(code.format(""), graph_dir)
    assert quiet.returncode == 0 and quiet.stdout.strip() == "(1, 384)", quiet.stderr
    assert _NOISE.search(quiet.stderr) is None and quiet.stderr == "", quiet.stderr
    verbose = _run(code.format("verbose=True"), graph_dir)
    assert verbose.returncode == 0 and verbose.stdout.strip() == "(1, 384)", verbose.stderr
    assert _NOISE.search(verbose.stderr) is not None, "verbose=True shows TensorFlow's lines"
