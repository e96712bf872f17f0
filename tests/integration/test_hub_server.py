"""``bertserve start --model-id``: a real server fetching the tiny BERT from a stand-in for the
Hub on loopback (tests/hub_standin.py) into a Hugging Face cache of the test's own, then
starting again from that cache with ``HF_HUB_OFFLINE=1`` without a single request; and a
``bertserve worker --model-id`` host, with a Hub cache of its own (another machine's), that
fetches the head's model and serves it."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from bertserve.client import BertClient
from bertserve.server import Encoder
from bertserve.server.testing import tiny_bert
from bertserve.server.testing.launcher import free_port, start_server, start_worker_host
from hub_standin import HubStandIn, read_directory

TEXTS = ["hello world", "the quick brown fox"]


def test_a_model_id_is_fetched_once_then_served_offline_with_its_commit(tmp_path: Path, session_graph_dir: str) -> None:
    model_dir = tiny_bert.write_tiny_bert(str(tmp_path / "tiny"), "huggingface", seed=1, sentence_transformers=True)
    expected = Encoder(model_dir, graph_dir=session_graph_dir, max_seq_len=32).encode(TEXTS)
    with HubStandIn() as hub:
        repo = hub.add("org/tiny", read_directory(model_dir))
        repo.revisions["v1"] = repo.commit
        env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}
        flags = ["--model-id", "org/tiny@v1", "--graph-dir", session_graph_dir, "--max-seq-len", "32"]
        http_port = free_port()
        online = start_server(*flags, "--http-port", str(http_port), env=env)
        try:
            assert online.ready_line is not None
            assert f"model org/tiny@v1 (commit {repo.commit})" in online.ready_line
            with BertClient(**online.client_kwargs, timeout=60_000) as client:
                np.testing.assert_allclose(client.encode(TEXTS), expected, rtol=1e-5, atol=1e-6)
                config = client.server_config
            assert (config["model_id"], config["model_revision"], config["model_commit"]) == (
                "org/tiny",
                "v1",
                repo.commit,
            )
            assert config["model_dir"].endswith(f"models--org--tiny/snapshots/{repo.commit}")
            models = httpx.get(f"http://127.0.0.1:{http_port}/v1/models", timeout=30).json()["data"]
            assert [(m["id"], m.get("model_commit")) for m in models] == [("org/tiny", repo.commit)]
        finally:
            online.stop()
        assert any("/resolve/" in path for _, path in hub.requests)  # it did download

        hub.requests.clear()
        offline = start_server(*flags, env={**env, "HF_HUB_OFFLINE": "1"})
        try:
            assert offline.ready_line is not None and f"(commit {repo.commit})" in offline.ready_line
            with BertClient(**offline.client_kwargs, timeout=60_000) as client:
                np.testing.assert_allclose(client.encode(TEXTS), expected, rtol=1e-5, atol=1e-6)
        finally:
            offline.stop()
        assert hub.requests == []  # never touched the network


@pytest.mark.parametrize("argv", [["--model-dir", "/m"], ["--model", "a=/m"]])
def test_a_model_id_goes_alone(argv: list[str], bertserve_main, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = bertserve_main("start", "--model-id", "org/tiny", *argv)
    assert run.returncode == 2
    flag = argv[0]
    assert f"bertserve: error: --model-id and {flag} cannot be given together" in run.stderr


def test_a_worker_host_fetches_the_heads_model_by_its_id(tmp_path: Path, session_graph_dir: str) -> None:
    model_dir = tiny_bert.write_tiny_bert(str(tmp_path / "tiny"), "huggingface", seed=2, sentence_transformers=True)
    expected = Encoder(model_dir, graph_dir=session_graph_dir, max_seq_len=32).encode(TEXTS)
    with HubStandIn() as hub:
        hub.add("org/tiny", read_directory(model_dir))
        head_env = {"HF_HOME": str(tmp_path / "head-hf"), "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}
        worker_port = free_port()
        head = start_server(
            "--model-id",
            "org/tiny",
            "--max-seq-len",
            "32",
            "--num-worker",
            "0",
            "--worker-port",
            str(worker_port),
            "--graph-dir",
            session_graph_dir,
            env=head_env,
        )
        try:
            host_env = {**head_env, "HF_HOME": str(tmp_path / "host-hf")}
            host = start_worker_host(
                worker_port, "--model-id", "org/tiny", "--graph-dir", session_graph_dir, env=host_env
            )
            try:
                with BertClient(**head.client_kwargs, timeout=60_000) as client:
                    np.testing.assert_allclose(client.encode(TEXTS), expected, rtol=1e-5, atol=1e-6)
            finally:
                host.stop()
        finally:
            head.stop()
    assert list((tmp_path / "host-hf").rglob("model.safetensors"))  # its own copy, in its own cache
