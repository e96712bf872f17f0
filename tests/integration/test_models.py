"""Several models behind one head, end to end: real servers serving two tiny BERTs (different
weights, different poolings) side by side, each with its own workers, versions and swap.

Each model answers with its own vectors (as the in-process ``Encoder`` with its options gives
them), bert-as-service's client reaches the default one, the status and the metrics speak of
each model, a swap of one model leaves the other's requests untouched, and remote workers
join for the model they name, checked against its files."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from bert_serving.client import BertClient as OldClient
from bertserve.client import BertClient, ServerError, UnknownModelError
from bertserve.server import Encoder
from bertserve.server.testing.launcher import RunningServer, free_port, start_server, start_worker_host
from bertserve.server.testing.tiny_bert import write_tiny_bert
from faulty_model import wait_for
from test_model_swap import add_version, sentences

pytestmark = pytest.mark.timeout(300)


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    cosine = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= 0.99999, cosine.min()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Two tiny BERTs that give different vectors: seed 1 and seed 2."""
    return {seed: write_tiny_bert(str(tmp_path_factory.mktemp(f"m{seed}")), "google", seed=seed) for seed in (1, 2)}


def wait_for_version(client: BertClient, version: int, texts: list[str], timeout: float = 120.0) -> None:
    """Until the client's model answers from ``version``."""
    deadline = time.monotonic() + timeout
    while True:
        client.encode(texts)
        if client.last_info.get("model_version") == version:
            return
        assert time.monotonic() < deadline, f"model version {version} was never served"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(tiny: dict[int, str], session_graph_dir: str, metrics_port: int) -> Iterator[RunningServer]:
    running = start_server(
        "--model",
        f"mean={tiny[1]}",
        "--model",
        f"cls={tiny[2]},pooling_strategy=CLS_TOKEN,num_worker=2",
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        "32",
        "--metrics-port",
        str(metrics_port),
    )
    yield running
    running.stop()


def test_each_model_answers_with_its_own_vectors_and_an_unknown_one_is_refused(
    server: RunningServer, tiny: dict[int, str], session_graph_dir: str
) -> None:
    texts = sentences(40, seed=3)
    mean = Encoder(tiny[1], graph_dir=session_graph_dir, max_seq_len=32).encode(texts)
    cls = Encoder(tiny[2], graph_dir=session_graph_dir, max_seq_len=32, pooling_strategy="CLS_TOKEN").encode(texts)
    with (
        BertClient(**server.client_kwargs, timeout=60_000) as default,
        BertClient(**server.client_kwargs, timeout=60_000, model="cls") as named,
    ):
        assert_same(default.encode(texts), mean)
        assert_same(named.encode(texts), cls)
        assert_same(named.encode(texts, model="mean"), mean)  # one call to the other model
        with pytest.raises(UnknownModelError, match=r"serves no model 'nope'; it serves 'mean', 'cls'"):
            default.encode(texts, model="nope")
        assert default.encode(["still answered"]).shape == (1, mean.shape[1])
        old = OldClient(port=server.port, port_out=server.port_out, timeout=30_000)
        try:
            assert_same(old.encode(texts), mean)  # bert-as-service's client reaches the default model
        finally:
            old.close()


def test_status_config_and_metrics_speak_of_each_model(server: RunningServer, metrics_port: int) -> None:
    with BertClient(**server.client_kwargs, timeout=30_000, model="cls") as client:
        client.encode(["one for the metrics"])
        config, status = client.server_config, client.server_status
    assert config["model_name"] == "cls" and config["default_model"] == "mean"
    assert "(the default of 2 models: mean (fp32), cls (fp32))" in (server.ready_line or ""), server.ready_line
    assert config["pooling_strategy"] == "CLS_TOKEN"
    assert [(m["name"], m["workers"], m["ready"]) for m in config["models"]] == [("mean", 1, True), ("cls", 2, True)]
    assert status["ready"] and status["models"]["mean"]["default"] and status["models"]["cls"]["workers"] == 2
    assert sorted(w["model"] for w in status["workers"]) == ["cls", "cls", "mean"]
    scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    assert 'bertserve_requests_total{model="cls",outcome="ok",path="zmq"}' in scraped
    assert 'bertserve_model_workers{model="cls"} 2.0' in scraped
    assert "bertserve_model_info{" in scraped and 'model="mean"' in scraped


