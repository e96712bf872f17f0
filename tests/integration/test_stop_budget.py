"""The stop fits its budget (``--stop-timeout``, 8 s by default: inside Docker's default grace
of 10 s), whatever is in flight and however the stop is asked for, and every caller is told.

Each row of the table that docker/README.md gives runs against a real server of
:class:`faulty_model.CostlyModel`, whose model runs cost what a real model's do on a CPU (a
batch of 256 takes 2.6 s), with one worker as a container runs it. Four callers each send a
request of N texts, two over HTTP (httpx) and two over ZeroMQ (``BertClient``); then the
server is stopped. Each row checks that it exits 0 within the budget, logs no ERROR, leaves
no process behind, and that every caller got its vectors or a ``shutdown`` error (HTTP: 503
with ``Connection: close``); none saw a connection closed, and none waited for a timeout.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from bertserve.client import BertClient, ServerError
from bertserve.server.config.stopping import STOP_TIMEOUT_SECONDS
from bertserve.server.testing.launcher import RunningServer, free_port, start_head, start_server, start_worker_host
from bertserve.server.testing.stop_callers import (
    CALLER_TIMEOUT_S,
    Answer,
    http_caller,
    start_callers,
    stop_and_wait,
    wait_in_flight,
    zmq_caller,
)
from faulty_model import HANG_WORD, pythonpath_env, wait_for

pytestmark = pytest.mark.timeout(240)

COSTLY = "faulty_model:CostlyModel"
EXIT_S = 1.0  # after the budget: the interpreter's exit, and this machine's noise
_FAILURE = re.compile(r"\b(ERROR|CRITICAL|Traceback)\b|\b([Dd]ied|[Dd]ead)\b|did not stop in time")


def _model(tiny_google: str) -> tuple[str, ...]:
    return ("--model-dir", tiny_google, "--model-class", COSTLY, "--max-seq-len", "32")


@contextlib.contextmanager
def _serving(tiny_google: str, *flags: str) -> Iterator[tuple[RunningServer, int]]:
    """A server of :class:`faulty_model.CostlyModel` with HTTP, and its HTTP port; stopped
    after a test that failed before it could."""
    http_port = free_port()
    server = start_server(*_model(tiny_google), "--http-port", str(http_port), *flags, env=pythonpath_env())
    try:
        yield server, http_port
    finally:
        if server.process.poll() is None:
            server.stop()


def _stopped(server: RunningServer, ask: Callable[[], None], budget: float) -> tuple[float, int, str]:
    took, code, output = stop_and_wait(server, ask, budget)
    assert took < budget + EXIT_S, f"stopped in {took:.1f} s, over its {budget} s budget\n{output}"
    return took, code, output


def _stopped_cleanly(
    server: RunningServer, ask: Callable[[], None], budget: float, threads: list[threading.Thread]
) -> tuple[float, str, float]:
    """:func:`_stopped`, and its callers done: exit code 0, no ERROR; how long it took, its
    output, and when it was gone."""
    took, code, output = _stopped(server, ask, budget)
    stopped_at = time.monotonic()
    for thread in threads:
        thread.join(CALLER_TIMEOUT_S)
    assert code == 0, output
    assert not [line for line in output.splitlines() if _FAILURE.search(line)], output
    return took, output, stopped_at


def _sigterm(server: RunningServer) -> Callable[[], None]:
    return lambda: server.process.send_signal(signal.SIGTERM)


def _told(answers: list[Answer], callers: int, *, stopped_at: float, allowed: set[str]) -> None:
    """Every caller got an answer in ``allowed``, before the server was gone; an HTTP
    ``shutdown`` came with ``Connection: close``."""
    assert len(answers) == callers, answers
    for answer in answers:
        assert answer.outcome in allowed, answers
        assert answer.at <= stopped_at, answers
        if answer.caller.startswith("http") and answer.outcome == "503 shutdown":
            assert answer.connection == "close", answers


@pytest.mark.parametrize(
    ("texts", "allowed"),
    [(0, set()), (40, {"200"}), (400, {"200", "503 shutdown"})],
    ids=["nothing-in-flight", "4x40-texts", "4x400-texts"],
)
def test_a_sigterm_stops_within_the_default_budget_and_every_caller_is_told(
    tiny_google: str, texts: int, allowed: set[str]
) -> None:
    with _serving(tiny_google) as (server, http_port):
        answers: list[Answer] = []
        threads = start_callers(server, http_port, texts, answers) if texts else []
        if texts:
            wait_in_flight(server, 4)
        late = Late()
        ask = _sigterm(server) if texts < 400 else lambda: _ask_during_the_drain(server, http_port, late)
        _, _, stopped_at = _stopped_cleanly(server, ask, STOP_TIMEOUT_SECONDS, threads)
    _told(answers, 4 if texts else 0, stopped_at=stopped_at, allowed=allowed)
    if texts == 400:  # 16 s of model runs: the drain ends, and what is left fails
        assert any(answer.outcome == "503 shutdown" for answer in answers), answers
        # Asked during the drain, a new request is refused at once, and /ready says the server is going.
        assert [answer.outcome for answer in late.answers] == ["503 shutdown", "503 shutdown"], late
        assert late.answers[0].connection == "close", late
        assert late.ready == (503, "shutdown", "close") and late.embed == (503, "shutdown", "close"), late
        assert late.seconds < 3, late  # at once, not at the drain's end (6 s)


@dataclass
class Late:
    """What a caller that came during the drain got: the answers, /ready's and TEI /embed's
    (status, error code, Connection header), and how long it all took."""

    answers: list[Answer] = field(default_factory=list)
    ready: tuple[int, str, str | None] = (0, "", None)
    embed: tuple[int, str, str | None] = (0, "", None)
    seconds: float = float("inf")


def _ask_during_the_drain(server: RunningServer, http_port: int, late: Late) -> None:
    """SIGTERM; then, once the server drains, new requests over HTTP and ZeroMQ, and /ready."""
    server.process.send_signal(signal.SIGTERM)
    wait_for(lambda: "stopping: 4 requests in flight" in "".join(server.output), 5, "the drain")
    asked = time.monotonic()
    http_caller(http_port, "http-late", 3, late.answers)
    zmq_caller(server, "zmq-late", 3, late.answers)
    with httpx.Client(timeout=10) as http:
        ready = http.get(f"http://127.0.0.1:{http_port}/ready")
        embedded = http.post(f"http://127.0.0.1:{http_port}/embed", json={"inputs": "late"})
    late.seconds = time.monotonic() - asked
    late.ready = (ready.status_code, ready.json()["error"]["code"], ready.headers.get("connection"))
    late.embed = (embedded.status_code, embedded.json()["error_type"], embedded.headers.get("connection"))


@pytest.mark.parametrize("how", ["sigterm-to-the-group", "sigint-twice"])
def test_a_group_sigterm_and_a_double_ctrl_c_stop_cleanly_with_work_in_flight(tiny_google: str, how: str) -> None:
    with _serving(tiny_google) as (server, http_port):
        answers: list[Answer] = []
        threads = start_callers(server, http_port, 400, answers)
        wait_in_flight(server, 4)
        group = os.getpgid(server.process.pid)

        def ask() -> None:
            if how == "sigterm-to-the-group":  # systemd's default KillMode, `timeout`
                os.killpg(group, signal.SIGTERM)
                return
            os.killpg(group, signal.SIGINT)  # Ctrl-C at a terminal, twice
            wait_for(lambda: "Ctrl-C again to stop now" in "".join(server.output), 5, "the first Ctrl-C's word")
            os.killpg(group, signal.SIGINT)

        took, output, stopped_at = _stopped_cleanly(server, ask, STOP_TIMEOUT_SECONDS, threads)
    _told(answers, 4, stopped_at=stopped_at, allowed={"200", "503 shutdown"})
    if how == "sigint-twice":
        assert took < 4, (took, output)  # at once: nothing waits for the model run


def test_a_short_budget_is_kept_with_a_model_run_in_progress(tiny_google: str) -> None:
    with _serving(tiny_google, "--stop-timeout", "2") as (server, http_port):
        answers: list[Answer] = []
        threads = start_callers(server, http_port, 400, answers)
        wait_in_flight(server, 4)
        _, output, stopped_at = _stopped_cleanly(server, _sigterm(server), 2.0, threads)
    assert "they get 1.0 s to finish" in output, output
    _told(answers, 4, stopped_at=stopped_at, allowed={"200", "503 shutdown"})
    assert sum(answer.outcome == "503 shutdown" for answer in answers) >= 3, answers


def test_a_worker_stuck_in_a_model_run_is_killed_at_its_share_of_the_budget(tiny_google: str) -> None:
    # 6 s: a tail of 1.5 s, so that on a loaded machine the sink and the front end, which
    # stop once the worker is killed, have time to (the kill itself is at the worker's share)
    with _serving(tiny_google, "--stop-timeout", "6") as (server, _):
        answers: list[Answer] = []
        stuck = threading.Thread(target=_stuck_caller, args=(server, answers))
        stuck.start()
        wait_in_flight(server, 1)
        _, output, _ = _stopped_cleanly(server, _sigterm(server), 6.0, [stuck])
    assert "bertserve-worker-0 was still running at its share of the stop budget; killing it" in output, output
    assert [answer.outcome for answer in answers] == ["503 shutdown"], answers


def _stuck_caller(server: RunningServer, answers: list[Answer]) -> None:
    """A request whose model run never ends (``HANGME``), as a wedged kernel's would not."""
    try:
        with BertClient(**server.client_kwargs, timeout=int(CALLER_TIMEOUT_S * 1000)) as client:
            client.encode([f"{HANG_WORD} forever"])
    except ServerError as exc:
        answers.append(Answer("zmq-stuck", f"503 {exc.kind}", at=time.monotonic()))
    except Exception as exc:
        answers.append(Answer("zmq-stuck", f"{type(exc).__name__}: {exc}", at=time.monotonic()))
    else:
        answers.append(Answer("zmq-stuck", "200", at=time.monotonic()))


