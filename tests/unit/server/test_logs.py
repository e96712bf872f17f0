"""Quiet TensorFlow and LiteRT: the level set in the environment, and the lines held back."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
from bertserve.server import logs
from bertserve.server.cli import main as cli
from bertserve.server.testing.launcher import free_port

# What the C++ libraries write while TensorFlow loads and LiteRT starts, as they write it.
NATIVE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    "I0000 00:00:1796120996.136590    5284 cudart_stub.cc:31] Could not find cuda drivers on your machine.\n",
    "E0000 00:00:1796120999.740965    5284 cuda_platform.cc:52] failed call to cuInit: CUDA error\n",
    "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n",
    "F0000 00:00:1796120999.740965    5284 something.cc:1] Check failed: the end\n",
]
OTHER = "Traceback (most recent call last): any line of another form\n"


@pytest.fixture(autouse=True)
def _tf_level(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Start without TF_CPP_MIN_LOG_LEVEL, and put back whatever the test set."""
    monkeypatch.delenv(logs.TF_LOG_LEVEL, raising=False)
    yield
    logging.getLogger("bertserve").handlers.clear()


def test_the_level_is_set_unless_verbose() -> None:
    logs.quiet_native_logs(verbose=True)
    assert logs.TF_LOG_LEVEL not in os.environ
    logs.quiet_native_logs(verbose=False)
    assert os.environ[logs.TF_LOG_LEVEL] == "3"


def test_a_level_the_user_set_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logs.TF_LOG_LEVEL, "0")
    logs.quiet_native_logs(verbose=False)
    assert os.environ[logs.TF_LOG_LEVEL] == "0"


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["status"], "3"),
        (["-v", "status"], None),
        (["start", "--model-dir", "/m", "--max-batch-size", "0"], "3"),
        (["start", "-v", "--model-dir", "/m", "--max-batch-size", "0"], None),
        (["embed", "-v", "--model-dir", "/m", "--max-seq-len", "2", "/no/such/file"], None),
        (["embed", "--model-dir", "/m", "--max-seq-len", "2", "/no/such/file"], "3"),
    ],
)
def test_the_command_line_sets_it_before_running_a_command(
    argv: list[str], level: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each command fails fast (no server, a bad flag), after the level is decided.
    if argv[-1] == "status":
        argv = [*argv, "--port", str(free_port()), "--timeout", "100"]
    assert cli.main(argv) in (1, 2)
    assert os.environ.get(logs.TF_LOG_LEVEL) == level
    assert logging.getLogger("tensorflow").level == (logging.NOTSET if level is None else logging.ERROR)
    capsys.readouterr()


def _write_native_lines() -> None:
    for line in [*NATIVE, OTHER]:
        os.write(2, line.encode())


@pytest.mark.parametrize(
    ("level", "shown"),
    [
        ("3", [NATIVE[4], OTHER]),
        ("2", [NATIVE[2], NATIVE[4], OTHER]),
        ("1", [NATIVE[0], NATIVE[2], NATIVE[4], OTHER]),
        ("0", [*NATIVE, OTHER]),
        ("not a number", [*NATIVE, OTHER]),
    ],
)
def test_lines_below_the_level_are_held_back(
    level: str, shown: list[str], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(logs.TF_LOG_LEVEL, level)
    with logs.held_native_output():
        _write_native_lines()
    assert capfd.readouterr().err == "".join(shown)


def test_nothing_is_held_at_level_zero_and_stderr_comes_back(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    with logs.held_native_output():
        os.write(2, NATIVE[1].encode())
        assert capfd.readouterr().err == NATIVE[1]  # at once, not when the block ends
    monkeypatch.setenv(logs.TF_LOG_LEVEL, "3")
    with pytest.raises(RuntimeError), logs.held_native_output():
        os.write(2, NATIVE[1].encode() + OTHER.encode())
        raise RuntimeError("the import failed")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == OTHER + "after\n"
