"""One server of a reranker, a classifier, a SPLADE model and an embedding model (tiny models
of tests/data/tasks and tests/data/families, fp32), asked through every shape the clients send:
TEI's /rerank, /predict and /embed_sparse (httpx and Haystack's HuggingFaceTEIRanker), Cohere's
/v1/rerank and /v2/rerank (the cohere SDK and LangChain's CohereRerank), Infinity's /rerank, the
ZeroMQ clients and ``bertserve rerank``, and gRPC in TEI's ``tei.v1`` through stubs generated
from TEI's own ``tei.proto`` (every method: the HTTP API's answer bit for bit, a stream each
message's answer in order; health per model, reflection). Each answer is what
sentence-transformers computes (the references of tests/data/tasks), a request to a model of
another task is a 400 (gRPC: FAILED_PRECONDITION) that names the model's task, bad input is a
4xx (INVALID_ARGUMENT) that names the field, and pairs of concurrent requests merged into one
model run never cross."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from bertserve.client import AsyncBertClient, tasks as t
from bertserve.client.errors import ServerError
from bertserve.client.protocol import PAIR_SEPARATOR
from bertserve.server.testing.launcher import free_port, start_server
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from served import Served
from tei_stubs import tei_stubs

pytestmark = pytest.mark.timeout(600)

DATA = Path(__file__).resolve().parent.parent / "data"
KEY = "tasks-key-0123456789"
RERANKER, CLASSIFIER, SPLADE, EMBEDDER = "rerank_bert", "classify_bert", "splade_bert", "roberta"
TOKENS = "tokens"  # the embedder served with pooling NONE
pb, services = tei_stubs()
YES_NO = "rerank_qwen3"  # Qwen3-Reranker: a causal LM's yes/no logits on its own template


def reference(name: str) -> dict[str, np.ndarray]:
    folder = "families" if name == EMBEDDER else "tasks"
    with np.load(DATA / folder / f"{name}.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def served(session_graph_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    calibration = tmp_path_factory.mktemp("calibration") / "calibration.json"
    ranges = reference("quantize")["ranges"]
    calibration.write_text(json.dumps({"format": 1, "min": ranges[0].tolist(), "max": ranges[1].tolist()}))
    models = {
        RERANKER: DATA / "tasks" / RERANKER,
        YES_NO: DATA / "tasks" / YES_NO,
        CLASSIFIER: DATA / "tasks" / CLASSIFIER,
        SPLADE: DATA / "tasks" / SPLADE,
        EMBEDDER: f"{DATA / 'families' / EMBEDDER},calibration={calibration}",
        "plain": DATA / "families" / "mpnet",
        "tokens": f"{DATA / 'families' / EMBEDDER},pooling_strategy=NONE",
    }
    port, grpc_port = free_port(), free_port()
    flags = [arg for name, where in models.items() for arg in ("--model", f"{name}={where},dtype=fp32")]
    running = start_server(
        *("--http-port", str(port), "--grpc-port", str(grpc_port), "--api-key", KEY),
        *("--graph-dir", session_graph_dir, "--max-latency-ms", "2", *flags),
    )
    served = Served(running, port, KEY, grpc_port)
    yield served
    served.stop()


def documents(ref: dict[str, np.ndarray]) -> list[str]:
    return [str(d) for d in ref["documents"]]


# -- rerank -----------------------------------------------------------------------------


def test_tei_rerank_ranks_as_cross_encoder(served: Served) -> None:
    ref = reference(RERANKER)
    with served.http() as http:
        for q, query in enumerate(ref["queries"]):
            body = {"model": RERANKER, "query": str(query), "texts": documents(ref), "return_text": True}
            answer = http.post("/rerank", json=body)
            assert answer.status_code == 200, answer.text
            results = answer.json()
            assert [r["index"] for r in results] == ref["rank"][q].tolist()
            np.testing.assert_allclose([r["score"] for r in results], ref["scores"][q][ref["rank"][q]], atol=1e-4)
            assert [r["text"] for r in results] == [documents(ref)[i] for i in ref["rank"][q]]
            assert [r["truncated"] for r in results] == [bool(ref["truncated"][q][i]) for i in ref["rank"][q]]
        raw = http.post("/rerank", json={**body, "raw_scores": True, "top_n": 3}).json()
        assert [r["index"] for r in raw] == ref["rank"][-1][:3].tolist()
        np.testing.assert_allclose([r["score"] for r in raw], ref["logits"][-1][ref["rank"][-1][:3]], atol=1e-4)


def test_cohere_sdk_v1_and_v2_rank_as_cross_encoder(served: Served) -> None:
    cohere = pytest.importorskip("cohere")
    ref = reference(RERANKER)
    query, docs = str(ref["queries"][1]), documents(ref)
    v2 = cohere.ClientV2(api_key=KEY, base_url=served.url).rerank(model=RERANKER, query=query, documents=docs, top_n=5)
    assert [r.index for r in v2.results] == ref["rank"][1][:5].tolist()
    np.testing.assert_allclose([r.relevance_score for r in v2.results], ref["scores"][1][ref["rank"][1][:5]], atol=1e-4)
    v1 = cohere.Client(api_key=KEY, base_url=served.url).rerank(
        model=RERANKER, query=query, documents=docs, return_documents=True
    )
    assert [r.index for r in v1.results] == ref["rank"][1].tolist()
    assert v1.results[0].document.text == docs[ref["rank"][1][0]]


def test_langchain_cohere_rerank_ranks_as_cross_encoder(served: Served) -> None:
    langchain_cohere = pytest.importorskip("langchain_cohere")
    from langchain_core.documents import Document

    ref = reference(RERANKER)
    reranker = langchain_cohere.CohereRerank(model=RERANKER, base_url=served.url, cohere_api_key=KEY, top_n=4)
    kept = reranker.compress_documents([Document(page_content=d) for d in documents(ref)], str(ref["queries"][2]))
    assert [d.page_content for d in kept] == [documents(ref)[i] for i in ref["rank"][2][:4]]
    np.testing.assert_allclose(
        [d.metadata["relevance_score"] for d in kept], ref["scores"][2][ref["rank"][2][:4]], atol=1e-4
    )


def test_haystack_tei_ranker_ranks_as_cross_encoder(served: Served) -> None:
    rankers = pytest.importorskip("haystack_integrations.components.rankers.huggingface_api")
    from haystack import Document
    from haystack.utils import Secret

    ref = reference(RERANKER)
    ranker = rankers.HuggingFaceTEIRanker(url=served.url, top_k=3, token=Secret.from_token(KEY))
    # a TEI server serves one model: the ranker names none, and gets the default one, the first --model
    out = ranker.run(query=str(ref["queries"][3]), documents=[Document(content=d) for d in documents(ref)])
    assert [d.content for d in out["documents"]] == [documents(ref)[i] for i in ref["rank"][3][:3]]


def test_infinity_shape_of_rerank(served: Served) -> None:
    ref = reference(RERANKER)
    body = {"model": RERANKER, "query": str(ref["queries"][0]), "documents": documents(ref), "return_documents": True}
    with served.http() as http:
        answer = http.post("/rerank", json=body).json()
    assert [r["index"] for r in answer["results"]] == ref["rank"][0].tolist()
    assert answer["results"][0]["document"] == documents(ref)[ref["rank"][0][0]]
    assert answer["usage"]["total_tokens"] > 0 and answer["model"] == RERANKER


def test_zeromq_clients_rerank_as_cross_encoder(served: Served) -> None:
    ref = reference(RERANKER)
    with served.client(RERANKER) as client:
        ranked = client.rerank(str(ref["queries"][4]), documents(ref), return_documents=True)
    assert [r.index for r in ranked] == ref["rank"][4].tolist()
    np.testing.assert_allclose([r.score for r in ranked], ref["scores"][4][ref["rank"][4]], atol=1e-4)

    async def asked() -> list[t.Ranked]:
        async with AsyncBertClient(
            port=served.running.port, port_out=served.running.port_out, model=RERANKER, timeout=120_000
        ) as client:
            return await client.rerank(str(ref["queries"][4]), documents(ref), top_n=2, raw_scores=True)

    top = asyncio.run(asked())
    assert [r.index for r in top] == ref["rank"][4][:2].tolist()
    np.testing.assert_allclose([r.score for r in top], ref["logits"][4][ref["rank"][4][:2]], atol=1e-4)


def test_concurrent_reranks_merged_in_one_run_never_cross(served: Served) -> None:
    """Requests of many queries at once are batched together; each still gets its own ranking."""
    ref = reference(RERANKER)

    def rank(q: int) -> list[int]:
        with served.client(RERANKER) as client:
            return [r.index for r in client.rerank(str(ref["queries"][q % 5]), documents(ref))]

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(rank, range(40)))
    for q, answer in enumerate(answers):
        assert answer == ref["rank"][q % 5].tolist(), q


def test_bertserve_rerank_prints_the_ranking(served: Served, tmp_path: Path) -> None:
    ref = reference(RERANKER)
    lines = tmp_path / "docs.txt"
    lines.write_text("\n".join(documents(ref)[:6]) + "\n\n", encoding="utf-8")
    cli = [sys.executable, "-m", "bertserve.server.cli", "rerank", str(ref["queries"][0]), str(lines)]
    port_flags = ["--port", str(served.running.port), "--port-out", str(served.running.port_out)]
    done = subprocess.run(
        [*cli, *port_flags, "--model", RERANKER, "--json"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    want = t.ranking(ref["scores"][0][:6])
    assert [row["index"] for row in rows] == want
    assert [row["line"] for row in rows] == [i + 1 for i in want]


def test_a_yes_no_reranker_answers_every_rerank_shape_as_its_published_scoring(served: Served, tmp_path: Path) -> None:
    """Qwen3-Reranker, served with no task named (a Qwen3 causal LM without sentence-transformers
    modules is a reranker): TEI's /rerank, Cohere's v2, the ZeroMQ client and ``bertserve rerank``
    give the scores of its model card's formula, cut pairs said to be truncated."""
    cohere = pytest.importorskip("cohere")
    ref = reference(YES_NO)
    docs = documents(ref)
    with served.http() as http:
        for q, query in enumerate(ref["queries"]):
            answer = http.post("/rerank", json={"model": YES_NO, "query": str(query), "texts": docs})
            assert answer.status_code == 200, answer.text
            results = answer.json()
            assert [r["index"] for r in results] == ref["rank"][q].tolist()
            np.testing.assert_allclose([r["score"] for r in results], ref["scores"][q][ref["rank"][q]], atol=1e-4)
            assert [r["truncated"] for r in results] == [bool(ref["truncated"][q][i]) for i in ref["rank"][q]]
    v2 = cohere.ClientV2(api_key=KEY, base_url=served.url).rerank(
        model=YES_NO, query=str(ref["queries"][1]), documents=docs, top_n=5
    )
    assert [r.index for r in v2.results] == ref["rank"][1][:5].tolist()
    with served.client(YES_NO) as client:
        ranked = client.rerank(str(ref["queries"][3]), docs, raw_scores=True)
    np.testing.assert_allclose([r.score for r in ranked], ref["logits"][3][ref["rank"][3]], atol=1e-4)
    lines = tmp_path / "docs.txt"
    lines.write_text("\n".join(docs[:6]) + "\n", encoding="utf-8")
    cli = [sys.executable, "-m", "bertserve.server.cli", "rerank", str(ref["queries"][0]), str(lines), "--json"]
    port_flags = ["--port", str(served.running.port), "--port-out", str(served.running.port_out)]
    done = subprocess.run([*cli, *port_flags, "--model", YES_NO], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [row["index"] for row in json.loads(done.stdout)] == t.ranking(ref["scores"][0][:6])


# -- predict and sparse -----------------------------------------------------------------


def test_predict_gives_cross_encoders_probabilities_and_labels(served: Served) -> None:
    ref = reference(CLASSIFIER)
    texts = [str(x) for x in ref["texts"]]
    asked = {"model": CLASSIFIER, "truncate": True}  # as CrossEncoder cuts them (TEI's default refuses)
    with served.http() as http:
        batch = http.post("/predict", json={**asked, "inputs": [[x] for x in texts]})
        one = http.post("/predict", json={**asked, "inputs": texts[0]}).json()
        pair = [str(ref["pairs_first"][0]), str(ref["pairs_second"][0])]
        paired = http.post("/predict", json={**asked, "inputs": pair}).json()
        raw = http.post("/predict", json={**asked, "inputs": [[texts[0]], [texts[1]]], "raw_scores": True}).json()
        refused = http.post("/predict", json={"model": CLASSIFIER, "inputs": [[x] for x in texts]})
    assert refused.status_code == 413 and "truncate=true" in refused.text
    assert batch.status_code == 200, batch.text
    labels = ["negative", "neutral", "positive"]
    for row, probs, label in zip(batch.json(), ref["probs"], ref["labels"], strict=True):
        assert row[0]["label"] == str(label)
        got = {item["label"]: item["score"] for item in row}
        np.testing.assert_allclose([got[name] for name in labels], probs, atol=1e-5)
    assert [i["label"] for i in one] == [i["label"] for i in batch.json()[0]]
    np.testing.assert_allclose([i["score"] for i in one], [i["score"] for i in batch.json()[0]], atol=1e-5)
    assert {item["label"]: item["score"] for item in paired} == pytest.approx(
        dict(zip(labels, ref["pair_probs"][0].tolist(), strict=True)), abs=1e-5
    )
    assert len(raw) == 2 and {i["label"]: i["score"] for i in raw[0]} == pytest.approx(
        dict(zip(labels, ref["logits"][0].tolist(), strict=True)), abs=1e-4
    )
    with served.client(CLASSIFIER) as client:
        predicted = client.predict(texts[:5])
    assert [row[0].label for row in predicted] == [str(x) for x in ref["labels"][:5]]


def test_embed_sparse_gives_the_terms_of_sparse_encoder(served: Served) -> None:
    ref = reference(SPLADE)
    texts = [str(x) for x in ref["texts"]]
    with served.http() as http:
        answer = http.post("/embed_sparse", json={"model": SPLADE, "inputs": texts, "truncate": True})
        top = http.post("/embed_sparse", json={"model": SPLADE, "inputs": texts[:3], "top_k": 5, "truncate": True})
        refused = http.post("/embed_sparse", json={"model": SPLADE, "inputs": texts})
    assert refused.status_code == 413 and "chunk" not in refused.text
    assert answer.status_code == 200, answer.text
    for row, want in zip(answer.json(), t.sparse_rows(ref["dense"]), strict=True):
        assert [term["index"] for term in row] == want.indices.tolist()
        np.testing.assert_allclose([term["value"] for term in row], want.values, rtol=1e-4, atol=5e-6)
    for row, want in zip(top.json(), t.sparse_rows(ref["dense"][:3], top_k=5), strict=True):
        assert [term["index"] for term in row] == want.indices.tolist()
    with served.client(SPLADE) as client:
        vectors = client.encode_sparse(texts[:3])
    assert [v.indices.tolist() for v in vectors] == [w.indices.tolist() for w in t.sparse_rows(ref["dense"][:3])]


def test_embed_all_answers_each_inputs_token_vectors(served: Served) -> None:
    ref = reference(EMBEDDER)  # tokens_last: the last layer's token vectors of the first 8 sentences
    texts = [str(x) for x in ref["sentences"][: len(ref["tokens_last"])]]
    with served.http() as http:
        answer = http.post("/embed_all", json={"model": "tokens", "inputs": texts, "truncate": True})
        tokens = http.post("/tokenize", json={"model": "tokens", "inputs": texts, "truncate": True}).json()
        pooled = http.post("/embed_all", json={"model": EMBEDDER, "inputs": texts})
    assert answer.status_code == 200, answer.text
    for i, rows in enumerate(answer.json()):
        assert len(rows) == len(tokens[i]) == ref["lengths"][i]
        want = ref["tokens_last"][i][: len(rows)]  # normalized per token, as the model's Normalize module does
        want = want / np.linalg.norm(want, axis=1, keepdims=True)
        np.testing.assert_allclose(rows, want, atol=1e-5)
    assert pooled.status_code == 422 and "pooling_strategy=NONE" in pooled.text


def test_async_client_predicts_and_encodes_sparse(served: Served) -> None:
    classes, splade = reference(CLASSIFIER), reference(SPLADE)

    async def asked() -> tuple[list, list]:
        async with AsyncBertClient(
            port=served.running.port, port_out=served.running.port_out, timeout=120_000
        ) as client:
            labels = await client.predict([str(x) for x in classes["texts"][:4]], model=CLASSIFIER)
            terms = await client.encode_sparse([str(x) for x in splade["texts"][:4]], model=SPLADE, top_k=3)
            return labels, terms

    labels, terms = asyncio.run(asked())
    assert [row[0].label for row in labels] == [str(x) for x in classes["labels"][:4]]
    assert [v.indices.tolist() for v in terms] == [w.indices.tolist() for w in t.sparse_rows(splade["dense"][:4], 3)]


# -- compact embeddings -------------------------------------------------------------------


def test_embedding_types_are_sentence_transformers_quantize(served: Served) -> None:
    ref = reference("quantize")
    texts = [str(x) for x in reference(EMBEDDER)["sentences"]]
    inside = ((ref["float"] >= ref["ranges"][0]) & (ref["float"] <= ref["ranges"][1])).all(axis=1)
    with served.http() as http:
        asked = {"model": EMBEDDER, "inputs": texts, "truncate": True}
        binary = http.post("/embed", json={**asked, "embedding_types": "ubinary"}).json()
        several = http.post("/embed", json={**asked, "embedding_types": ["binary", "int8", "uint8", "float"]}).json()
        openai_shape = http.post(
            "/v1/embeddings",
            json={"model": EMBEDDER, "input": texts[:4], "embedding_types": ["int8", "float"], "truncate": True},
        ).json()
    np.testing.assert_array_equal(np.array(binary, np.uint8), ref["ubinary"])
    np.testing.assert_array_equal(np.array(several["binary"], np.int8), ref["binary"])
    floats = np.array(several["float"], np.float32)
    for kind in ("int8", "uint8"):
        got = np.array(several[kind])
        np.testing.assert_array_equal(
            got, t.quantize(floats, kind, ref["ranges"]).astype(int)
        )  # quantize_embeddings' steps
        # and within a step of sentence-transformers' own (a float a hair off a step's edge lands on its other side)
        assert np.abs(got[inside] - ref[kind][inside].astype(int)).max() <= 1
    first = openai_shape["data"][0]
    assert first["embedding"] == first["embeddings"]["int8"] == several["int8"][0]
    with served.client(EMBEDDER) as client:
        np.testing.assert_array_equal(client.encode(texts, output="binary"), ref["binary"])


def test_int8_without_calibration_says_how_to_make_one(served: Served) -> None:
    with served.http() as http:
        answer = http.post("/embed", json={"model": "plain", "inputs": ["a"], "embedding_types": ["int8"]})
    assert answer.status_code == 422 and "bertserve calibrate" in answer.json()["error"]
    with served.client("plain") as client, pytest.raises(ValueError, match="bertserve calibrate"):
        client.encode(["a"], output="uint8")


# -- tasks kept apart, and bad input -------------------------------------------------------


def test_a_request_to_a_model_of_another_task_names_its_task(served: Served) -> None:
    with served.http() as http:
        embed = http.post("/v1/embeddings", json={"model": RERANKER, "input": ["a"]})
        rerank = http.post("/rerank", json={"model": EMBEDDER, "query": "a", "texts": ["b"]})
        predict = http.post("/predict", json={"model": RERANKER, "inputs": "a"})
        sparse = http.post("/v2/rerank", json={"model": SPLADE, "query": "a", "documents": ["b"]})
        listed = {m["id"]: m["task"] for m in http.get("/v1/models").json()["data"]}
    assert embed.status_code == 400 and "task rerank" in embed.json()["error"]["message"]
    assert rerank.status_code == 400 and "task embed" in rerank.json()["error"]
    assert predict.status_code == 400 and "task rerank" in predict.json()["error"]
    assert sparse.status_code == 400 and "task sparse" in sparse.json()["message"]
    assert listed == {
        RERANKER: "rerank",
        YES_NO: "rerank",
        CLASSIFIER: "classify",
        SPLADE: "sparse",
        EMBEDDER: "embed",
        "plain": "embed",
        "tokens": "embed",
    }
    with served.client(RERANKER) as client, pytest.raises(ServerError, match="task rerank") as caught:
        client.encode(["a"])
    assert caught.value.kind == "task"
    with served.client(EMBEDDER) as client, pytest.raises(ValueError, match="does the task embed"):
        client.rerank("a", ["b"])


@pytest.mark.parametrize(
    ("path", "body", "status", "names"),
    [
        ("/rerank", {"query": "", "texts": ["a"]}, 422, "query is empty"),
        ("/rerank", {"query": "q", "texts": []}, 422, "texts is empty"),
        ("/rerank", {"query": "q", "texts": ["a", 3]}, 422, "texts[1] must be a string"),
        ("/rerank", {"query": "q", "texts": "a"}, 422, "texts must be a list"),
        ("/rerank", {"query": "q", "texts": ["a"], "top_n": 0}, 422, "top_n"),
        ("/rerank", {"query": "q"}, 422, "texts"),
        ("/v2/rerank", {"query": "q", "documents": []}, 422, "documents is empty"),
        ("/v2/rerank", {"query": ["q"], "documents": ["a"]}, 422, "query must be a string"),
        ("/v1/rerank", {"query": "q", "documents": [{"title": "a"}]}, 422, "documents[0] must be a string"),
        ("/predict", {"inputs": []}, 422, "inputs"),
        ("/predict", {"inputs": [["a", "b", "c"]]}, 422, "inputs[0]"),
        ("/embed_sparse", {"inputs": ["a"], "top_k": -1}, 422, "top_k"),
        ("/embed", {"inputs": ["a"], "embedding_types": ["int4"]}, 422, "int4"),
        ("/v1/embeddings", {"input": ["a"], "embedding_types": "float16"}, 422, "float16"),
    ],
)
def test_bad_input_is_a_4xx_that_names_it(served: Served, path: str, body: dict, status: int, names: str) -> None:
    model = {"/predict": CLASSIFIER, "/embed_sparse": SPLADE, "/embed": EMBEDDER, "/v1/embeddings": EMBEDDER}
    with served.http() as http:
        answer = http.post(path, json={"model": model.get(path, RERANKER), **body})
    assert answer.status_code == status, answer.text
    assert names in answer.text


def test_pairs_over_the_length_are_cut_or_refused(served: Served) -> None:
    ref = reference(RERANKER)
    long = next(i for i in range(len(ref["documents"])) if ref["truncated"][0][i])
    body = {"model": RERANKER, "query": str(ref["queries"][0]), "texts": [documents(ref)[long]]}
    with served.http() as http:
        refused = http.post("/rerank", json={**body, "truncate": False})
        cut = http.post("/rerank", json=body).json()
        cohere = http.post("/v2/rerank", json={"model": RERANKER, "query": body["query"], "documents": body["texts"]})
    assert refused.status_code == 413 and "texts[0]" in refused.json()["error"]
    assert cut[0]["truncated"] is True
    np.testing.assert_allclose(cut[0]["score"], ref["scores"][0][long], atol=1e-4)
    assert cohere.json()["results"][0]["truncated"] is True


def test_a_pair_cut_and_one_not_in_one_request_say_so_over_http_and_zeromq(served: Served) -> None:
    """The workers say which pairs they cut, with the scores: in one request, a pair the model
    cuts (the reference's, and one past a long document's first cut) and one it does not, over
    TEI's, Infinity's and Cohere's shapes and over ZeroMQ (the reply's ``truncated``)."""
    ref = reference(RERANKER)
    query, flags = str(ref["queries"][0]), ref["truncated"][0]
    cut, whole = int(np.argmax(flags)), int(np.argmin(flags))
    assert flags[cut] and not flags[whole]
    very_long = " ".join(f"word{i}" for i in range(3000))  # cut here, before it is sent
    docs = [documents(ref)[whole], documents(ref)[cut], very_long]
    want = {0: False, 1: True, 2: True}
    with served.http() as http:
        tei = http.post("/rerank", json={"model": RERANKER, "query": query, "texts": docs})
        infinity = http.post("/rerank", json={"model": RERANKER, "query": query, "documents": docs})
        cohere = http.post("/v2/rerank", json={"model": RERANKER, "query": query, "documents": docs})
    assert {r["index"]: r["truncated"] for r in tei.json()} == want, tei.text
    assert {r["index"]: r["truncated"] for r in infinity.json()["results"]} == want, infinity.text
    assert {r["index"]: r["truncated"] for r in cohere.json()["results"]} == want, cohere.text
    scores = {r["index"]: r["score"] for r in tei.json()}
    np.testing.assert_allclose([scores[0], scores[1]], ref["scores"][0][[whole, cut]], atol=1e-4)
    with served.client(RERANKER) as client:
        ranked = client.rerank(query, docs)
        assert client.last_info["truncated"] == [1, 2]
        client.rerank(query, docs[:1])
        assert client.last_info["truncated"] == []
    np.testing.assert_allclose(sorted(r.score for r in ranked), sorted(scores.values()), atol=1e-4)


def test_ten_thousand_documents_are_one_request(served: Served) -> None:
    ref = reference(RERANKER)
    many = [documents(ref)[i % 24] for i in range(10_000)]
    with served.http() as http:
        answer = http.post("/v2/rerank", json={"model": RERANKER, "query": str(ref["queries"][0]), "documents": many})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert len(results) == 10_000 and sorted(r["index"] for r in results) == list(range(10_000))
    scores = {r["index"]: r["relevance_score"] for r in results}
    np.testing.assert_allclose([scores[i] for i in range(24)], ref["scores"][0], atol=1e-4)


def test_every_post_route_the_api_describes_needs_the_key(served: Served) -> None:
    """TEI's root, /invocations and /similarity among them: the routes are read from the
    server's own OpenAPI description, so a route added later is held to the key too."""
    import httpx

    with httpx.Client(base_url=served.url, timeout=30) as anonymous:
        paths = anonymous.get("/openapi.json").json()["paths"]
        posts = sorted(path for path, methods in paths.items() if "post" in methods)
        assert {"/", "/invocations", "/similarity", "/embed", "/rerank"} <= set(posts)
        for path in posts:
            for headers in ({}, {"Authorization": "Bearer not-the-key-0123456789"}):
                answer = anonymous.post(path, json={"inputs": "x", "query": "q", "texts": ["a"]}, headers=headers)
                assert answer.status_code == 401, (path, headers, answer.text)


# -- gRPC: TEI's tei.v1, through stubs generated from TEI's own tei.proto (tests/tei_stubs.py) --

TEXTS = [
    "a tiny model reads this",
    "and this one is a little longer than the first",
    "short",
    "ünïcödé text ✓",
    "a ||| b",
]


def _http(served: Served, path: str, body: dict[str, Any]) -> Any:
    with served.http() as http:
        answer = http.post(path, json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()


def test_info_describes_each_model(served: Served) -> None:
    info = services.InfoStub(served.channel)
    kinds = {EMBEDDER: "MODEL_TYPE_EMBEDDING", RERANKER: "MODEL_TYPE_RERANKER", CLASSIFIER: "MODEL_TYPE_CLASSIFIER"}
    for name, kind in kinds.items():
        answer = info.Info(pb.InfoRequest(), metadata=served.metadata(name))
        assert (answer.model_id, pb.ModelType.Name(answer.model_type)) == (name, kind)
        assert answer.model_dtype == "fp32" and answer.max_input_length > 0 and answer.version


def test_embed_is_the_http_answer_bit_for_bit(served: Served) -> None:
    embed = services.EmbedStub(served.channel)
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({}, {}),
        ({"normalize": False}, {"normalize": False}),
        ({"dimensions": 8}, {"dimensions": 8}),
        (
            {"truncate": True, "truncation_direction": pb.TRUNCATION_DIRECTION_LEFT},
            {"truncate": True, "truncation_direction": "Left"},
        ),
    ]
    for asked, body in cases:
        for text in [*TEXTS, " ".join(["long"] * 300)] if asked.get("truncate") else TEXTS:
            answer = embed.Embed(pb.EmbedRequest(inputs=text, **asked), metadata=served.metadata(EMBEDDER))
            expected = np.asarray(_http(served, "/embed", {"inputs": text, "model": EMBEDDER, **body})[0], np.float32)
            np.testing.assert_array_equal(np.asarray(answer.embeddings, np.float32), expected)
            assert answer.metadata.compute_chars == len(text) and answer.metadata.compute_tokens > 0
    # without the metadata, the default model of the embed task
    default = embed.Embed(pb.EmbedRequest(inputs=TEXTS[0]), metadata=served.metadata())
    assert len(default.embeddings) == len(_http(served, "/embed", {"inputs": TEXTS[0], "model": EMBEDDER})[0])


def test_a_stream_answers_each_message_in_order(served: Served) -> None:
    embed = services.EmbedStub(served.channel)
    texts = [f"message number {i} of the stream" for i in range(600)]
    answers = list(
        embed.EmbedStream(iter(pb.EmbedRequest(inputs=t) for t in texts), metadata=served.metadata(EMBEDDER))
    )
    assert len(answers) == len(texts)
    alone = np.asarray(_http(served, "/embed", {"inputs": texts, "model": EMBEDDER}), np.float32)
    # messages go to the head in groups as they arrive: a group's shape may move the last bits only
    np.testing.assert_allclose(np.asarray([a.embeddings for a in answers], np.float32), alone, atol=1e-6)
    assert [a.metadata.compute_chars for a in answers] == [len(t) for t in texts]
    tokens = [a.metadata.compute_tokens for a in answers]
    assert all(n > 2 for n in tokens) and tokens[0] < tokens[-1] + 2


def test_sparse_and_token_vectors_are_the_http_answers(served: Served) -> None:
    embed = services.EmbedStub(served.channel)
    for text in TEXTS:
        sparse = embed.EmbedSparse(pb.EmbedSparseRequest(inputs=text), metadata=served.metadata(SPLADE))
        expected = _http(served, "/embed_sparse", {"inputs": text, "model": SPLADE})[0]
        assert [v.index for v in sparse.sparse_embeddings] == [e["index"] for e in expected]
        assert [v.value for v in sparse.sparse_embeddings] == [np.float32(e["value"]) for e in expected]
        tokens = embed.EmbedAll(pb.EmbedAllRequest(inputs=text), metadata=served.metadata(TOKENS))
        rows = np.asarray([t.embeddings for t in tokens.token_embeddings], np.float32)
        np.testing.assert_array_equal(
            rows, np.asarray(_http(served, "/embed_all", {"inputs": text, "model": TOKENS})[0], np.float32)
        )
    streamed = list(
        embed.EmbedSparseStream(iter(pb.EmbedSparseRequest(inputs=t) for t in TEXTS), metadata=served.metadata(SPLADE))
    )
    assert [len(s.sparse_embeddings) for s in streamed] == [
        len(e) for e in _http(served, "/embed_sparse", {"inputs": TEXTS, "model": SPLADE})
    ]
    every = list(
        embed.EmbedAllStream(iter(pb.EmbedAllRequest(inputs=t) for t in TEXTS), metadata=served.metadata(TOKENS))
    )
    assert [len(e.token_embeddings) for e in every] == [
        len(rows) for rows in _http(served, "/embed_all", {"inputs": TEXTS, "model": TOKENS})
    ]


def test_predict_is_the_http_answer(served: Served) -> None:
    predict = services.PredictStub(served.channel)
    for raw in (False, True):
        for text in TEXTS:
            answer = predict.Predict(
                pb.PredictRequest(inputs=text, raw_scores=raw), metadata=served.metadata(CLASSIFIER)
            )
            expected = _http(served, "/predict", {"inputs": text, "model": CLASSIFIER, "raw_scores": raw})
            assert [(p.label, p.score) for p in answer.predictions] == [
                (e["label"], np.float32(e["score"])) for e in expected
            ]
        pair = predict.PredictPair(pb.PredictPairRequest(inputs=TEXTS[:2], raw_scores=raw), metadata=served.metadata())
        expected = _http(served, "/predict", {"inputs": TEXTS[:2], "model": CLASSIFIER, "raw_scores": raw})
        assert [(p.label, p.score) for p in pair.predictions] == [
            (e["label"], np.float32(e["score"])) for e in expected
        ]
    streamed = list(predict.PredictStream(iter(pb.PredictRequest(inputs=t) for t in TEXTS), metadata=served.metadata()))
    alone = [predict.Predict(pb.PredictRequest(inputs=t), metadata=served.metadata()) for t in TEXTS]
    assert [[p.label for p in s.predictions] for s in streamed] == [[p.label for p in a.predictions] for a in alone]
    pairs = list(
        predict.PredictPairStream(
            iter(pb.PredictPairRequest(inputs=[t, "x"]) for t in TEXTS), metadata=served.metadata()
        )
    )
    assert len(pairs) == len(TEXTS) and all(len(p.predictions) == len(alone[0].predictions) for p in pairs)


def test_rerank_ranks_as_the_cross_encoder_and_as_http(served: Served) -> None:
    rerank = services.RerankStub(served.channel)
    ref = reference(RERANKER)
    docs = [str(d) for d in ref["documents"]]
    for q, query in enumerate(ref["queries"]):
        answer = rerank.Rerank(
            pb.RerankRequest(query=str(query), texts=docs, return_text=True), metadata=served.metadata(RERANKER)
        )
        assert [r.index for r in answer.ranks] == ref["rank"][q].tolist()
        np.testing.assert_allclose([r.score for r in answer.ranks], ref["scores"][q][ref["rank"][q]], atol=1e-4)
        assert [r.text for r in answer.ranks] == [docs[i] for i in ref["rank"][q]]
        expected = _http(served, "/rerank", {"query": str(query), "texts": docs, "model": RERANKER})
        assert [(r.index, r.score) for r in answer.ranks] == [(e["index"], np.float32(e["score"])) for e in expected]
    raw = rerank.Rerank(
        pb.RerankRequest(query=str(ref["queries"][0]), texts=docs, raw_scores=True), metadata=served.metadata()
    )
    np.testing.assert_allclose([r.score for r in raw.ranks][:3], ref["logits"][0][ref["rank"][0][:3]], atol=1e-4)
    assert not any(r.HasField("text") for r in raw.ranks)
    pairs = [pb.RerankStreamRequest(query=str(ref["queries"][1]), text=d) for d in docs]
    streamed = rerank.RerankStream(iter(pairs), metadata=served.metadata(RERANKER))
    assert [r.index for r in streamed.ranks] == ref["rank"][1].tolist()


def test_tokenize_and_decode_are_the_models_tokenizer(served: Served) -> None:
    from tokenizers import Tokenizer

    reader = Tokenizer.from_file(str(DATA / "families" / EMBEDDER / "tokenizer.json"))
    tokenize = services.TokenizeStub(served.channel)
    for text in TEXTS:
        answer = tokenize.Tokenize(
            pb.EncodeRequest(inputs=text, add_special_tokens=True), metadata=served.metadata(EMBEDDER)
        )
        expected = _http(served, "/tokenize", {"inputs": text, "model": EMBEDDER})[0]
        assert [(t.id, t.text, t.special) for t in answer.tokens] == [
            (e["id"], e["text"], e["special"]) for e in expected
        ]
        assert [t.start if t.HasField("start") else None for t in answer.tokens] == [e["start"] for e in expected]
        ids = [t.id for t in answer.tokens]
        decoded = tokenize.Decode(
            pb.DecodeRequest(ids=ids, skip_special_tokens=True), metadata=served.metadata(EMBEDDER)
        )
        assert decoded.text == reader.decode(ids, skip_special_tokens=True)
        if PAIR_SEPARATOR not in text:  # a text's ||| is read as one sentence, as /tokenize reads it
            assert decoded.text.strip() == text  # a byte-level BPE gives back the text it read
    streamed = list(
        tokenize.TokenizeStream(iter(pb.EncodeRequest(inputs=t) for t in TEXTS), metadata=served.metadata(EMBEDDER))
    )
    assert len(streamed) == len(TEXTS)
    back = list(
        tokenize.DecodeStream(
            iter(pb.DecodeRequest(ids=[t.id for t in s.tokens]) for s in streamed), metadata=served.metadata(EMBEDDER)
        )
    )
    assert len(back) == len(TEXTS)
    with pytest.raises(grpc.RpcError) as past:
        tokenize.Decode(pb.DecodeRequest(ids=[1, 10**9]), metadata=served.metadata(EMBEDDER))
    assert past.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "ids[1]" in past.value.details()


def test_each_error_has_its_status_and_names_the_field(served: Served) -> None:
    embed, rerank = services.EmbedStub(served.channel), services.RerankStub(served.channel)
    cases = [
        (
            lambda: embed.Embed(pb.EmbedRequest(inputs=""), metadata=served.metadata(EMBEDDER)),
            "INVALID_ARGUMENT",
            "inputs",
        ),
        (lambda: embed.Embed(pb.EmbedRequest(inputs="x"), metadata=served.metadata("nope")), "NOT_FOUND", "nope"),
        (
            lambda: rerank.Rerank(pb.RerankRequest(query="q", texts=["a"]), metadata=served.metadata(EMBEDDER)),
            "FAILED_PRECONDITION",
            "rerank",
        ),
        (
            lambda: embed.Embed(pb.EmbedRequest(inputs="x", dimensions=10**6), metadata=served.metadata(EMBEDDER)),
            "INVALID_ARGUMENT",
            "dimensions",
        ),
        (
            lambda: embed.Embed(pb.EmbedRequest(inputs="x", prompt_name="nope"), metadata=served.metadata(EMBEDDER)),
            "INVALID_ARGUMENT",
            "prompt",
        ),
        (
            lambda: embed.Embed(pb.EmbedRequest(inputs=" ".join(["long"] * 300)), metadata=served.metadata(EMBEDDER)),
            "INVALID_ARGUMENT",
            "truncate",
        ),
        (
            lambda: rerank.Rerank(pb.RerankRequest(query="q"), metadata=served.metadata(RERANKER)),
            "INVALID_ARGUMENT",
            "texts",
        ),
        (lambda: rerank.RerankStream(iter([]), metadata=served.metadata(RERANKER)), "INVALID_ARGUMENT", "no pair"),
        (
            lambda: embed.Embed(pb.EmbedRequest(inputs="x"), metadata=[("authorization", "Bearer wrong-key-0000")]),
            "UNAUTHENTICATED",
            "not valid",
        ),
        (lambda: embed.Embed(pb.EmbedRequest(inputs="x")), "UNAUTHENTICATED", "Bearer"),
    ]
    for call, status, named in cases:
        with pytest.raises(grpc.RpcError) as failed:
            call()
        assert (failed.value.code().name, named in failed.value.details()) == (status, True), failed.value.details()


def test_health_follows_readiness_and_reflection_lists_the_services(served: Served) -> None:
    health = health_pb2_grpc.HealthStub(served.channel)
    for service in ("", "tei.v1.Embed", "tei.v1.Rerank", EMBEDDER, RERANKER):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as unknown:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert unknown.value.code() is grpc.StatusCode.NOT_FOUND
    reflect = reflection_pb2_grpc.ServerReflectionStub(served.channel)
    answer = next(
        reflect.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    )
    names = {s.name for s in answer.list_services_response.service}
    assert {
        "tei.v1.Embed",
        "tei.v1.Predict",
        "tei.v1.Rerank",
        "tei.v1.Tokenize",
        "tei.v1.Info",
        "grpc.health.v1.Health",
    } <= names
