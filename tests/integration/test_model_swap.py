"""Model versions while serving: the real server swapping tiny BERTs under load, refusing
broken versions, rolling back a version whose worker dies as it loads, and a rollback asked for
by hand."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
from bertserve.client import BertClient
from bertserve.server import Encoder
from bertserve.server.model.checksum import write_manifest
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from bertserve.server.testing.tiny_bert import write_tiny_bert
from faulty_model import wait_for

pytestmark = pytest.mark.timeout(300)

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world"]
SWAP_TIMEOUT_S = 120.0


def sentences(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 21)))) + f" {i}" for i in range(n)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Two tiny BERTs that give different vectors: seed 1 and seed 2."""
    return {seed: write_tiny_bert(str(tmp_path_factory.mktemp(f"seed{seed}")), "google", seed=seed) for seed in (1, 2)}


@pytest.fixture(scope="module")
def encoders(models: dict[int, str], session_graph_dir: str) -> dict[int, Encoder]:
    return {seed: Encoder(path, graph_dir=session_graph_dir, max_seq_len=32) for seed, path in models.items()}


def add_version(base: Path, number: int, source: str, *, settled: bool = True) -> Path:
    """Copy ``source`` into ``base/number`` with its manifest (dated a minute back when
    ``settled``, so it need not wait to settle)."""
    target = base / str(number)
    shutil.copytree(source, target)
    write_manifest(str(target))
    if settled:
        settle(target)
    return target


def settle(directory: Path) -> None:
    """Date every file a minute back, as a copy that ended then."""
    past = time.time() - 60
    for path in directory.rglob("*"):
        os.utime(path, (past, past))


def wait_swap(client: BertClient, state: str, timeout: float = SWAP_TIMEOUT_S, **expected: Any) -> dict[str, Any]:
    """The status once its swap is in ``state`` with the ``expected`` fields."""
    deadline = time.monotonic() + timeout
    while True:
        status = client.server_status
        swap = status.get("swap", {})
        if swap.get("state") == state and all(swap.get(k) == v for k, v in expected.items()):
            return status
        assert time.monotonic() < deadline, f"the swap did not reach {state} {expected}: {swap}"
        time.sleep(0.2)


def version_of(vectors: np.ndarray, texts: list[str], encoders: dict[int, Encoder], by_version: dict[int, int]) -> int:
    """Which version's vectors these are (by the model each version holds), checked exactly."""
    matches = [v for v, seed in by_version.items() if np.allclose(vectors, encoders[seed].encode(texts), atol=1e-5)]
    assert len(matches) == 1, f"the vectors match versions {matches}"
    return matches[0]


def child_processes(server: RunningServer) -> int:
    """The processes the server started: the sink, the workers (and a resource tracker). Not
    their own short-lived children (a library looking for a shared object runs ldconfig)."""
    try:
        return len(psutil.Process(server.process.pid).children())
    except psutil.Error:
        return 0


def test_a_swap_under_load_fails_no_request_and_each_reply_names_its_version(
    models: dict[int, str], encoders: dict[int, Encoder], session_graph_dir: str, tmp_path: Path
) -> None:
    base = tmp_path / "models"
    add_version(base, 1, models[1])
    server = start_server(
        "--model-dir",
        str(base),
        "--num-worker",
        "2",
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        "32",
        "--poll-interval-s",
        "0.5",
        "--max-batch-size",
        "64",
        "--bulk-slowdown",
        "0",  # every request served
    )
    pool = {seed: sentences(400, seed=seed) for seed in range(8)}
    references = {(seed, v): encoders[v].encode(texts) for seed, texts in pool.items() for v in (1, 2)}
    stop = threading.Event()
    replies: dict[int, list[int]] = {seed: [] for seed in pool}
    failures: list[str] = []

    def client_loop(seed: int) -> None:
        rng = np.random.default_rng(seed)
        texts = pool[seed]
        try:
            with BertClient(**server.client_kwargs, timeout=60_000) as client:
                while not stop.is_set():
                    start = int(rng.integers(0, len(texts) - 1))
                    size = int(rng.choice([1, 3, 17, 100, 200]))
                    rows = slice(start, start + size)
                    vectors = client.encode(texts[rows])
                    version = client.last_info["model_version"]
                    if not np.allclose(vectors, references[seed, version][rows], atol=1e-5):
                        failures.append(f"client {seed}: vectors not those of version {version}")
                    replies[seed].append(version)
        except Exception as exc:
            failures.append(f"client {seed}: {exc!r}")

    workers_seen: list[int] = []

    def watch() -> None:
        while not stop.is_set():
            workers_seen.append(child_processes(server))
            time.sleep(0.05)

    threads = [threading.Thread(target=client_loop, args=(seed,)) for seed in pool]
    threads.append(threading.Thread(target=watch))
    try:
        steady = child_processes(server)
        assert steady >= 3  # the sink and two workers
        for thread in threads:
            thread.start()
        wait_for(lambda: all(replies.values()) or failures, 60, "every client served by version 1")
        add_version(base, 2, models[2], settled=False)  # it settles 2 s after the copy, then swaps
        with BertClient(**server.client_kwargs, timeout=30_000) as control:
            status = wait_swap(control, "done", version_to=2)
            wait_for(  # more traffic on version 2
                lambda: all(versions[-1:] == [2] for versions in replies.values()) or failures,
                60,
                "every client served by version 2",
            )
            stop.set()
            for thread in threads:
                thread.join(120)
            assert status["model_version"] == 2 and status["swap"]["version_from"] == 1
            assert [w["version"] for w in status["workers"]] == [2, 2]
            assert control.server_config["model_version"] == "2"
            answer = control.reload()  # nothing newer: nothing to do
            swap = wait_swap(control, "unchanged", reload=answer["reload"])["swap"]
            assert swap["message"] == "no version newer than 2 can be served"
    finally:
        stop.set()
        server.stop()
    assert not failures, failures
    assert max(workers_seen) <= steady + 1, "more than one worker beyond --num-worker was running"
    for seed, versions in replies.items():
        assert versions and versions[-1] == 2, (seed, versions[-5:])
        assert versions == sorted(versions), f"client {seed} got version 1 after version 2"
    assert sum(v == 1 for versions in replies.values() for v in versions) > 0
    assert "new requests run on model version 2" in "".join(server.output)


