"""Several models behind the HTTP API, end to end: a real server with ``--http-port`` serving
the tiny BERT twice (``a``: mean pooling over 32 tokens; ``b``: its [CLS] token, over 16),
spoken to by the official ``openai`` package and by ``httpx``. Each model's vectors are the
in-process ``Encoder``'s with that model's options; an unknown model is a 404 naming those
served; ``/v1/models`` lists both; ``/tokenize`` runs each model's tokenizer."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import openai
import pytest
from bertserve.client import BertClient
from bertserve.server import Encoder
from bertserve.server.testing.launcher import free_port, start_server
from faulty_model import sentences
from served import Served

pytestmark = pytest.mark.timeout(300)

KEY = "models-key-0123456789"
DIM = 32  # the tiny BERT's hidden size
MAX_LEN = {"a": 32, "b": 16}
TEXTS = sentences(12, seed=21)
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 5)  # 45 words: longer than either model takes


@pytest.fixture(scope="module")
def server(tiny_google: str, session_graph_dir: str) -> Iterator[Served]:
    port = free_port()
    running = start_server(
        "--http-port",
        str(port),
        "--api-key",
        KEY,
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        "32",
        "--max-latency-ms",
        "2",
        "--model",
        f"a={tiny_google}",
        "--model",
        f"b={tiny_google},pooling_strategy=CLS_TOKEN,max_seq_len={MAX_LEN['b']}",
    )
    yield Served(running, port, KEY)
    running.stop()


@pytest.fixture(scope="module")
def expected(tiny_google: str, session_graph_dir: str) -> dict[str, np.ndarray]:
    """Each model's vectors of :data:`TEXTS`, from the in-process ``Encoder`` with its options."""
    a = Encoder(tiny_google, graph_dir=session_graph_dir, max_seq_len=MAX_LEN["a"])
    b = Encoder(tiny_google, graph_dir=session_graph_dir, max_seq_len=MAX_LEN["b"], pooling_strategy="CLS_TOKEN")
    return {"a": a.encode(TEXTS), "b": b.encode(TEXTS)}


def assert_same(got: object, want: np.ndarray) -> None:
    rows = np.asarray(got, dtype=np.float64)
    assert rows.shape == want.shape
    cosine = (rows * want).sum(1) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= 0.99999, cosine.min()


def test_each_model_answers_with_its_own_vectors(server: Served, expected: dict[str, np.ndarray]) -> None:
    assert not np.allclose(expected["a"], expected["b"], atol=1e-3)  # the two models tell apart
    with server.openai() as client:
        for name in ("a", "b"):
            answer = client.embeddings.create(
                model=name, input=TEXTS, encoding_format="float", extra_body={"truncate": True}
            )
            assert answer.model == name
            assert_same([item.embedding for item in answer.data], expected[name])
            packed = client.embeddings.create(
                model=name, input=TEXTS[:3], extra_body={"truncate": True}
            )  # base64, the package's default
            assert_same([item.embedding for item in packed.data], expected[name][:3])
    with server.http() as http:
        default = http.post("/v1/embeddings", json={"input": TEXTS, "truncate": True}).json()
        assert default["model"] == "a"  # the first --model: the default
        assert_same([item["embedding"] for item in default["data"]], expected["a"])
        for name in ("a", "b"):
            embed = http.post("/embed", json={"inputs": TEXTS, "model": name, "truncate": True})  # b: 16 tokens
            assert embed.status_code == 200, embed.text
            assert_same(embed.json(), expected[name])
            legacy = http.post("/encode", json={"id": 1, "texts": TEXTS, "model": name})
            assert legacy.status_code == 200, legacy.text
            assert_same(legacy.json()["result"], expected[name])
    with BertClient(**server.running.client_kwargs, timeout=60_000) as zmq_client:  # the default, over ZeroMQ
        assert_same(zmq_client.encode(TEXTS), expected["a"])


def test_each_model_checks_its_own_limits(server: Served) -> None:
    with server.http() as http:
        assert http.post("/embed", json={"inputs": " ".join(["dog"] * 20), "model": "a"}).status_code == 200
        over = http.post("/embed", json={"inputs": " ".join(["dog"] * 20), "model": "b"})
        assert over.status_code == 413 and "16 tokens the model 'b' takes" in over.json()["error"], over.text
        cut = http.post("/v1/embeddings", json={"input": "hello", "model": "b", "dimensions": 8})
        assert cut.status_code == 200 and len(cut.json()["data"][0]["embedding"]) == 8, cut.text


def test_an_unknown_model_is_404_naming_the_served_ones(server: Served) -> None:
    with server.openai() as client, pytest.raises(openai.NotFoundError) as raised:
        client.embeddings.create(model="gpt-4", input="hello")
    error = raised.value.body
    assert isinstance(error, dict)
    assert {key: error[key] for key in ("type", "param", "code")} == {
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    assert "'gpt-4'" in error["message"] and "'a', 'b'" in error["message"]
    with server.http() as http:
        for path, body in (("/embed", {"inputs": "x"}), ("/tokenize", {"inputs": "x"}), ("/encode", {"texts": ["x"]})):
            answer = http.post(path, json={**body, "model": "gpt-4"})
            assert answer.status_code == 404 and "'a', 'b'" in answer.json()["error"], answer.text


def test_v1_models_lists_both_with_their_dimensions(server: Served) -> None:
    with server.openai() as client:
        listed = client.models.list()
    assert [model.id for model in listed.data] == ["a", "b"]  # the default first
    with server.http() as http:
        data = http.get("/v1/models").json()["data"]
    for entry in data:
        assert entry["output_dim"] == DIM and entry["max_seq_len"] == MAX_LEN[entry["id"]], entry
        assert entry["object"] == "model" and entry["model_version"] is None and entry["prompts"] == {}
        assert isinstance(entry["dtype"], str) and entry["dtype"], entry


def test_tokenize_runs_each_models_tokenizer(server: Served) -> None:
    with server.http() as http:
        whole, cut = {}, {}
        for name in ("a", "b"):
            whole[name] = http.post("/tokenize", json={"inputs": LONG, "model": name}).json()[0]
            cut[name] = http.post("/tokenize", json={"inputs": LONG, "model": name, "truncate": True}).json()[0]
        default = http.post("/tokenize", json={"inputs": LONG, "truncate": True}).json()[0]
    assert whole["a"] == whole["b"] and len(whole["a"]) == 45 + 2  # one vocabulary; nothing cut
    assert [len(cut["a"]), len(cut["b"])] == [MAX_LEN["a"], MAX_LEN["b"]]
    assert default == cut["a"]
    assert cut["b"][:-1] == cut["a"][: MAX_LEN["b"] - 1] and cut["b"][-1]["text"] == "[SEP]"
