"""What callers get when a serving container is stopped: the stop check of docker/try_image.py.

Each row starts a fresh one-container server (``bertserve start``, one local worker), gives it
its callers, waits half a second so that their texts are being encoded, then runs ``podman
stop`` with podman's default grace (10 s: SIGTERM, then SIGKILL). It records how long ``podman
stop`` took, the container's exit code, what each caller got, and the server's log from the
signal on:

(a) no request in flight;
(b) 4 concurrent ``/v1/embeddings`` requests of 40 texts each, which fit in the drain;
(c) 4 of 400 texts each, which take longer than the stop budget (8 s by default);
(d) 4 ZeroMQ clients (``bertserve.client.BertClient`` of the host) encoding 400 texts each.

Every text has about 100 words (about 130 tokens, under the model's 256), so a batch takes
seconds on a few cores. The module takes what it needs from try_image.py as arguments.
"""

from __future__ import annotations

import collections
import json
import random
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

NAME = "bertserve-try-stop"
IN_FLIGHT_S = 0.5  # from the last caller's send to `podman stop`
CALLER_TIMEOUT_S = 60.0  # a caller's own bound: HTTP's socket timeout, the ZeroMQ client's timeout
LOG_LINES = 8  # of the server's log, from the line that says it is stopping

# Plain words that the model's WordPiece keeps whole, so a text of N words is about N tokens.
_VOCABULARY = """
the a server worker request reply model batch text vector stop signal time second queue head
network client answer container process memory core thread graph token word sentence long short
fast slow new old first last every each some many few more less near far open close start end
read write send take give make keep find show tell ask run wait work move turn hold bring leave
city river mountain garden window table paper letter story music light water street market school
"""
_WORDS = _VOCABULARY.split()


def texts(count: int, *, words: int = 100, seed: int = 0) -> list[str]:
    """``count`` texts of ``words`` words each, the same on every run."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "." for _ in range(count)]


@dataclass(frozen=True)
class Scenario:
    label: str
    callers: int = 0
    texts: int = 0
    via: str = ""  # "http" or "zeromq"


SCENARIOS = (
    Scenario("(a) nothing in flight"),
    Scenario("(b) 4 HTTP requests of 40 texts", 4, 40, "http"),
    Scenario("(c) 4 HTTP requests of 400 texts", 4, 400, "http"),
    Scenario("(d) 4 ZeroMQ clients, 400 texts each", 4, 400, "zeromq"),
)


@dataclass
class StopRow:
    scenario: Scenario
    stop_s: float = 0.0
    exit_code: str = ""
    outcomes: list[str] = field(default_factory=list)  # one per caller, in the order they ended
    log: list[str] = field(default_factory=list)


class Served(Protocol):
    """Where the container's server listens on the host (try_image.Single)."""

    http: int
    requests: int
    replies: int


class PodmanLike(Protocol):
    """try_image.Podman: podman with this machine's runtime options."""

    def argv(self, *args: str) -> list[str]: ...

    def run(self, *args: str, check: bool = True, record: bool = False, timeout: float = 600) -> str: ...


# -- the callers ---------------------------------------------------------------------------


