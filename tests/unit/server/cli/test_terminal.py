"""Colour on terminals only: the CLI's status lines, the ready line and the log lines."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from bertserve.client.terminal import colour_wanted, paint, print_status
from bertserve.server import logs
from bertserve.server.cli import main as cli
from bertserve.server.testing.config import server_config
from bertserve.server.testing.launcher import free_port

ESC = "\x1b["


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _colour_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No colour settings from the environment the tests run in."""
    for name in ("NO_COLOR", "FORCE_COLOR", "ANSI_COLORS_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    yield
    logging.getLogger("bertserve").handlers.clear()  # the handlers cli.main installed hold our streams


@pytest.mark.parametrize(
    ("env", "terminal", "wanted"),
    [
        ({}, True, True),
        ({}, False, False),
        ({"NO_COLOR": "1"}, True, False),
        ({"NO_COLOR": ""}, True, True),  # set but empty does not count
        ({"ANSI_COLORS_DISABLED": "1"}, True, False),
        ({"FORCE_COLOR": "1"}, False, True),
        ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False, False),
        ({"TERM": "dumb"}, True, False),
    ],
)
def test_colour_only_where_wanted(
    env: dict[str, str], terminal: bool, wanted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    stream = Terminal() if terminal else io.StringIO()
    assert colour_wanted(stream) is wanted
    assert (ESC in paint("text", "green", stream)) is wanted
    print_status("error", "it broke", stream)
    line = stream.getvalue()
    assert line.endswith(" it broke\n") and "bertserve: error:" in line
    assert (line == "bertserve: error: it broke\n") is not wanted


def test_a_closed_stream_is_no_terminal(tmp_path: Path) -> None:
    with open(tmp_path / "log", "w") as stream:
        pass
    assert not colour_wanted(stream)


def test_error_lines_are_red_on_a_terminal_and_plain_elsewhere(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status = ["status", "--port", str(free_port()), "--timeout", "100"]
    assert cli.main(status) == 1
    assert capsys.readouterr().err.startswith("bertserve: error: no bertserve server answered")

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main(status) == 1
    assert terminal.getvalue().startswith(ESC) and "no bertserve server answered" in terminal.getvalue()

    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setattr(sys, "stderr", terminal := Terminal())
    assert cli.main(["start", "--model-dir", "/m", "--max-batch-size", "0"]) == 2
    assert terminal.getvalue() == "bertserve: error: max_batch_size must be at least 1\n"


def test_the_ready_line_is_plain_in_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    config = server_config("/m", port=6000)
    info = {"pooling_strategy": "REDUCE_MEAN", "pooling_layer": [-1], "output_dim": 384, "dtype": "fp32"}
    for stream, coloured in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr(sys, "stdout", stream)
        cli.announce_ready(config, info)
        line = stream.getvalue()
        assert (ESC in line) is coloured
        assert "ready: requests on tcp://127.0.0.1:6000, results on port 6001, 1 worker" in line
        assert line.startswith("bertserve") is not coloured


def test_log_lines_are_coloured_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for stream, env, coloured in (
        (Terminal(), {}, True),
        (Terminal(), {"NO_COLOR": "1"}, False),
        (io.StringIO(), {}, False),
    ):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(sys, "stderr", stream)
        logs.setup_logging(logging.INFO)
        logging.getLogger("bertserve.test").warning("careful")
        assert "careful" in stream.getvalue() and (ESC in stream.getvalue()) is coloured
