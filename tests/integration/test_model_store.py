"""A server whose model is kept in object storage: real server processes reaching moto's S3
server on loopback as they reach AWS or MinIO (``AWS_ENDPOINT_URL``), with tiny BERTs the
tests write.

One server lives through what a store does to it: a new version uploaded while clients
encode, a version rotten in the store, the store going down and a rollback meanwhile. Others
start against a store that is down, one that refuses their credentials, and a worker host
that syncs the head's version for itself."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from bertserve.client import BertClient
from bertserve.server import Encoder
from bertserve.server.testing.launcher import free_port, start_head, start_server, start_worker_host
from bertserve.server.testing.tiny_bert import write_tiny_bert
from faulty_model import wait_for
from prometheus_client.parser import text_string_to_metric_families
from store_standin import BUCKET, S3Standin, strict_s3

pytestmark = pytest.mark.timeout(300)

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world"]


@pytest.fixture(scope="module")
def standin() -> Iterator[S3Standin]:
    store = S3Standin()
    yield store
    store.stop()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Tiny BERTs that give different vectors: seeds 1, 2 and 3."""
    return {
        seed: write_tiny_bert(str(tmp_path_factory.mktemp(f"seed{seed}")), "google", seed=seed) for seed in (1, 2, 3)
    }


@pytest.fixture(scope="module")
def encoders(models: dict[int, str], session_graph_dir: str) -> dict[int, Encoder]:
    return {seed: Encoder(models[seed], graph_dir=session_graph_dir, max_seq_len=32) for seed in (1, 2)}


def sentences(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 21)))) + f" {i}" for i in range(n)]


def sync_failures(metrics_port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "bertserve_model_sync_failures_total"
    )


