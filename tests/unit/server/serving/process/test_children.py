"""The supervisors' children: Ctrl-C at a terminal reaches only their supervisor, and a
join that the user hurries kills what is left at once, without a warning."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import pytest
from bertserve.server.serving.process.children import Children
from bertserve.server.serving.process.lifecycle import FORCED_STOP_SECONDS


def _blocked_signals(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigBlk line")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal mask from /proc")
def test_a_child_starts_with_sigint_blocked_and_its_parent_does_not_keep_it_so(caplog) -> None:
    children = Children(3, logging.getLogger("test"))
    child = children.start("sleeper", time.sleep, (30,), "sleeper")
    try:
        assert child.pid is not None
        assert _blocked_signals(child.pid) & (1 << (signal.SIGINT - 1))
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        children.join(seconds=0.1, hurry=lambda: True)
    assert not child.is_alive()


def test_a_hurried_join_kills_at_once_without_a_warning(caplog) -> None:
    children = Children(3, logging.getLogger("test.children"))
    children.start("sleeper", time.sleep, (30,), "sleeper")
    asked = time.monotonic() + 0.3
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, "test.children"):
        children.join(seconds=30, hurry=lambda: time.monotonic() >= asked)
    assert time.monotonic() - started < 0.3 + FORCED_STOP_SECONDS + 2
    assert not caplog.records


def test_a_child_that_outlives_its_join_is_killed_with_a_warning(caplog) -> None:
    children = Children(3, logging.getLogger("test.children"))
    child = children.start("sleeper", time.sleep, (30,), "sleeper")
    with caplog.at_level(logging.WARNING, "test.children"):
        children.join(seconds=0.3)
    assert not child.is_alive()
    assert [record.getMessage() for record in caplog.records] == ["sleeper did not stop in time; killing it"]
