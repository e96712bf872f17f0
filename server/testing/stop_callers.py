"""Callers of a server that is being stopped, and what each was told; for the tests of the stop
budget and ``benchmarks/stopping.py`` alike.

Each caller sends one request of ``n`` texts, over HTTP (``httpx``, ``POST /v1/embeddings``)
or over ZeroMQ (``BertClient``), and records its outcome: ``200``, ``503 shutdown`` (an HTTP
503 of code ``shutdown``, or a ``ServerError`` of kind ``shutdown``), or what went wrong (a
connection closed without a response, a timeout)::

    answers: list[Answer] = []
    threads = start_callers(server, http_port, 400, answers)   # two over HTTP, two over ZeroMQ
    took, code, output = stop_and_wait(server, lambda: server.process.send_signal(SIGTERM), 8.0)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import psutil
from bertserve.client import BertClient, ServerError

from .launcher import RunningServer

CALLER_TIMEOUT_S = 60.0  # far past any stop budget: a caller left waiting shows as a timeout


@dataclass
class Answer:
    caller: str
    outcome: str  # "200", "503 shutdown", or what went wrong
    connection: str | None = None  # HTTP's Connection header
    at: float = 0.0  # time.monotonic() when it came


def texts(caller: str, n: int, words: int = 6) -> list[str]:
    """``n`` distinct texts of about ``words`` words."""
    filler = " ".join(f"word{k % 50}" for k in range(max(0, words - 5)))
    return [f"{caller} asks for text {i} {filler}".strip() for i in range(n)]


def http_caller(http_port: int, name: str, n: int, answers: list[Answer], words: int = 6) -> None:
    try:
        reply = httpx.post(
            f"http://127.0.0.1:{http_port}/v1/embeddings",
            json={"input": texts(name, n, words), "truncate": True},
            timeout=CALLER_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        answers.append(Answer(name, f"{type(exc).__name__}: {exc}", at=time.monotonic()))
        return
    outcome = str(reply.status_code)
    if reply.status_code != 200:
        outcome += " " + str(reply.json()["error"]["code"])
    elif len(reply.json()["data"]) != n:
        outcome = f"200 with {len(reply.json()['data'])} of {n} vectors"
    answers.append(Answer(name, outcome, reply.headers.get("connection"), time.monotonic()))


def zmq_caller(server: RunningServer, name: str, n: int, answers: list[Answer], words: int = 6) -> None:
    try:
        with BertClient(**server.client_kwargs, timeout=int(CALLER_TIMEOUT_S * 1000)) as client:
            vectors = client.encode(texts(name, n, words))
    except ServerError as exc:
        answers.append(Answer(name, f"503 {exc.kind}", at=time.monotonic()))
        return
    except Exception as exc:  # a timeout, a connection problem: what a stop must never cause
        answers.append(Answer(name, f"{type(exc).__name__}: {exc}", at=time.monotonic()))
        return
    answers.append(Answer(name, "200" if vectors.shape[0] == n else f"{vectors.shape}", at=time.monotonic()))


def start_callers(
    server: RunningServer, http_port: int, n: int, answers: list[Answer], words: int = 6
) -> list[threading.Thread]:
    """Two callers over HTTP and two over ZeroMQ, each with one request of ``n`` texts."""
    threads = [
        *(threading.Thread(target=http_caller, args=(http_port, f"http{i}", n, answers, words)) for i in range(2)),
        *(threading.Thread(target=zmq_caller, args=(server, f"zmq{i}", n, answers, words)) for i in range(2)),
    ]
    for thread in threads:
        thread.start()
    return threads


def wait_in_flight(server: RunningServer, count: int, timeout: float = 30.0) -> None:
    """Wait until ``count`` requests are in the head's book and a worker runs a job."""
    deadline = time.monotonic() + timeout
    with BertClient(**server.client_kwargs, timeout=10_000) as watcher:
        while time.monotonic() < deadline:
            status = watcher.server_status
            if status["requests_pending"] >= count and any(w["jobs_in_flight"] for w in status["workers"]):
                return
            time.sleep(0.05)
    raise AssertionError(f"{count} requests were not in flight within {timeout:.0f} s")


def stop_and_wait(server: RunningServer, ask: Callable[[], None], budget: float) -> tuple[float, int, str]:
    """Ask the server to stop with ``ask``; how long it took (from the ask to its exit), its
    exit code and its output. Raises if it is still running ``budget`` + 30 s later, or left
    a process behind."""
    family = server.family()
    asked = time.monotonic()
    ask()
    code = server.process.wait(budget + 30)
    took = time.monotonic() - asked
    server._output_done.wait(10)
    _, alive = psutil.wait_procs(family, timeout=10)
    output = "".join(server.output)
    assert not alive, (alive, output)
    return took, code, output
