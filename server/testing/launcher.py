"""The one launcher of real bertserve servers, used by the tests and the benchmarks alike.

A server is started through the real command line (``python -m bertserve.server.cli start``)
on free loopback ports, in its own session (as a terminal gives it, so ``os.killpg`` is
Ctrl-C), and stopped with SIGTERM, its graceful stop::

    server = start_server("--model-dir", model_dir, "--num-worker", "2")   # waits for "ready"
    try:
        with BertClient(**server.client_kwargs) as client: ...
        server.family_rss_mib()            # RSS of the server and every process it started
    finally:
        server.stop()                      # raises if it ignored SIGTERM or left processes behind

``start_server(..., expect_ready=False)`` returns at once: start several, then
:meth:`RunningServer.wait_ready` each. Any ``bertserve start`` flag passes through as is.
Tests and benchmarks import it as ``bertserve.server.testing.launcher``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

START_TIMEOUT = 180.0
_ERROR_PREFIX = "bertserve: error:"  # how the command line says why it stops
STOP_TIMEOUT = 60.0
OUTPUT_LINES = 5000  # kept in memory; ``log_path`` keeps everything


class ServerStartError(RuntimeError):
    """The server exited, or did not print its ready line in time."""


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    return free_ports(1)[0]


_handed_out: set[int] = set()


def free_ports(count: int) -> list[int]:
    """``count`` different TCP ports that are free on 127.0.0.1 right now.

    The kernel may hand out a port again as soon as its probe is closed, so each probe stays
    bound until all are chosen, and no port is handed out twice in one test process: a port
    chosen for one role and not bound yet is never chosen again for another. Under
    pytest-xdist each worker process takes its ports from a range of its own, below the
    kernel's ephemeral ports (:func:`_own_range`): two test processes never choose the same
    port, and no connection's source port takes one between its choice and its bind.
    """
    own = _own_range()
    with contextlib.ExitStack() as stack:
        chosen: list[int] = []
        for port in _candidates(own, count + 200):  # bounded: each probe holds a descriptor
            probe = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:  # in use
                continue
            port = int(probe.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                chosen.append(port)
                if len(chosen) == count:
                    return chosen
    raise RuntimeError(f"found no {count} free ports not handed out before")


_RANGE_BASE, _RANGE_SIZE = 10_000, 3_000  # gw0: 10000-12999, gw1: 13000-15999, ... below 32768
_next_in_range = 0


def _own_range() -> range | None:
    """This pytest-xdist worker's ports (``gwN``), or None outside xdist (the kernel chooses)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    start = _RANGE_BASE + (int(worker[2:]) % 7) * _RANGE_SIZE
    return range(start, start + _RANGE_SIZE)


def _candidates(own: range | None, tries: int) -> Iterator[int]:
    """Ports to probe: the kernel's choice (port 0) outside xdist, else the next ones of this
    worker's range that it has not handed out, round the range again once all have been."""
    global _next_in_range
    if own is None:
        yield from [0] * tries
        return
    if all(port in _handed_out for port in own):
        _handed_out.difference_update(own)  # long since bound, used and let go by their servers
    for _ in range(min(tries, len(own))):
        for step in range(len(own)):
            port = own[(_next_in_range + step) % len(own)]
            if port not in _handed_out:
                _next_in_range = (own.index(port) + 1) % len(own)
                break
        else:
            return
        yield port


def free_port_pair() -> int:
    """A port P on 127.0.0.1 such that P and P + 1 are both free right now."""
    for _ in range(100):
        port = free_port()
        if port < 65535 and port + 1 not in _handed_out:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            _handed_out.add(port + 1)
            return port
    raise RuntimeError("found no two adjacent free ports")


def _is_ready_line(line: str) -> bool:
    return line.startswith("bertserve") and " ready: " in line