def http_caller(port: int, batch: Sequence[str]) -> str:
    """One ``/v1/embeddings`` request: ``200 (N vectors)``, ``STATUS CODE`` for an error reply
    (``503 shutdown``), or the connection error's text."""
    body = json.dumps({"input": list(batch), "model": "all-MiniLM-L6-v2", "truncate": True}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/embeddings", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=CALLER_TIMEOUT_S) as reply:
            return f"{reply.status} ({len(json.loads(reply.read())['data'])} vectors)"
    except urllib.error.HTTPError as exc:
        try:
            code = json.loads(exc.read())["error"]["code"]
        except (ValueError, KeyError, TypeError, OSError):
            code = exc.reason
        return f"{exc.code} {code}"
    except (OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return f"connection error: {type(reason).__name__}: {reason}"


def zeromq_caller(served: Served, batch: Sequence[str], sending: threading.Event) -> str:
    """One ``BertClient.encode``: ``vectors (N, D)`` or the exception's type and text."""
    from bertserve.client import BertClient

    try:
        with BertClient("127.0.0.1", served.requests, served.replies, timeout=CALLER_TIMEOUT_S * 1000) as client:
            sending.set()
            vectors = client.encode(list(batch))
        return f"vectors {tuple(vectors.shape)}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        sending.set()


def _callers(scenario: Scenario, served: Served, batch: list[str]) -> tuple[list[threading.Thread], list[str]]:
    """The scenario's callers, started, and the list their outcomes go to; returns once every
    one has sent its request (the ZeroMQ clients after their handshake)."""
    outcomes: list[str] = []
    events = [threading.Event() for _ in range(scenario.callers)]

    def call(sending: threading.Event) -> None:
        if scenario.via == "http":
            sending.set()
            outcomes.append(http_caller(served.http, batch))
        else:
            outcomes.append(zeromq_caller(served, batch, sending))

    threads = [threading.Thread(target=call, args=(event,), daemon=True) for event in events]
    for thread in threads:
        thread.start()
    for event in events:
        event.wait(CALLER_TIMEOUT_S)
    return threads, outcomes


# -- the check -----------------------------------------------------------------------------


def stop_row(
    podman: PodmanLike, start: Callable[[str], Served], scenario: Scenario, log: Callable[[str], None]
) -> StopRow:
    row = StopRow(scenario)
    served = start(NAME)
    try:
        threads, outcomes = _callers(scenario, served, texts(scenario.texts))
        time.sleep(IN_FLIGHT_S if threads else 0)
        started = time.perf_counter()
        podman.run("stop", NAME)
        row.stop_s = time.perf_counter() - started
        for thread in threads:
            thread.join(CALLER_TIMEOUT_S + 10)
        row.outcomes = outcomes + ["still waiting"] * (len(threads) - len(outcomes))
        row.exit_code = podman.run("inspect", "--format", "{{.State.ExitCode}}", NAME)
        logs = subprocess.run(podman.argv("logs", NAME), capture_output=True, text=True, timeout=60, check=False)
        lines = (logs.stdout + logs.stderr).splitlines()  # the server logs to stderr
        stopping = next((i for i, line in enumerate(lines) if "stopping" in line.lower()), max(0, len(lines) - 3))
        row.log = [line[:200] for line in lines[stopping : stopping + LOG_LINES]]
    finally:
        podman.run("rm", "-f", NAME, check=False)
    log(f"stop {scenario.label}: podman stop took {row.stop_s:.1f} s, exit code {row.exit_code}; {row.outcomes}")
    return row


def check_stop(podman: PodmanLike, start: Callable[[str], Served], log: Callable[[str], None]) -> list[StopRow]:
    """Every scenario, each on a fresh container started by ``start(name)`` (ready when it returns)."""
    return [stop_row(podman, start, scenario, log) for scenario in SCENARIOS]


def _outcomes(outcomes: Sequence[str]) -> str:
    if not outcomes:
        return "-"
    counted = collections.Counter(outcomes)
    return "; ".join(f"{count} × {outcome}" if count > 1 else outcome for outcome, count in counted.items())


def commands(podman: PodmanLike, run: list[str]) -> list[str]:
    """A row's podman commands, as the report shows them; ``run`` is the ``podman run`` argv."""
    return [
        shlex.join(run),
        "# ... the callers, then:",
        shlex.join(podman.argv("stop", NAME)),
        shlex.join(podman.argv("inspect", "--format", "{{.State.ExitCode}}", NAME)),
        shlex.join(podman.argv("logs", NAME)),
        shlex.join(podman.argv("rm", "-f", NAME)),
    ]


def stop_report(rows: Sequence[StopRow], row_commands: Sequence[str]) -> list[str]:
    """The report's section: the table, how it was measured, and the server's log per row."""
    lines = [
        "## Stopping the one container",
        "",
        "Measured on the image above, built from the commit its table names.",
        "",
        "| in flight when `podman stop` ran | `podman stop` took | exit code | what each caller got |",
        "| --- | --- | --- | --- |",
    ]
    lines += [
        f"| {row.scenario.label} | {row.stop_s:.1f} s | {row.exit_code} | {_outcomes(row.outcomes).replace('|', '/')} |"
        for row in rows
    ]
    lines += [
        "",
        "Each row starts a fresh container (`bertserve start`, one local worker, its HTTP, request and reply",
        "ports published on free loopback ports), starts its callers, waits "
        f"{IN_FLIGHT_S:g} s once each has sent its request, then",
        "runs `podman stop` with podman's default grace: SIGTERM, and SIGKILL 10 s later (exit code 137).",
        "Each text has about 100 words (about 130 tokens). An HTTP caller sends",
        '`{"input": [...], "model": "all-MiniLM-L6-v2", "truncate": true}` to `/v1/embeddings` and gets a',
        "status and the error's `code`, or a connection error; a ZeroMQ caller is the host's",
        '`BertClient("127.0.0.1", REQUESTS, REPLIES, timeout=60000)` calling `encode`, and gets the',
        "vectors' shape or the exception. Per row:",
        "",
        "```bash",
        *row_commands,
        "```",
    ]
    for row in rows:
        lines += ["", f"{row.scenario.label}, the server's log from the stop on:", "", "```text", *row.log, "```"]
    return lines
