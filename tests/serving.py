"""Start real bertserve server processes on free ports, through the real command line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil

START_TIMEOUT = 180.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class RunningServer:
    process: subprocess.Popen
    port: int
    port_out: int
    output: list[str] = field(default_factory=list)
    ready_line: str | None = None

    @property
    def client_kwargs(self) -> dict[str, int]:
        return {"port": self.port, "port_out": self.port_out}

    def family(self) -> list[psutil.Process]:
        """The server process and every process it started."""
        try:
            parent = psutil.Process(self.process.pid)
            return [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = 60.0) -> None:
        family = self.family()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                for proc in family:
                    proc.kill()
                self.process.wait(10)
                raise AssertionError("the server did not stop on SIGTERM") from None
        _gone, alive = psutil.wait_procs(family, timeout=15)
        for proc in alive:
            proc.kill()
        assert not alive, f"processes left behind: {alive}"


def _pump(stream, server: RunningServer, ready: threading.Event) -> None:
    for line in stream:
        server.output.append(line)
        sys.stderr.write(line)
        if " ready: " in line and line.startswith("bertserve"):
            server.ready_line = line
            ready.set()
    ready.set()


def start_server(*args: str, env: dict[str, str] | None = None, expect_ready: bool = True) -> RunningServer:
    port, port_out = free_port(), free_port()
    command = [sys.executable, "-m", "bertserve.server.cli", "start", "--port", str(port), "--port-out", str(port_out)]
    process = subprocess.Popen(
        [*command, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,  # its own process group, as a terminal would give it (for Ctrl-C)
    )
    server = RunningServer(process, port, port_out)
    ready = threading.Event()
    threading.Thread(target=_pump, args=(process.stdout, server, ready), daemon=True).start()
    if expect_ready:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready.wait(0.2):
            if time.monotonic() > deadline:
                server.stop()
                raise AssertionError("the server did not become ready:\n" + "".join(server.output))
        if server.ready_line is None or process.poll() is not None:
            server.stop()
            raise AssertionError("the server exited before it was ready:\n" + "".join(server.output))
    return server
