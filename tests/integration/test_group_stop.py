"""A signal to the server's whole process group stops it as cleanly as one to its main process.

``timeout 20 bertserve start ...``, systemd's default ``KillMode`` and Ctrl-C at a terminal
signal every process of the group at once: the head, the workers, the sink and the HTTP
process. The children leave their stop to the head, whose staged shutdown runs as it would
for a signal of its own: exit code 0, no error, no worker said to have died, no process left
behind, and a request in flight answered.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator

import numpy as np
import psutil
import pytest
from bertserve.client import BertClient
from bertserve.server.config.stopping import STOP_TIMEOUT_SECONDS
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from faulty_model import SLOW_WORD, pythonpath_env

pytestmark = pytest.mark.timeout(180)

FAULTY = "faulty_model:FaultyModel"  # HashingModel's vectors: a server that starts in a second
STOPS_WITHIN_S = STOP_TIMEOUT_SECONDS + 1  # the stop budget, and a second for the exit
_FAILURE = re.compile(r"\b(ERROR|CRITICAL|Traceback)\b|\b([Dd]ied|[Dd]ead)\b")  # a log level, or a death


@pytest.fixture
def server(tiny_google: str) -> Iterator[RunningServer]:
    """A server of the fast model with two workers and its HTTP front end, in a process group
    of its own (the launcher starts it in a new session)."""
    running = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        FAULTY,
        "--max-seq-len",
        "32",
        "--num-worker",
        "2",
        "--http-port",
        str(free_port()),
        env=pythonpath_env(),
    )
    yield running
    if running.process.poll() is None:  # a failed test: stop what is left
        running.stop()


def _signal_group(server: RunningServer, signum: int) -> tuple[int, str, list[psutil.Process]]:
    """Send ``signum`` to every process of the server's group at once; its exit code, its
    output, and the processes of its family still running once it exited."""
    family = server.family()
    assert len(family) >= 5, family  # the head, the sink, the HTTP process and two workers (and helpers)
    os.killpg(os.getpgid(server.process.pid), signum)
    started = time.monotonic()
    code = server.process.wait(STOPS_WITHIN_S + 10)
    took = time.monotonic() - started
    assert took < STOPS_WITHIN_S, f"stopped in {took:.1f} s"
    server._output_done.wait(10)
    _, alive = psutil.wait_procs(family, timeout=10)
    return code, "".join(server.output), alive


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_whole_group_stops_the_server_cleanly(server: RunningServer, signum: int) -> None:
    code, output, alive = _signal_group(server, signum)
    failures = [line for line in output.splitlines() if _FAILURE.search(line)]
    assert code == 0, output
    assert not failures, output
    assert "stopping: no requests in flight" in output, output
    assert re.search(r"bertserve stopped in \d+\.\d s$", output.rstrip()), output
    assert not alive, alive


def test_a_request_in_flight_is_answered_when_the_group_is_signalled(server: RunningServer) -> None:
    answer: list[np.ndarray] = []

    def ask() -> None:
        with BertClient(**server.client_kwargs, timeout=30_000) as client:
            answer.append(client.encode([f"{SLOW_WORD} takes a second"]))

    asking = threading.Thread(target=ask)
    asking.start()
    time.sleep(0.5)  # connected, and the job on a worker
    code, output, alive = _signal_group(server, signal.SIGTERM)
    asking.join(30)
    assert code == 0 and not alive, output
    assert len(answer) == 1 and answer[0].shape == (1, 16), output
    assert "stopping: 1 request in flight" in output, output
    assert not [line for line in output.splitlines() if _FAILURE.search(line)], output
