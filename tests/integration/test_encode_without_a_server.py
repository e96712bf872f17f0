"""``bertserve encode`` without a server says so in its own flags, at once when the connection
is refused; at a terminal it says what it waits for, and through a pipe it gives the error alone.

Each test runs the command as a process of its own (its stderr on a pseudo-terminal where
that is the point); no bertserve server runs: the "servers" are a closed port, a plain TCP
listener that never answers, and the stand-in of late_server.py.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bertserve.server.testing.launcher import free_port

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_leaked_contexts")]

FAST_S = 2.0  # a refused connection on this machine is reported within this (the probe needs REFUSED_FOR_S)


def _encode_command(port: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "bertserve.server.cli", "encode", "--host", "127.0.0.1", "--port", str(port), *args]


def test_bertserve_encode_without_a_server_says_how_to_start_one_at_once(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "out.npy"
    started = time.monotonic()
    done = subprocess.run(
        _encode_command(port, "-o", str(out)), input="hello\n", capture_output=True, text=True, timeout=30
    )
    took = time.monotonic() - started
    assert done.returncode == 1 and not out.exists()
    assert done.stderr == (
        f"bertserve: error: no bertserve server at tcp://127.0.0.1:{port}: the connection was refused, so nothing "
        "listens there. Start one with `bertserve start`, or pass its --host and --port if it runs elsewhere\n"
    )
    assert took < FAST_S + 5  # the interpreter's start, then about a second; not the 60 s timeout


def _run_on_a_terminal(command: list[str], stdin: bytes, timeout_s: float = 30) -> tuple[int, str]:
    """Run ``command`` with its stderr on a pseudo-terminal; its exit code and what it wrote there."""
    leader, follower = pty.openpty()
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=follower) as proc:
        os.close(follower)
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        seen = b""
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if select.select([leader], [], [], 0.1)[0]:
                    try:
                        chunk = os.read(leader, 4096)
                    except OSError:  # EIO: every writer of the terminal has closed it
                        break
                    if not chunk:
                        break
                    seen += chunk
                elif proc.poll() is not None:
                    break
        finally:
            os.close(leader)
            if proc.poll() is None:
                proc.kill()
        return proc.wait(10), seen.decode("utf-8", "replace")


def test_bertserve_encode_at_a_terminal_says_what_it_waits_for(listener: int, tmp_path: Path) -> None:
    command = _encode_command(listener, "--timeout", "2500", "-o", str(tmp_path / "out.npy"))
    code, said = _run_on_a_terminal(command, b"hello\n")
    assert code == 1
    waiting = f"waiting for the server at tcp://127.0.0.1:{listener} ..."
    assert waiting in said
    error = said.index(f"no bertserve server answered at tcp://127.0.0.1:{listener}")
    assert said.index(waiting) < error
    assert "within 2500 ms. Start one with `bertserve start`, or pass its --host and --port" in said

    piped = subprocess.run(command, input="hello\n", capture_output=True, text=True, timeout=30)
    assert piped.returncode == 1 and "waiting for" not in piped.stderr  # a pipe gets the error alone
    assert piped.stderr.startswith(f"bertserve: error: no bertserve server answered at tcp://127.0.0.1:{listener}")


def test_bertserve_encode_at_a_terminal_says_nothing_of_waiting_for_a_prompt_server(
    late_server: Any, tmp_path: Path
) -> None:
    server = late_server(delay_s=0)
    out = tmp_path / "out.npy"
    command = _encode_command(server.port, "--port-out", str(server.port_out), "-o", str(out))
    code, said = _run_on_a_terminal(command, b"one\ntwo words\n")
    assert code == 0 and "waiting for" not in said and "wrote 2 vectors of dimension 4" in said
    np.testing.assert_array_equal(np.load(out)[:, 0], [1, 2])
