"""What ``bertserve`` says as it starts and stops, from the real command line: Ctrl-C typed
on a terminal (once to drain, twice to stop now), the ready line among the log lines, a port
in use, a model named as on the Hugging Face Hub, and a server command run where the
server's packages are not installed."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import psutil
import pytest
from bertserve.client import BertClient, ServerError
from bertserve.server.testing.launcher import free_ports
from faulty_model import pythonpath_env, wait_for

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
FAULTY = "faulty_model:FaultyModel"  # starts in seconds; a job holding HANGME never finishes
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# Make the pseudo-terminal on fd 0 the controlling terminal of this new session, then become the server.
_ON_TERMINAL = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable, '-m', 'bertserve.server.cli', *sys.argv[1:]])"
)


class TerminalServer:
    """``bertserve start`` in the foreground of a pseudo-terminal of its own, as a shell runs
    it: typing Ctrl-C there sends SIGINT to its whole process group, as a terminal does."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.port, self.port_out = free_ports(2)
        environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}
        self.master, terminal = os.openpty()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _ON_TERMINAL,
                "start",
                "--port",
                str(self.port),
                "--port-out",
                str(self.port_out),
                *args,
            ],
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            start_new_session=True,
            env={**environ, "TERM": "xterm-256color", **env},
        )
        os.close(terminal)
        self._output = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the last process holding the terminal closed it
                return
            if not chunk:
                return
            with self._lock:
                self._output += chunk

    @property
    def raw(self) -> str:
        """What the terminal showed, colour codes and all."""
        with self._lock:
            return self._output.decode("utf-8", "replace").replace("\r", "")

    @property
    def text(self) -> str:
        return _ANSI.sub("", self.raw)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.text:
            if self.process.poll() is not None or time.monotonic() > deadline:
                time.sleep(0.5)
                raise AssertionError(f"never saw {text!r}; the terminal showed:\n{self.text[-5000:]}")
            time.sleep(0.05)

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def family(self) -> list[psutil.Process]:
        parent = psutil.Process(self.process.pid)
        return [parent, *parent.children(recursive=True)]

    def close(self) -> None:
        with contextlib.suppress(psutil.Error):
            family = self.family()
            for process in family:
                process.kill()
            psutil.wait_procs(family, timeout=10)
        self.process.wait(10)
        self._reader.join(5)
        os.close(self.master)


def _faulty_server(tiny_google: str) -> TerminalServer:
    return TerminalServer("--model-dir", tiny_google, "--model-class", FAULTY, env=pythonpath_env())


def test_on_a_terminal_the_ready_line_stands_out_and_ctrl_c_stops_at_once(tiny_google: str) -> None:
    server = _faulty_server(tiny_google)
    try:
        server.wait_for(" ready: ", 120)
        lines = server.raw.splitlines()
        ready = next(line for line in lines if " ready: " in line)
        assert ready.startswith("\x1b[1m") and "\x1b[32m" in ready, repr(ready)  # bold, green
        assert _ANSI.sub("", ready).startswith("bertserve ")
        logged = [line for line in lines if " INFO " in line]
        assert logged and not any("\x1b[1m" in line for line in logged)  # the log's lines are plain green
        family = server.family()
        assert len(family) >= 3  # the server, its sink and its worker
        asked = time.monotonic()
        server.ctrl_c()
        assert server.process.wait(30) == 0
        assert time.monotonic() - asked < 5
        text = server.text
        assert "stopping: no requests in flight" in text and "bertserve stopped" in text, text
        for unwanted in ("did not stop in time", "Traceback", "KeyboardInterrupt"):
            assert unwanted not in text, text
        assert not psutil.wait_procs(family, timeout=10)[1]
    finally:
        server.close()


def test_a_second_ctrl_c_fails_what_is_in_flight_and_stops_within_two_seconds(tiny_google: str) -> None:
    server = _faulty_server(tiny_google)
    try:
        server.wait_for(" ready: ", 120)
        family = server.family()
        with BertClient(port=server.port, port_out=server.port_out, timeout=30_000) as client:
            client.encode(["HANGME until stopped"], blocking=False)
            with BertClient(port=server.port, port_out=server.port_out, timeout=10_000) as watcher:
                wait_for(lambda: watcher.server_status["requests_pending"] == 1, 10, "the request reaching the head")
                wait_for(  # on the worker, which never finishes it
                    lambda: any(w["jobs_in_flight"] for w in watcher.server_status["workers"]),
                    10,
                    "the job on the worker",
                )
            server.ctrl_c()
            server.wait_for("stopping: 1 request in flight; they get 6.0 s to finish; Ctrl-C again to stop now", 5)
            time.sleep(1.0)
            assert server.process.poll() is None  # draining: it waits for the request
            asked = time.monotonic()
            server.ctrl_c()
            with pytest.raises(ServerError, match="stop at once"):
                client.fetch_all()
            answered = time.monotonic() - asked
        assert server.process.wait(10) == 0
        stopped = time.monotonic() - asked
        assert answered < 2 and stopped < 2, (answered, stopped)
        text = server.text
        assert "stopping now: failing 1 request in flight" in text and "bertserve stopped" in text, text
        for unwanted in ("did not stop in time", "Traceback", "KeyboardInterrupt"):
            assert unwanted not in text, text
        assert not psutil.wait_procs(family, timeout=5)[1]
    finally:
        server.close()