@dataclass
class RunningServer:
    """One ``bertserve start`` process and what it printed (the last ``OUTPUT_LINES`` lines)."""

    process: subprocess.Popen[str]
    port: int
    port_out: int
    output: deque[str] = field(default_factory=lambda: deque(maxlen=OUTPUT_LINES))
    ready_line: str | None = None
    ready_seconds: float = float("nan")  # from launch to the ready line
    ready: threading.Event = field(default_factory=threading.Event)  # set on the ready line
    launched_at: float = field(default_factory=time.perf_counter)
    is_ready_line: Callable[[str], bool] = field(default=lambda line: _is_ready_line(line))
    start_error: str | None = None  # the "bertserve: error: ..." line it printed before its ready line
    _output_done: threading.Event = field(default_factory=threading.Event)
    _family_at_stop: list[psutil.Process] = field(default_factory=list)

    @property
    def client_kwargs(self) -> dict[str, int]:
        return {"port": self.port, "port_out": self.port_out}

    def family(self) -> list[psutil.Process]:
        """The server process and every process it started."""
        try:
            parent = psutil.Process(self.process.pid)
            return [parent, *parent.children(recursive=True)]
        except psutil.Error:
            return []

    def family_rss_mib(self, leave_out: Collection[int] = ()) -> float:
        """Summed resident memory of :meth:`family` but the pids ``leave_out`` (the workers,
        say, to measure the head alone), in MiB (0 once the server is gone)."""
        total = 0
        for process in self.family():
            if process.pid in leave_out:
                continue
            try:
                total += process.memory_info().rss
            except psutil.Error:  # exited between listing and reading
                continue
        return total / 2**20

    def tail(self, lines: int = 30) -> str:
        return "".join(list(self.output)[-lines:])

    def wait_ready(self, timeout: float = START_TIMEOUT) -> float:
        """Seconds from launch to the ready line; raises :class:`ServerStartError` if the
        server exits first or the line does not come within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.2):
            if self.start_error is not None:  # a server that said why it cannot start need not be waited for
                raise ServerStartError(f"the server could not start:\n{self.tail(200)}")
            exited = self.process.poll() is not None
            if exited or time.monotonic() > deadline:
                self._output_done.wait(5)
                why = f"exited with {self.process.returncode}" if exited else f"was not ready in {timeout:.0f} s"
                raise ServerStartError(f"the server {why}:\n{self.tail(200)}")
        return self.ready_seconds

    def terminate(self) -> None:
        """Send SIGTERM (the graceful stop) and note the family; :meth:`wait_stopped` waits."""
        self._family_at_stop = self.family()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float = STOP_TIMEOUT) -> list[str]:
        """Wait for the server and its children; kill whatever is left after ``timeout``.
        Returns what went wrong (empty if the stop was clean)."""
        problems: list[str] = []
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            problems.append(f"the server ignored SIGTERM for {timeout:.0f} s")
        _gone, alive = psutil.wait_procs(self._family_at_stop, timeout=15)
        for process in alive:
            try:
                process.kill()
            except psutil.Error:
                continue
        if alive:
            problems.append(f"processes left behind: {alive}")
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._output_done.wait(10)
        return problems

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM and wait; raises AssertionError if the stop was not clean (after cleaning up)."""
        self.terminate()
        problems = self.wait_stopped(timeout)
        assert not problems, "; ".join(problems)


def _pump(stream: IO[str], server: RunningServer, echo: bool, log_path: Path | None) -> None:
    log = log_path.open("w", encoding="utf-8") if log_path is not None else None
    try:
        for line in stream:
            server.output.append(line)
            if echo:
                sys.stderr.write(line)
            if log is not None:
                log.write(line)
            if not server.ready.is_set() and server.is_ready_line(line):
                server.ready_seconds = time.perf_counter() - server.launched_at
                server.ready_line = line
                server.ready.set()
            elif not server.ready.is_set() and line.startswith(_ERROR_PREFIX):
                server.start_error = line.strip()
    finally:
        if log is not None:
            log.close()
        server._output_done.set()