@pytest.fixture
def head_and_host(tiny_google: str) -> Iterator[tuple[RunningServer, RunningServer]]:
    # The head's own stop is quick: with its one worker gone, nothing it holds can finish.
    head, worker_port = start_head(
        *_model(tiny_google), "--num-worker", "0", "--stop-timeout", "2", env=pythonpath_env()
    )
    host = None
    try:
        host = start_worker_host(
            worker_port,
            "--model-dir",
            tiny_google,
            "--model-class",
            COSTLY,
            "--stop-timeout",
            "3",
            env=pythonpath_env(),
        )
        yield head, host
    finally:
        for running in (host, head):
            if running is not None and running.process.poll() is None:
                running.stop()


def test_a_worker_host_stops_within_its_budget_and_its_jobs_go_back_to_the_head(
    head_and_host: tuple[RunningServer, RunningServer],
) -> None:
    head, host = head_and_host
    answers: list[Answer] = []
    stuck = threading.Thread(target=_stuck_caller, args=(head, answers))
    stuck.start()
    wait_in_flight(head, 1)
    _, output, _ = _stopped_cleanly(host, _sigterm(host), 3.0, [])
    assert "handing 1 unfinished job(s) back to the head" in output, output
    assert "still running at its share of the stop budget; killing it" in output, output
    # The head kept the request (its job was handed back): it fails, promptly, when the head stops.
    assert not answers, answers
    head.stop()
    stuck.join(CALLER_TIMEOUT_S)
    assert [answer.outcome for answer in answers] == ["503 shutdown"], answers
