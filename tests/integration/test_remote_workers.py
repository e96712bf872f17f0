"""Remote workers, end to end: a head started with ``--worker-port`` and ``bertserve worker``
hosts joining it over tcp on loopback, each a real process group.

The tiny BERT shows that remote workers give the in-process ``Encoder``'s vectors; the fault
tests serve :class:`faulty_model.PacedModel` (50 ms a model run, no TensorFlow), so killing,
joining and restarting happen while work is in flight and each test takes seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bertserve.client import BertClient, ServerBusyError
from bertserve.server.config.model import ModelConfig
from bertserve.server.testing.launcher import RunningServer, start_head, start_server, start_worker_host
from faulty_model import expected, pythonpath_env, sentences, wait_for

PACED = "faulty_model:PacedModel"
HEAD_FLAGS = ("--num-worker", "0", "--max-batch-size", "16", "--heartbeat-timeout-ms", "3000")


def remote_workers(client: BertClient) -> list[dict[str, Any]]:
    return [w for w in client.server_status["workers"] if w["remote"]]


def kill_group(process: RunningServer) -> None:
    """SIGKILL the host and its workers at once, as a machine that loses power."""
    os.killpg(process.process.pid, signal.SIGKILL)
    process.process.wait(10)


class Hosts:
    """Worker hosts started by a test, all stopped at its end."""

    def __init__(self, worker_port: int, *flags: str) -> None:
        self.worker_port = worker_port
        self.flags = flags
        self.started: list[RunningServer] = []

    def start(self, *args: str, **options: Any) -> RunningServer:
        host = start_worker_host(self.worker_port, *self.flags, *args, env=pythonpath_env(), **options)
        self.started.append(host)
        return host

    def stop_all(self) -> None:
        for host in self.started:
            if host.process.poll() is None:
                host.stop()


@pytest.fixture
def paced_head(tiny_google: str) -> Iterator[tuple[RunningServer, Hosts]]:
    head, worker_port = start_head(
        "--model-dir", tiny_google, "--model-class", PACED, *HEAD_FLAGS, env=pythonpath_env()
    )
    hosts = Hosts(worker_port, "--model-dir", tiny_google, "--model-class", PACED)
    try:
        yield head, hosts
    finally:
        hosts.stop_all()
        head.stop()


def test_remote_workers_give_the_encoders_vectors_and_share_the_work(tiny_google: str, session_graph_dir: str) -> None:
    from bertserve.server.model.encoder import Encoder

    model_flags = ("--model-dir", tiny_google, "--graph-dir", session_graph_dir)
    head, worker_port = start_head(*model_flags, "--num-worker", "0", "--max-batch-size", "32")
    hosts = Hosts(worker_port, *model_flags)
    try:
        hosts.start()
        hosts.start()
        texts = sentences(600, seed=3)
        with BertClient(**head.client_kwargs, timeout=120_000) as client:
            wait_for(lambda: len(remote_workers(client)) == 2, 120, "both remote workers registering")
            vectors = client.encode(texts)
            workers = remote_workers(client)
        reference = Encoder(ModelConfig.of(model_dir=tiny_google, graph_dir=session_graph_dir)).encode(texts)
        np.testing.assert_allclose(vectors, reference, atol=1e-5)
        assert all(w["jobs_done"] > 0 for w in workers), workers
        assert {w["device"] for w in workers} == {"/CPU:0"} or all(w["device"] for w in workers), workers
    finally:
        hosts.stop_all()
        head.stop()


def test_a_killed_host_loses_no_request(paced_head: tuple[RunningServer, Hosts]) -> None:
    head, hosts = paced_head
    doomed = hosts.start()
    hosts.start()
    texts = sentences(1500, seed=4)
    with BertClient(**head.client_kwargs, timeout=60_000) as client:
        wait_for(lambda: len(remote_workers(client)) == 2, 60, "both remote workers registering")
        result: dict[str, Any] = {}
        encoding = threading.Thread(target=lambda: result.update(vectors=client.encode(texts)))
        encoding.start()
        wait_for(lambda: doomed.process.poll() is None and _busy(head), 20, "the request running")
        kill_group(doomed)
        encoding.join(60)
        assert not encoding.is_alive()
        np.testing.assert_allclose(result["vectors"], expected(texts), atol=1e-6)
    with BertClient(**head.client_kwargs, timeout=10_000) as client:
        wait_for(lambda: len(remote_workers(client)) == 1, 10, "the dead host's worker being forgotten")
        np.testing.assert_allclose(client.encode(texts[:50]), expected(texts[:50]), atol=1e-6)
    assert "sent nothing for" in head.tail(400)


def _busy(head: RunningServer) -> bool:
    with BertClient(**head.client_kwargs, timeout=5_000) as client:
        return client.server_status["jobs_in_flight"] > 0


def test_a_host_that_joins_under_load_gets_work(paced_head: tuple[RunningServer, Hosts]) -> None:
    head, hosts = paced_head
    hosts.start()
    stop = threading.Event()
    failures: list[BaseException] = []
    answered = [0]

    def load() -> None:
        texts = sentences(200, seed=5)
        want = expected(texts)
        with BertClient(**head.client_kwargs, timeout=60_000) as client:
            while not stop.is_set():
                try:
                    np.testing.assert_allclose(client.encode(texts), want, atol=1e-6)
                    answered[0] += 1
                except ServerBusyError:  # the head's bound on bulk lateness: an answer, and retried as it says
                    stop.wait(0.2)
                except BaseException as exc:
                    failures.append(exc)
                    return

    threads = [threading.Thread(target=load) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        late = hosts.start()
        with BertClient(**head.client_kwargs, timeout=10_000) as client:
            pid = wait_for(lambda: _late_pid(client, late), 30, "the late host's worker registering")
            wait_for(lambda: _jobs_done(client, pid) > 0, 30, "the late worker getting jobs")
        # A host stopped under load finishes or hands back what it holds: nothing is lost.
        late.stop()
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not failures, failures
    assert answered[0] > 0
    assert "joined the head" in late.tail(400) and "bertserve worker stopped" in late.tail(50)


def _late_pid(client: BertClient, host: RunningServer) -> int | None:
    children = {p.pid for p in host.family()[1:]}
    return next((w["pid"] for w in remote_workers(client) if w["pid"] in children), None)


def _jobs_done(client: BertClient, pid: int) -> int:
    return next((w["jobs_done"] for w in client.server_status["workers"] if w["pid"] == pid), 0)


def test_hosts_join_a_restarted_head_by_themselves(tiny_google: str) -> None:
    head, worker_port = start_head(
        "--model-dir", tiny_google, "--model-class", PACED, *HEAD_FLAGS, env=pythonpath_env()
    )
    flags = ("--model-dir", tiny_google, "--model-class", PACED, "--worker-port", str(worker_port), *HEAD_FLAGS)
    hosts = Hosts(worker_port, "--model-dir", tiny_google, "--model-class", PACED)
    try:
        host = hosts.start()
        with BertClient(**head.client_kwargs, timeout=10_000) as client:
            wait_for(lambda: remote_workers(client), 30, "the worker registering")
        head.stop()
        again = start_server(
            *flags,
            "--port",
            str(head.port),
            "--port-out",
            str(head.port_out),
            env=pythonpath_env(),
        )
        try:
            texts = sentences(100, seed=6)
            with BertClient(**head.client_kwargs, timeout=30_000) as client:  # the same ports
                wait_for(lambda: remote_workers(client), 30, "the worker joining the new head")
                np.testing.assert_allclose(client.encode(texts), expected(texts), atol=1e-6)
            assert host.process.poll() is None
            assert "joining it again" in host.tail(200)
        finally:
            again.stop()
    finally:
        hosts.stop_all()
        if head.process.poll() is None:
            head.stop()


def test_a_host_with_other_model_files_is_refused(
    paced_head: tuple[RunningServer, Hosts], tmp_path: Path, tiny_google: str
) -> None:
    head, hosts = paced_head
    other = tmp_path / "model"
    shutil.copytree(tiny_google, other)
    vocab = other / "vocab.txt"
    vocab.write_bytes(vocab.read_bytes() + b"\n")  # one byte more: other files
    refused = hosts.start("--model-dir", str(other), expect_joined=False)
    assert refused.process.wait(60) == 2
    refused.wait_stopped()
    assert "refused this worker" in refused.tail(50) and "model files" in refused.tail(50)
    with BertClient(**head.client_kwargs, timeout=5_000) as client:
        assert remote_workers(client) == []


def test_under_curve_only_listed_worker_keys_join(tiny_google: str, tmp_path: Path) -> None:
    from bertserve.server.security import keygen

    curve = tmp_path / "curve"
    keygen(curve, "server")
    public, secret = keygen(tmp_path / "keys", "client")
    (curve / "clients").mkdir()
    shutil.copy(public, curve / "clients")
    good_public, good_secret = keygen(tmp_path / "keys", "good")
    _, bad_secret = keygen(tmp_path / "keys", "bad")  # its public key is not in workers/
    (curve / "workers").mkdir()
    shutil.copy(good_public, curve / "workers")
    head, worker_port = start_head(
        "--model-dir", tiny_google, "--model-class", PACED, *HEAD_FLAGS, "--curve-dir", str(curve), env=pythonpath_env()
    )
    server_key = str(curve / "server.key")
    hosts = Hosts(worker_port, "--model-dir", tiny_google, "--model-class", PACED, "--server-key", server_key)
    client_options = {**head.client_kwargs, "server_key": server_key, "client_cert": str(secret), "timeout": 10_000}
    try:
        bad = hosts.start("--client-cert", str(bad_secret), expect_joined=False)
        wait_for(lambda: "refused this client's key" in bad.tail(50), 30, "the bad key's refusal being logged")
        assert "workers/" in bad.tail(50)
        with BertClient(**client_options) as client:
            assert remote_workers(client) == []
        hosts.start("--client-cert", str(good_secret))
        texts = sentences(50, seed=7)
        with BertClient(**client_options) as client:
            wait_for(lambda: len(remote_workers(client)) == 1, 30, "the listed worker registering")
            np.testing.assert_allclose(client.encode(texts), expected(texts), atol=1e-6)
    finally:
        hosts.stop_all()
        head.stop()
