"""Every encoder family served end to end: one real server with a model of each family
(``tests/data/families``: tiny random models saved by sentence-transformers), spoken to by
the ZeroMQ client, the official ``openai`` package and ``httpx``. Each answers with what
sentence-transformers computes for it (min cosine 0.99999, fp32), pairs included; its
``/tokenize`` gives the model's own ids, cut on either side; ``dimensions`` keeps the first
ones (at unit length again where the model normalizes); a prompt is the text put before the
input, with each family's tokenizer; ``/v1/models`` lists each with its own width."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from bertserve.server.testing.launcher import free_port, start_server
from served import Served

pytestmark = pytest.mark.timeout(600)
CUT = {"truncate": True}  # long inputs cut, as sentence-transformers cuts them (else a 413)

DATA = Path(__file__).resolve().parent.parent / "data" / "families"
FAMILIES = sorted(p.stem for p in DATA.glob("*.npz")) if DATA.is_dir() else []
KEY = "families-key-0123456789"
PROMPT = "query: "


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / f"{name}.npz") as data:
        return {key: data[key] for key in data.files}


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return float((a * b).sum(-1).min())


@pytest.fixture(scope="module")
def served(session_graph_dir: str) -> Iterator[Served]:
    if not FAMILIES:
        pytest.skip("tests/data/families holds no reference models")
    port = free_port()
    models = [arg for name in FAMILIES for arg in ("--model", f"{name}={DATA / name},dtype=fp32")]
    running = start_server(
        "--http-port",
        str(port),
        "--api-key",
        KEY,
        "--graph-dir",
        session_graph_dir,
        "--max-latency-ms",
        "2",
        "--prompt",
        f"query={PROMPT}",
        *models,
        timeout=60 + 30 * len(FAMILIES),  # each model's graphs are built in turn before its worker starts
    )
    yield Served(running, port, KEY)
    running.stop()


@pytest.mark.parametrize("name", FAMILIES)
def test_zeromq_answers_each_family_as_sentence_transformers_does(served: Served, name: str) -> None:
    ref = reference(name)
    pairs = [f"{a} ||| {b}" for a, b in zip(ref["pairs_first"], ref["pairs_second"], strict=True)]
    with served.client(name) as client:
        vectors = client.encode([str(s) for s in ref["sentences"]])
        paired = client.encode(pairs)
    assert vectors.shape == ref["st_default"].shape
    assert min_cosine(vectors, ref["st_default"]) >= 0.99999
    assert min_cosine(paired, ref["st_pairs"]) >= 0.99999


@pytest.mark.parametrize("name", FAMILIES)
def test_http_answers_each_family_as_sentence_transformers_does(served: Served, name: str) -> None:
    ref = reference(name)
    sentences = [str(s) for s in ref["sentences"]]
    api = openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0)
    answer = api.embeddings.create(model=name, input=sentences[:40], extra_body=CUT)
    vectors = np.array([row.embedding for row in answer.data], dtype=np.float32)
    assert min_cosine(vectors, ref["st_default"][:40]) >= 0.99999
    short = api.embeddings.create(model=name, input=sentences[:8], dimensions=16, extra_body=CUT)
    cut = np.array([row.embedding for row in short.data], dtype=np.float32)
    expected = ref["st_default"][:8, :16]
    if np.allclose(np.linalg.norm(ref["st_default"], axis=1), 1.0, atol=1e-5):  # a model that normalizes
        expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", FAMILIES)
def test_tokenize_gives_the_models_own_ids_cut_on_either_side(served: Served, name: str) -> None:
    ref = reference(name)
    rows = [int(i) for i in np.argsort(-ref["untruncated_lengths"])[:3]] + [0, 1]
    texts = [str(ref["sentences"][i]) for i in rows]
    with served.http() as http:
        for direction, ids, lengths in (("right", "ids", "lengths"), ("left", "ids_left", "lengths_left")):
            body = {"inputs": texts, "model": name, "truncate": True, "truncation_direction": direction}
            answer = http.post("/tokenize", json=body)
            assert answer.status_code == 200, answer.text
            for row, tokens in zip(rows, answer.json(), strict=True):
                assert [t["id"] for t in tokens] == ref[ids][row, : ref[lengths][row]].tolist(), (direction, row)
                text = str(ref["sentences"][row])
                for token in tokens:
                    if not token["special"]:
                        assert text[token["start"] : token["stop"]] == token["text"]


def test_v1_models_lists_each_family_with_its_width(served: Served) -> None:
    with served.http() as http:
        listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    for name in FAMILIES:
        meta = json.loads((DATA / f"{name}.json").read_text())
        assert listed[name]["output_dim"] == reference(name)["st_default"].shape[1]
        assert listed[name]["max_seq_len"] == meta["max_seq_length"]


@pytest.mark.parametrize("name", FAMILIES)
def test_a_prompt_is_its_text_before_the_input(served: Served, name: str) -> None:
    sentences = [str(s) for s in reference(name)["sentences"][:6]]
    api = openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0)
    named = api.embeddings.create(model=name, input=sentences, extra_body={**CUT, "prompt_name": "query"})
    written = api.embeddings.create(model=name, input=[PROMPT + s for s in sentences], extra_body=CUT)
    got = np.array([row.embedding for row in named.data], dtype=np.float32)
    want = np.array([row.embedding for row in written.data], dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    plain = api.embeddings.create(model=name, input=sentences, extra_body=CUT)
    assert min_cosine(got, np.array([row.embedding for row in plain.data], dtype=np.float32)) < 0.99999


ADAPTED = [name for name in FAMILIES if json.loads((DATA / f"{name}.json").read_text()).get("adapters")]


@pytest.mark.parametrize("name", ADAPTED)
def test_each_adapter_is_chosen_by_its_prompt_name_even_among_others_at_once(served: Served, name: str) -> None:
    """jina-embeddings-v3: the prompt named like a task adapter puts its text before the input
    and runs its LoRA adapter, as ``encode(task=...)`` does; requests for different adapters
    sent at once, which the server may batch together, each get their own."""
    ref = reference(name)
    adapters = json.loads((DATA / f"{name}.json").read_text())["adapters"]
    sentences = [str(s) for s in ref["sentences"]]
    answers: dict[int, np.ndarray] = {}

    def ask(index: int) -> None:
        with served.client(name) as client:
            answers[index] = client.encode(sentences, prompt_name=adapters[index])

    threads = [threading.Thread(target=ask, args=(index,)) for index in range(len(adapters))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for index in range(len(adapters)):
        assert min_cosine(answers[index], ref[f"st_adapter_{index}"]) >= 0.99999, adapters[index]
    with served.http() as http:  # TEI's /embed, its prompt_name
        body = {"inputs": sentences[:8], "model": name, "prompt_name": adapters[1], "truncate": True}
        answer = http.post("/embed", json=body)
    assert answer.status_code == 200, answer.text
    assert min_cosine(np.array(answer.json(), dtype=np.float32), ref["st_adapter_1"][:8]) >= 0.99999