def test_a_swap_of_one_model_leaves_the_other_models_requests_untouched(
    tiny: dict[int, str], session_graph_dir: str, tmp_path: Path
) -> None:
    base = tmp_path / "rolling"
    add_version(base, 1, tiny[1])
    server = start_server(
        "--model",
        f"stable={tiny[2]}",
        "--model",
        f"rolling={base},poll_interval_s=0.5",
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        "32",
        "--max-batch-size",
        "64",
    )
    texts = sentences(60, seed=5)
    stable = Encoder(tiny[2], graph_dir=session_graph_dir, max_seq_len=32).encode(texts)
    stop, failures, answered = threading.Event(), [], []

    def steady() -> None:
        try:
            with BertClient(**server.client_kwargs, timeout=60_000, model="stable") as client:
                while not stop.is_set():
                    vectors = client.encode(texts)
                    if not np.allclose(vectors, stable, atol=1e-5) or "model_version" in client.last_info:
                        failures.append("the stable model's vectors changed")
                    answered.append(1)
        except Exception as exc:
            failures.append(repr(exc))

    threads = [threading.Thread(target=steady) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: len(answered) >= len(threads) or failures, 60, "the stable model serving every thread")
        add_version(base, 2, tiny[2], settled=False)
        with BertClient(**server.client_kwargs, timeout=30_000, model="rolling") as client:
            wait_for_version(client, 2, texts)
            status = client.server_status
            command = [
                sys.executable,
                "-m",
                "bertserve.server.cli",
                "reload",
                "--port",
                str(server.port),
                "--port-out",
                str(server.port_out),
                "--model",
                "rolling",
                "--wait-s",
                "60",
            ]
            reload = subprocess.run(command, capture_output=True, text=True, timeout=120)
            with pytest.raises(ServerError, match="not a repository of numbered versions"):
                client.reload(model="stable")
        time.sleep(1)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        server.stop()
    assert not failures, failures[:3]
    assert len(answered) > 10
    assert status["models"]["rolling"]["model_version"] == 2 and "model_version" not in status["models"]["stable"]
    planning = status["models"]["stable"]["bulk_planning"]  # what its bulk admission plans with
    assert set(planning) == {
        "capacity_sentences_per_s",
        "small_share",
        "small_load",
        "bulk_lag",
        "bulk_sentences_per_s",
    }
    assert 0.75 <= planning["bulk_lag"] <= 4.0 and 0.0 <= planning["small_share"] <= 1.0
    assert reload.returncode == 0, reload.stdout + reload.stderr
    assert "unchanged: no version newer than 2 can be served" in reload.stdout


def test_remote_workers_join_for_the_model_they_name(tiny: dict[int, str], session_graph_dir: str) -> None:
    worker_port = free_port()
    server = start_server(
        "--model",
        f"here={tiny[1]}",
        "--model",
        f"far={tiny[2]},num_worker=0",
        "--worker-port",
        str(worker_port),
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        "32",
        expect_ready=False,
    )
    hosts = []
    try:
        wrong = start_worker_host(worker_port, "--model-dir", tiny[1], "--model-name", "far", expect_joined=False)
        hosts.append(wrong)
        right = start_worker_host(
            worker_port, "--model-dir", tiny[2], "--model-name", "far", "--graph-dir", session_graph_dir
        )
        hosts.append(right)
        texts = sentences(20, seed=7)
        want = Encoder(tiny[2], graph_dir=session_graph_dir, max_seq_len=32).encode(texts)
        with BertClient(**server.client_kwargs, timeout=60_000, model="far") as client:
            deadline = time.monotonic() + 120
            while not client.server_status["ready"]:
                assert time.monotonic() < deadline, "the remote worker never joined"
                time.sleep(0.3)
            assert_same(client.encode(texts), want)
            workers = client.server_status["workers"]
        assert [(w["model"], w["remote"]) for w in workers] == [("here", False), ("far", True)]
        assert any("differ from those of the head's model far" in line for line in wrong.output)
    finally:
        for host in hosts:
            host.stop()
        server.stop()
