"""A supervisor's child leaves SIGTERM to its supervisor while that lives (a signal to the whole
process group reaches both), and stops on it, as it always did, once it is an orphan."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from bertserve.server.serving.process.children import Children

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal masks from /proc"),
]


def _mask(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} line")


def _handles_sigterm(pid: int, within_s: float = 20.0) -> None:
    """Wait until process ``pid`` has its SIGTERM handler and no longer blocks SIGTERM."""
    bit = 1 << (signal.SIGTERM - 1)
    deadline = time.monotonic() + within_s
    while not (_mask(pid, "SigCgt") & bit and not _mask(pid, "SigBlk") & bit):
        assert time.monotonic() < deadline, "the child never took SIGTERM over"
        time.sleep(0.05)


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_child_leaves_sigterm_to_its_living_supervisor() -> None:
    children = Children(3, logging.getLogger("test"))
    child = children.start("sleeper", time.sleep, (30,), "sleeper")
    try:
        assert child.pid is not None
        assert _mask(child.pid, "SigBlk") & (1 << (signal.SIGINT - 1))  # SIGINT stays blocked
        _handles_sigterm(child.pid)
        os.kill(child.pid, signal.SIGTERM)
        time.sleep(0.5)
        assert child.is_alive()
        assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the supervisor's own is not
    finally:
        children.join(seconds=0.1, hurry=lambda: True)
    assert not child.is_alive()


_ORPHANED = """
import os, sys, time
from bertserve.server.serving.process.children import Children
import logging
child = Children(3, logging.getLogger("test")).start("sleeper", time.sleep, (60,), "sleeper")
print(child.pid, flush=True)
sys.stdin.readline()
os._exit(0)  # gone, and the child left behind
"""


def test_an_orphan_stops_on_sigterm() -> None:
    supervisor = subprocess.Popen(
        [sys.executable, "-c", _ORPHANED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert supervisor.stdout is not None and supervisor.stdin is not None
    pid = int(supervisor.stdout.readline())
    try:
        _handles_sigterm(pid)
        supervisor.stdin.write("\n")
        supervisor.stdin.flush()
        supervisor.wait(10)
        os.kill(pid, signal.SIGTERM)
        assert _gone(pid, 10)
    finally:
        if not _gone(pid, 0):
            os.kill(pid, signal.SIGKILL)
