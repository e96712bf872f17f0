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

import grpc
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


def test_grpc_calls_in_flight_at_sigterm_are_answered_or_told_the_server_stops(tiny_google: str) -> None:
    """The gRPC process stops with the group within the budget: a stream in flight gets its
    answers or UNAVAILABLE, health turns NOT_SERVING, nothing hangs, nothing dies."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from tei_stubs import tei_stubs

    pb, services = tei_stubs()
    grpc_port = free_port()
    running = start_server(
        *("--model-dir", tiny_google, "--model-class", "faulty_model:PacedModel", "--max-seq-len", "32"),
        *("--grpc-port", str(grpc_port)),
        env=pythonpath_env(),
    )
    outcome: dict[str, object] = {}

    def stream() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            answers = services.EmbedStub(channel).EmbedStream(
                iter(pb.EmbedRequest(inputs=f"sentence {i}") for i in range(4000)), timeout=60
            )
            count = 0
            try:
                for _ in answers:
                    count += 1
                outcome["answered"] = count
            except grpc.RpcError as exc:
                outcome["answered"], outcome["code"], outcome["details"] = count, exc.code(), exc.details()

    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        asking = threading.Thread(target=stream)
        asking.start()
        time.sleep(1.0)  # the stream's first groups are on the workers
        code, output, alive = _signal_group(running, signal.SIGTERM)
        asking.join(30)
    assert not asking.is_alive() and code == 0 and not alive, output
    assert outcome.get("code") in (None, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), outcome
    assert outcome.get("answered", 0) > 0, outcome
    assert not [line for line in output.splitlines() if _FAILURE.search(line)], output
