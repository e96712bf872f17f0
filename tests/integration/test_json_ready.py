"""``bertserve start --log-format json`` from the real command line, with the fast
HashingModel: every line it writes, on stdout and on stderr, is one JSON object. The ready line
is one on stdout, with the log's fields (``level``, ``role``, ``logger``, ``message``, ``time``)
and the ready facts as fields of their own; an error of the command (a port in use) and a
warning of it (``--api-key`` on the command line) are JSON lines on stderr."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from bertserve.server.testing.launcher import free_ports

pytestmark = pytest.mark.timeout(180)

HASHING = "bertserve.server.model.interface:HashingModel"
LOG_FIELDS = {"time", "level", "role", "pid", "logger", "message", "model", "request_id"}


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "bertserve.server.cli", "start", "--log-format", "json", *args],
            stdout=stdout,
            stderr=stderr,
        )
    return process, out, err


def _records(path: Path) -> list[dict[str, Any]]:
    """Each line of ``path`` as the JSON object it must be."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"a line of {path.name} that is not JSON: {line!r}")
    return records


def _wait_for_ready(process: subprocess.Popen[bytes], out: Path, err: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready = [record for record in _records(out) if record.get("event") == "ready"]
        if ready:
            return ready[0]
        assert process.poll() is None, err.read_text()
        time.sleep(0.1)
    raise AssertionError(f"no ready line in 120 s:\n{err.read_text()}")


def test_every_line_of_a_json_start_is_json_and_the_ready_line_has_its_facts(tiny_google: str, tmp_path: Path) -> None:
    port, port_out, http_port = free_ports(3)
    process, out, err = _start(
        tmp_path,
        *("--model-dir", tiny_google, "--model-class", HASHING, "--num-worker", "1"),
        *("--port", str(port), "--port-out", str(port_out), "--http-port", str(http_port)),
        *("--api-key", "a-key-on-the-command-line"),
    )
    try:
        ready = _wait_for_ready(process, out, err)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    assert set(ready) >= LOG_FIELDS
    assert (ready["level"], ready["role"], ready["logger"]) == ("INFO", "head", "bertserve.cli")
    assert ready["message"].startswith("bertserve ") and " ready: requests on tcp://127.0.0.1:" in ready["message"]
    assert ready["address"] == f"tcp://127.0.0.1:{port}"
    assert (ready["port"], ready["port_out"], ready["http_port"], ready["worker_port"]) == (
        port,
        port_out,
        http_port,
        None,
    )
    assert ready["http"] == f"http://127.0.0.1:{http_port}"
    assert (ready["workers"], ready["task"], ready["output_dim"]) == (1, "embed", 16)
    assert ready["models"] == [ready["default_model"]] and ready["model_dir"] == tiny_google
    assert [record.get("event") for record in _records(out)] == ["ready"]  # stdout has the ready line alone
    logged = _records(err)
    assert all(set(record) >= LOG_FIELDS for record in logged)
    assert any(
        record["level"] == "WARNING" and record["message"].startswith("--api-key on the command line")
        for record in logged
    )
    assert re.fullmatch(r"bertserve stopped in \d+\.\d s", logged[-1]["message"]), logged[-1]


def test_an_error_of_a_json_start_is_a_json_line(tiny_google: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process, out, err = _start(tmp_path, "--model-dir", tiny_google, "--model-class", HASHING, "--port", str(port))
        assert process.wait(60) == 2
    assert out.read_text() == ""
    (error,) = _records(err)
    assert set(error) >= LOG_FIELDS
    assert (error["level"], error["role"], error["logger"]) == ("ERROR", "head", "bertserve.cli")
    assert error["message"].startswith(f"cannot listen on 127.0.0.1:{port} (--port): the port is in use")