def test_a_store_model_swaps_under_load_refuses_a_rotten_version_and_outlives_its_store(
    standin: S3Standin, models: dict[int, str], encoders: dict[int, Encoder], session_graph_dir: str, tmp_path: Path
) -> None:
    standin.upload("swap/1", models[1])
    metrics_port = free_port()
    server = start_server(
        *("--model-dir", f"s3://{BUCKET}/swap", "--model-cache", str(tmp_path / "cache")),
        *("--graph-dir", session_graph_dir, "--max-seq-len", "32", "--num-worker", "1"),
        *("--poll-interval-s", "0.5", "--metrics-port", str(metrics_port), "--bulk-slowdown", "0"),
        env=standin.env,
    )
    seed_of = {1: 1, 2: 2}
    pool = {seed: sentences(200, seed=seed) for seed in range(3)}
    references = {(seed, v): encoders[v].encode(texts) for seed, texts in pool.items() for v in (1, 2)}
    stop = threading.Event()
    replies: dict[int, list[int]] = {seed: [] for seed in pool}
    failures: list[str] = []

    def client_loop(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            with BertClient(**server.client_kwargs, timeout=60_000) as client:
                while not stop.is_set():
                    start = int(rng.integers(0, 150))
                    rows = slice(start, start + int(rng.choice([1, 5, 40])))
                    vectors = client.encode(pool[seed][rows])
                    version = client.last_info["model_version"]
                    if not np.allclose(vectors, references[seed, seed_of[version]][rows], atol=1e-5):
                        failures.append(f"client {seed}: vectors not those of version {version}")
                    replies[seed].append(version)
        except Exception as exc:
            failures.append(f"client {seed}: {exc!r}")

    threads = [threading.Thread(target=client_loop, args=(seed,)) for seed in pool]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: all(replies.values()) or failures, 60, "every client served by version 1")
        with BertClient(**server.client_kwargs, timeout=30_000) as control:
            assert control.server_status["sync"]["url"] == f"s3://{BUCKET}/swap"
            standin.upload("swap/2", models[2])  # picked up at the next poll, synced, swapped
            wait_for(lambda: control.server_status["model_version"] == 2 or failures, 120, "version 2 served")
            wait_for(lambda: all(v[-1:] == [2] for v in replies.values()) or failures, 60, "clients on version 2")

            # new weights (a file the cache holds under its digest would be linked, not fetched), rotten in the store
            rotten = {"bert_model.ckpt.data-00000-of-00001": b"rotten"}
            standin.upload("swap/3", models[3], rotten=rotten)
            wait_for(lambda: any(r["version"] == 3 for r in control.server_status["refused_versions"]), 60, "3 refused")
            status = control.server_status
            refusal = next(r for r in status["refused_versions"] if r["version"] == 3)
            assert "bert_model.ckpt.data-00000-of-00001" in refusal["reason"], refusal
            assert "does not match the manifest" in refusal["reason"]
            assert status["model_version"] == 2 and sync_failures(metrics_port) >= 1
            assert f"refused version 3 of s3://{BUCKET}/swap: " in server.tail(400)

            before = sync_failures(metrics_port)
            standin.stop()  # the store goes down: counted, logged, and nothing else changes
            wait_for(lambda: sync_failures(metrics_port) > before, 60, "a failed sync counted")
            assert control.server_status["model_version"] == 2
            wait_for(lambda: "model sync of s3://models/swap failed" in server.tail(400), 30, "the failure logged")

            command = [sys.executable, "-m", "bertserve.server.cli", "reload", "--version", "1"]
            reload = subprocess.run(  # a rollback from the cache, with the store down
                [*command, "--port", str(server.port), "--port-out", str(server.port_out)],
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert reload.returncode == 0, reload.stdout + reload.stderr
            assert "done: serving version 1" in reload.stdout
            assert control.server_status["model_version"] == 1
            wait_for(lambda: all(v[-1:] == [1] for v in replies.values()) or failures, 60, "clients on version 1")
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
        server.stop()
        if not standin.server._thread or not standin.server._thread.is_alive():  # type: ignore[attr-defined]
            standin.start()
    assert not failures, failures
    assert all(2 in versions for versions in replies.values())


def test_a_store_down_at_start_with_nothing_cached_stops_the_start_and_says_why(
    standin: S3Standin, tmp_path: Path
) -> None:
    down = {**standin.env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    server = start_server(
        "--model-dir", f"s3://{BUCKET}/swap", "--model-cache", str(tmp_path / "c"), env=down, expect_ready=False
    )
    assert server.process.wait(120) != 0
    out = server.tail(40)
    assert "listing s3://models/swap: Could not connect to the endpoint URL" in out, out


def test_wrong_credentials_are_refused_at_start_and_never_printed(models: dict[int, str], tmp_path: Path) -> None:
    with strict_s3(models[1], "strict/1") as store:
        server = start_server(
            *("--model-dir", f"s3://{BUCKET}/strict", "--model-cache", str(tmp_path / "c")),
            env=store.env(AWS_SECRET_ACCESS_KEY="wrong-secret-value"),
            expect_ready=False,
        )
        assert server.process.wait(120) != 0
        out = server.tail(40)
        assert "access denied" in out and "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in out, out
        assert "wrong-secret-value" not in "".join(server.output)


def test_a_worker_host_syncs_the_heads_version_from_the_store_itself_and_another_is_refused_by_number(
    standin: S3Standin, models: dict[int, str], encoders: dict[int, Encoder], session_graph_dir: str, tmp_path: Path
) -> None:
    standin.upload("remote/1", models[2])
    url = f"s3://{BUCKET}/remote"
    head, worker_port = start_head(
        *("--model-dir", url, "--model-cache", str(tmp_path / "head-cache"), "--graph-dir", session_graph_dir),
        *("--max-seq-len", "32", "--num-worker", "0"),
        env=standin.env,
    )
    host_flags = ("--model-dir", url, "--model-cache", str(tmp_path / "host-cache"), "--graph-dir", session_graph_dir)
    try:
        standin.upload("remote/2", models[1])  # newer than the head's version 1: a head with workers does not swap
        newest = start_worker_host(worker_port, *host_flags, env=standin.env, expect_joined=False)
        assert newest.process.wait(120) == 2
        refusal = newest.tail(20)
        assert "version 1 of its repository" in refusal and "--model-version 1" in refusal, refusal
        host = start_worker_host(worker_port, *host_flags, "--model-version", "1", env=standin.env)
        try:
            texts = sentences(20, seed=7)
            with BertClient(**head.client_kwargs, timeout=60_000) as client:
                wait_for(
                    lambda: any(w["remote"] for w in client.server_status["workers"]),
                    60,
                    "the remote worker registered",
                )
                np.testing.assert_allclose(client.encode(texts), encoders[2].encode(texts), atol=1e-5)
            assert any(p.name == "1" for p in (tmp_path / "host-cache").glob("*/1"))
        finally:
            host.stop()
    finally:
        head.stop()


def test_embed_reads_the_newest_whole_version_of_a_store(
    standin: S3Standin, models: dict[int, str], encoders: dict[int, Encoder], tmp_path: Path
) -> None:
    """``bertserve embed --model-dir s3://...``: the newest version that can be had, checked by
    its manifest; a newer one rotten in the store is refused by name, and the one below serves."""
    standin.upload("embed/1", models[2])
    standin.upload("embed/2", models[3], rotten={"bert_model.ckpt.data-00000-of-00001": b"rotten"})
    texts = sentences(5, seed=9)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    out = tmp_path / "out.npy"
    command = [sys.executable, "-m", "bertserve.server.cli", "embed", str(tmp_path / "in.txt"), "-o", str(out)]
    done = subprocess.run(
        [*command, "--model-dir", f"s3://{BUCKET}/embed", "--max-seq-len", "32"],
        env={**os.environ, **standin.env, "BERTSERVE_MODEL_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert "refused version 2 of s3://models/embed" in done.stderr and "does not match the manifest" in done.stderr
    np.testing.assert_allclose(np.load(out), encoders[2].encode(texts), atol=1e-5)