def start_server(
    *args: str,
    env: dict[str, str] | None = None,
    expect_ready: bool = True,
    timeout: float = START_TIMEOUT,
    echo: bool = True,
    log_path: Path | None = None,
    pass_port_out: bool = True,
    python: str = sys.executable,
) -> RunningServer:
    """Start ``bertserve start --port P --port-out Q *args`` on two free ports.

    ``args`` are any further ``bertserve start`` flags. Without ``pass_port_out`` the command
    is ``bertserve start --port P *args``, P chosen so that P + 1, the default, is free too.
    ``env`` is added to this process's environment. With ``expect_ready`` wait for the ready
    line (stopping the server and raising :class:`ServerStartError` if it never comes); else
    return at once. The output goes to stderr when ``echo`` (pytest captures it) and to
    ``log_path`` if given. ``python`` runs it: another environment's, for a baseline of other code.
    """
    if pass_port_out:
        port, port_out = free_ports(2)
        ports = ["--port", str(port), "--port-out", str(port_out)]
    else:
        port = free_port_pair()
        port_out, ports = port + 1, ["--port", str(port)]
    command = [python, "-m", "bertserve.server.cli", "start", *ports, *args]
    server = _launch(command, port, port_out, env, echo, log_path, _is_ready_line)
    if expect_ready:
        _wait_or_stop(server, timeout)
    return server


def _launch(
    command: list[str],
    port: int,
    port_out: int,
    env: dict[str, str] | None,
    echo: bool,
    log_path: Path | None,
    is_ready_line: Callable[[str], bool],
) -> RunningServer:
    launched_at = time.perf_counter()
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env={**os.environ, "NO_COLOR": "1", **(env or {})},  # its output is parsed: plain even with FORCE_COLOR
        start_new_session=True,  # its own process group, as a terminal would give it (for Ctrl-C)
    )
    server = RunningServer(process, port, port_out, launched_at=launched_at, is_ready_line=is_ready_line)
    assert process.stdout is not None
    pump = threading.Thread(target=_pump, args=(process.stdout, server, echo, log_path), daemon=True)
    pump.start()
    return server


def start_head(*args: str, attempts: int = 3, **options: Any) -> tuple[RunningServer, int]:
    """:func:`start_server` with ``--worker-port`` on a free port, and that port: a port free
    when chosen may be taken before the head binds it, and then another is tried."""
    for attempt in range(attempts):
        worker_port = free_port()
        try:
            return start_server(*args, "--worker-port", str(worker_port), **options), worker_port
        except ServerStartError as exc:
            if "the port is in use" not in str(exc) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _wait_or_stop(server: RunningServer, timeout: float) -> None:
    try:
        server.wait_ready(timeout)
    except ServerStartError:
        server.terminate()
        server.wait_stopped()
        raise


def _is_joined_line(line: str) -> bool:
    return "bertserve.host" in line and "joined the head" in line


def start_worker_host(
    worker_port: int,
    *args: str,
    env: dict[str, str] | None = None,
    expect_joined: bool = True,
    timeout: float = START_TIMEOUT,
    echo: bool = True,
) -> RunningServer:
    """Start ``bertserve worker --server 127.0.0.1 --worker-port P *args`` in its own session.

    "Ready" is its log line saying it joined the head (workers start after it); ``port`` and
    ``port_out`` of the result are 0. Stop it like a server: :meth:`RunningServer.stop`.
    """
    command = [
        sys.executable,
        "-m",
        "bertserve.server.cli",
        "worker",
        "--server",
        "127.0.0.1",
        "--worker-port",
        str(worker_port),
        *args,
    ]
    host = _launch(command, 0, 0, env, echo, None, _is_joined_line)
    if expect_joined:
        _wait_or_stop(host, timeout)
    return host


def metric_total(values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (``values`` as
    ``(name, sorted labels) -> value``): a test asks by the labels it cares about, whatever
    others (the model's) a series has."""
    return sum(value for (found, have), value in values.items() if found == name and set(labels.items()) <= set(have))
