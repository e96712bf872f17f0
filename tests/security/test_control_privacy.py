"""What a key holder reads of the server, and who may stop it, under CURVE.

A real server under CURVE, started with ``--allow-terminate true``. A client key (alice) reads
CONFIG and STATUS without the model directory's path, the worker pids or hosts; an admin key
(ops, in ``admins/``) reads them. Alice's client and ``bertserve status`` work with what she
reads. Whatever ``--allow-terminate`` says, alice cannot stop the server (the start warned
that the flag has no effect under CURVE), and ops can.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bertserve.client import BertClient, ServerError
from bertserve.client.security import keygen
from bertserve.server.testing.launcher import RunningServer, start_server
from faulty_model import expected, pythonpath_env, sentences

pytestmark = pytest.mark.timeout(120)

MODEL = "faulty_model:FaultyModel"
PRIVATE = ("model_dir", "tuned_model_dir", "graph_dir", "models_dir", "model_defaults", "pid", "host", "hostname")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("curve")
    keygen(root, "server")
    for name in ("alice", "ops"):
        keygen(root / "clients", name)
    (root / "admins").mkdir(mode=0o700)
    (root / "admins" / "ops.key").write_bytes((root / "clients" / "ops.key").read_bytes())
    return root


@pytest.fixture(scope="module")
def server(keys: Path, tiny_google: str) -> Iterator[RunningServer]:
    running = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        MODEL,
        "--num-worker",
        "1",
        "--max-latency-ms",
        "1",
        "--curve-dir",
        str(keys),
        "--allow-terminate",
        "true",
        env=pythonpath_env(),
        timeout=90,
    )
    yield running
    running.stop()


def client(server: RunningServer, keys: Path, name: str) -> BertClient:
    return BertClient(
        **server.client_kwargs,
        timeout=20_000,
        server_key=str(keys / "server.key"),
        client_cert=str(keys / "clients" / f"{name}.key_secret"),
    )


def private_fields(answer: Any, where: str = "") -> list[str]:
    """Where in ``answer`` a path, pid or host is, at any depth."""
    found = []
    if isinstance(answer, dict):
        for key, value in answer.items():
            if key in PRIVATE and value not in (None, "", [], {}):
                found.append(f"{where}{key}")
            found += private_fields(value, f"{where}{key}.")
    elif isinstance(answer, list):
        for index, value in enumerate(answer):
            found += private_fields(value, f"{where}{index}.")
    return found


def test_a_client_key_reads_no_path_pid_or_host(server: RunningServer, keys: Path, tiny_google: str) -> None:
    with client(server, keys, "alice") as alice:
        config, status = alice.server_config, alice.server_status
    assert private_fields(config) == []
    assert private_fields(status) == []
    assert tiny_google not in json.dumps(config) + json.dumps(status)
    assert status["workers"] and status["workers"][0]["state"] in ("idle", "busy")  # the rest is there
    assert config["output_dim"] == 16 and config["protocol"] and config["curve"] is True


def test_an_admin_key_reads_them(server: RunningServer, keys: Path, tiny_google: str) -> None:
    with client(server, keys, "ops") as ops:
        config, status = ops.server_config, ops.server_status
    assert config["model_dir"] == tiny_google
    assert status["workers"][0]["pid"] > 0 and status["workers"][0]["host"]


def test_a_client_key_is_served_and_bertserve_status_works_with_what_it_reads(
    server: RunningServer, keys: Path
) -> None:
    texts = sentences(5, seed=3)
    with client(server, keys, "alice") as alice:
        np.testing.assert_allclose(alice.encode(texts), expected(texts), atol=1e-6)
    command = [
        sys.executable,
        "-m",
        "bertserve.server.cli",
        "status",
        "--json",
        "--port",
        str(server.port),
        "--port-out",
        str(server.port_out),
        "--server-key",
        str(keys / "server.key"),
        "--client-cert",
        str(keys / "clients" / "alice.key_secret"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env={**os.environ})
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["workers"] and private_fields(status) == []


def test_allow_terminate_opens_terminate_to_no_client_key_under_curve(server: RunningServer, keys: Path) -> None:
    with client(server, keys, "alice") as alice, pytest.raises(ServerError, match="admins") as refused:
        alice.terminate()
    assert refused.value.kind == "forbidden"
    assert server.process.poll() is None
    text = server.tail(5000)
    assert "--allow-terminate has no effect under CURVE" in text, text[-3000:]
    with client(server, keys, "ops") as ops:
        assert ops.terminate() == {"stopping": True}
    assert server.process.wait(60) == 0