def test_broken_versions_are_refused_and_a_failed_load_rolls_back(
    models: dict[int, str], encoders: dict[int, Encoder], session_graph_dir: str, tmp_path: Path
) -> None:
    base = tmp_path / "models"
    add_version(base, 1, models[1])
    http_port = free_port()
    server = start_server(  # a graph cache of its own: each version's graph is built while serving
        "--model-dir",
        str(base),
        "--graph-dir",
        str(tmp_path / "graphs"),
        "--max-seq-len",
        "32",
        "--poll-interval-s",
        "0.3",
        "--http-port",
        str(http_port),
    )
    texts = sentences(30, seed=9)
    seeds = {1: 1}
    try:
        with BertClient(**server.client_kwargs, timeout=30_000) as client:

            def served() -> int:
                vectors = client.encode(texts)
                version = client.last_info["model_version"]
                assert version_of(vectors, texts, encoders, seeds) == version
                return int(version)

            def refusal(number: int, why: str) -> None:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    entries = {e["version"]: e for e in client.server_status["refused_versions"]}
                    if why in entries.get(number, {}).get("reason", ""):
                        return
                    time.sleep(0.2)
                raise AssertionError(f"version {number} was not refused for {why!r}: {entries.get(number)}")

            half = base / "2"  # half copied: the manifest came first, the weights are not there yet
            half.mkdir()
            whole = add_version(tmp_path / "staging", 2, models[2])
            for name in ("bertserve.sha256", "bert_config.json", "vocab.txt"):
                shutil.copy(whole / name, half / name)
            settle(half)
            refusal(2, "is listed but missing")
            assert served() == 1

            corrupt = add_version(base, 3, models[2])  # one byte changed after its manifest
            weights = next(corrupt.glob("*.data-*"))
            data = bytearray(weights.read_bytes())
            data[len(data) // 2] ^= 0x01
            weights.write_bytes(data)
            settle(corrupt)
            refusal(3, "does not match its sha256")
            assert served() == 1

            truncated = add_version(base, 4, models[2], settled=False)  # whole by its manifest, but cannot load
            weights = next(truncated.glob("*.data-*"))
            with open(weights, "r+b") as f:
                f.truncate(weights.stat().st_size // 2)
            write_manifest(str(truncated))
            settle(truncated)
            status = wait_swap(client, "refused", version_to=4)  # its graph cannot be built: no worker is touched
            refusal(4, "could not be built")
            assert status["model_version"] == 1
            assert [w["version"] for w in status["workers"]] == [1]
            assert served() == 1

            before = {child.pid for child in psutil.Process(server.process.pid).children()}
            add_version(base, 5, models[2])  # sound, but its worker dies while it loads
            wait_swap(client, "rolling", version_to=5)
            deadline = time.monotonic() + 30
            while not (started := [c for c in psutil.Process(server.process.pid).children() if c.pid not in before]):
                assert time.monotonic() < deadline, "no worker of version 5 started"
                time.sleep(0.05)
            (loading,) = started
            loading.kill()
            status = wait_swap(client, "rolled_back", version_to=5)
            refusal(5, "could not load it")
            assert status["model_version"] == 1
            assert [w["version"] for w in status["workers"]] == [1]
            assert served() == 1
            time.sleep(1)  # a few more polls: each refusal is logged once
            log = "".join(server.output)
            for number in (2, 3, 4, 5):
                assert log.count(f"refused version {number} ") == 1, log
            assert log.count("before a worker loads it") == 3, log  # at start, and for versions 4 and 5

            add_version(base, 6, models[2])
            seeds[6] = 2
            wait_swap(client, "done", version_to=6)
            assert served() == 6
            answer = httpx.post(f"http://127.0.0.1:{http_port}/v1/embeddings", json={"input": texts}, timeout=30)
            assert answer.status_code == 200 and answer.headers["X-Model-Version"] == "6"
            listed = httpx.get(f"http://127.0.0.1:{http_port}/v1/models", timeout=30).json()
            assert [model["id"] for model in listed["data"]] == ["models"]  # the repository, whatever the version
            vectors = np.asarray([row["embedding"] for row in answer.json()["data"]], np.float32)
            assert version_of(vectors, texts, encoders, seeds) == 6

            command = [
                sys.executable,
                "-m",
                "bertserve.server.cli",
                "reload",
                "--port",
                str(server.port),
                "--port-out",
                str(server.port_out),
                "--model-version",
                "1",
            ]
            rollback = subprocess.run(command, capture_output=True, text=True, timeout=180)
            assert rollback.returncode == 0, rollback.stdout + rollback.stderr
            assert "done: serving version 1" in rollback.stdout
            assert served() == 1
            time.sleep(1)  # asked for by number: polling does not take version 6 again
            assert served() == 1 and client.server_status["model_version"] == 1

            answer = client.reload(1)
            assert (
                wait_swap(client, "unchanged", reload=answer["reload"])["swap"]["message"]
                == "version 1 is already served"
            )
            answer = client.reload(9)
            assert "has no version 9" in wait_swap(client, "refused", reload=answer["reload"])["swap"]["message"]
    finally:
        server.stop()