def _cli(*args: str, cwd: Path | None = None, python: list[str] | None = None) -> subprocess.CompletedProcess:
    command = [*(python or [sys.executable, "-m", "bertserve.server.cli"]), *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, cwd=cwd, env={**os.environ, "NO_COLOR": "1"}
    )


def _errors(run: subprocess.CompletedProcess) -> list[str]:
    return [line for line in run.stderr.splitlines() if line.startswith("bertserve: error:")]


PORT_FLAGS = ["--port", "--port-out", "--http-port", "--metrics-port", "--worker-port"]


@pytest.mark.parametrize("flag", PORT_FLAGS)
def test_a_port_in_use_is_named_with_its_flag_before_anything_is_built(
    flag: str, tiny_google: str, tmp_path: Path
) -> None:
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
    graphs = tmp_path / "graphs"  # empty: a start that got as far as the workers would build the graph here
    flags = [word for name, port in ports.items() for word in (name, str(port))]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports[flag]))
        holder.listen()
        run = _cli("start", "--model-dir", tiny_google, "--graph-dir", str(graphs), *flags)
    port = ports[flag]
    default = ", by default --port + 1" if flag == "--port-out" else ""
    assert run.returncode == 2, run.stderr
    check = {  # how to tell whether a bertserve holds it: each port answers its own way, the workers' none
        "--port": f"`bertserve status --port {port}`",
        "--port-out": f"`bertserve status --port {port - 1}`",
        "--http-port": f"`curl -s http://127.0.0.1:{port}/health`",
        "--metrics-port": f"`curl -s http://127.0.0.1:{port}/metrics`",
    }.get(flag)
    told = f"To see whether a bertserve already serves there: {check}; " if check else ""
    assert _errors(run) == [
        f"bertserve: error: cannot listen on 127.0.0.1:{port} ({flag}{default}): the port is in use. {told}"
        f"to start on another port: {flag} PORT"
    ], run.stderr
    assert "bertserve stopped" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert not list(graphs.rglob("*.graph"))


def test_a_hub_name_is_told_to_use_model_id(tmp_path: Path) -> None:
    name = "sentence-transformers/all-MiniLM-L6-v2"
    run = _cli("start", "--model-dir", name, "--port", str(free_ports(1)[0]), cwd=tmp_path)
    assert run.returncode == 2
    assert _errors(run) == [
        f"bertserve: error: model directory {name!r} does not exist or is not a directory; it looks like a "
        f"Hugging Face Hub id: serve it with `--model-id {name}` (fetched once into the Hub cache), or, for a "
        f"machine without network, fetch it elsewhere with `hf download {name} --local-dir DIR` and give that "
        "DIR to --model-dir"
    ], run.stderr
    assert "bertserve stopped" not in run.stderr


def _python_without(hidden: set[str], tmp_path: Path) -> list[str]:
    """A Python whose site-packages is this one's but for the distributions ``hidden``: a
    directory of links to every other entry, the only one on its path (``-S``)."""
    view = tmp_path / "site-packages"
    view.mkdir()
    for directory in dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]):
        for entry in Path(directory).iterdir():
            if re.split(r"[-.]", entry.name)[0].lower() not in hidden and not (view / entry.name).exists():
                (view / entry.name).symlink_to(entry)
    boot = (
        "import site, sys; site.addsitedir(sys.argv.pop(1)); "
        "from bertserve.server.cli.main import main; sys.exit(main())"
    )
    return [sys.executable, "-S", "-c", boot, str(view)]


@pytest.mark.parametrize("command", [["start"], ["worker"], ["embed"], ["export", "--out", "somewhere"]])
def test_a_server_command_names_the_missing_packages_and_how_to_install_them(
    command: list[str], tmp_path: Path
) -> None:
    python = _python_without({"tokenizers", "uvicorn"}, tmp_path)
    started = time.monotonic()
    here = _cli(*command, cwd=ROOT, python=python)
    assert time.monotonic() - started < 20  # nothing heavy was imported
    assert here.returncode == 2, here.stderr
    assert len(_errors(here)) == 1 and "Traceback" not in here.stderr, here.stderr
    error = _errors(here)[0]
    assert error.startswith(
        f"bertserve: error: `bertserve {command[0]}` needs the server's packages, and "
        "tokenizers and uvicorn are not installed; install them with: "
    ), error
    assert re.search(r"(^|\s|-m )pip install -e '\.\[server\]'$", error), error  # the checkout, from inside it
    elsewhere = _cli(*command, cwd=tmp_path, python=python)
    assert _errors(elsewhere)[0].endswith(f"pip install -e '{ROOT}[server]'"), elsewhere.stderr


def test_client_commands_need_no_server_packages(tmp_path: Path) -> None:
    python = _python_without({"tokenizers", "uvicorn", "tensorflow"}, tmp_path)
    status = _cli("status", "--port", str(free_ports(1)[0]), "--timeout", "300", python=python)
    assert status.returncode != 0
    assert "not installed" not in status.stderr and "Traceback" not in status.stderr, status.stderr
