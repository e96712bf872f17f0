"""The clients written for Text Embeddings Inference, unchanged and with their defaults,
against one server of several models (tiny models of tests/data, fp32), its default model an
embedding model: huggingface_hub's ``InferenceClient`` (``feature_extraction``,
``text_classification``, ``sentence_similarity``, each posting to the root), LangChain's
``HuggingFaceEndpointEmbeddings``, LlamaIndex's ``TextEmbeddingsInference``, and Haystack's
TEI embedders (dense and sparse) and ranker. None of them names a model: each reaches the
default model of its task (two rerankers are served, ``--default-model rerank=ranker`` picks
one), and each answer is what sentence-transformers computes (the references of tests/data).
Haystack's embedders send ``normalize: false``, and get the vectors before the model's
Normalize module, its Dense layer applied."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from bertserve.client import BertClient, tasks as t
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from safetensors.numpy import load_file

pytestmark = pytest.mark.timeout(600)

DATA = Path(__file__).resolve().parent.parent / "data"
EMBEDDER = DATA / "families" / "distilbert"  # mean pooling, Dense 32 -> 24 (tanh), Normalize
MODELS = {
    "embedder": EMBEDDER,
    "other-embedder": DATA / "families" / "mpnet",
    "other-ranker": DATA / "tasks" / "rerank_distilbert",  # the first reranker served: not the default
    "ranker": DATA / "tasks" / "rerank_bert",
    "classifier": DATA / "tasks" / "classify_bert",
    "splade": DATA / "tasks" / "splade_bert",
}


def reference(path: Path) -> dict[str, np.ndarray]:
    with np.load(path.with_suffix(".npz")) as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def served(session_graph_dir: str) -> Iterator[tuple[RunningServer, str]]:
    port = free_port()
    flags = [arg for name, where in MODELS.items() for arg in ("--model", f"{name}={where},dtype=fp32")]
    server = start_server(
        "--http-port", str(port), "--graph-dir", session_graph_dir, *flags, "--default-model", "rerank=ranker"
    )
    yield server, f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="module")
def running(served: tuple[RunningServer, str]) -> RunningServer:
    return served[0]


@pytest.fixture(scope="module")
def url(served: tuple[RunningServer, str]) -> str:
    return served[1]


@pytest.fixture(scope="module")
def sentences() -> tuple[list[str], np.ndarray, np.ndarray]:
    """The embedder's reference sentences that fit its 32 tokens, their vectors, and their
    vectors before the Normalize module (its mean pooling through its Dense layer)."""
    ref = reference(EMBEDDER)
    fits = ref["untruncated_lengths"] <= 32
    dense = load_file(str(EMBEDDER / "2_Dense" / "model.safetensors"))
    raw = np.tanh(ref["pool_mean"] @ dense["linear.weight"].T + dense["linear.bias"])
    return [str(s) for s in ref["sentences"][fits]][:12], ref["st_default"][fits][:12], raw[fits][:12]


def test_inference_client_feature_extraction_posts_to_the_root(url: str, sentences: tuple) -> None:
    from huggingface_hub import InferenceClient

    texts, normalized, raw = sentences
    client = InferenceClient(base_url=url)
    np.testing.assert_allclose(client.feature_extraction(texts), normalized, atol=1e-5)
    np.testing.assert_allclose(client.feature_extraction(texts[0]), normalized[:1], atol=1e-5)
    np.testing.assert_allclose(client.feature_extraction(texts, normalize=False), raw, atol=1e-5)


def test_inference_client_text_classification_reaches_the_classifier(url: str) -> None:
    from huggingface_hub import InferenceClient

    ref = reference(DATA / "tasks" / "classify_bert")
    client = InferenceClient(base_url=url)
    for i in np.flatnonzero(ref["lengths"] < 32)[:4]:
        labels = client.text_classification(str(ref["texts"][i]))
        assert labels[0].label == str(ref["labels"][i])
        got = {item.label: item.score for item in labels}
        np.testing.assert_allclose([got[n] for n in ("negative", "neutral", "positive")], ref["probs"][i], atol=1e-5)
    assert len(client.text_classification(str(ref["texts"][0]), top_k=1)) == 1


def test_inference_client_sentence_similarity_gives_cosines(url: str, sentences: tuple) -> None:
    from huggingface_hub import InferenceClient

    texts, normalized, _ = sentences
    scores = InferenceClient(base_url=url).sentence_similarity(texts[0], other_sentences=texts[1:])
    np.testing.assert_allclose(scores, normalized[1:] @ normalized[0], atol=1e-5)


def test_langchain_huggingface_endpoint_embeddings(url: str, sentences: tuple) -> None:
    from langchain_huggingface import HuggingFaceEndpointEmbeddings

    texts, normalized, _ = sentences
    embeddings = HuggingFaceEndpointEmbeddings(model=url)
    np.testing.assert_allclose(embeddings.embed_documents(texts), normalized, atol=1e-5)
    np.testing.assert_allclose(embeddings.embed_query(texts[0]), normalized[0], atol=1e-5)


def test_llama_index_text_embeddings_inference(url: str, sentences: tuple) -> None:
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    texts, normalized, _ = sentences
    embed = TextEmbeddingsInference(model_name="embedder", base_url=url, embed_batch_size=5)
    np.testing.assert_allclose(embed.get_text_embedding_batch(texts), normalized, atol=1e-5)
    np.testing.assert_allclose(embed.get_query_embedding(texts[0]), normalized[0], atol=1e-5)


def test_haystack_tei_embedders_get_the_vectors_before_normalize(url: str, sentences: tuple) -> None:
    from haystack import Document
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPIDocumentEmbedder,
        HuggingFaceAPITextEmbedder,
    )

    texts, _, raw = sentences
    params = {"api_type": "text_embeddings_inference", "api_params": {"url": url}}
    documents = HuggingFaceAPIDocumentEmbedder(**params).run([Document(content=text) for text in texts])["documents"]
    np.testing.assert_allclose([d.embedding for d in documents], raw, atol=1e-5)  # normalize: false, as it sends
    query = HuggingFaceAPITextEmbedder(**params).run(texts[0])["embedding"]
    np.testing.assert_allclose(query, raw[0], atol=1e-5)


def test_haystack_tei_sparse_embedder_reaches_the_splade_model(url: str) -> None:
    from haystack_integrations.components.embedders.huggingface_api import HuggingFaceTEISparseTextEmbedder

    ref = reference(DATA / "tasks" / "splade_bert")
    embedder = HuggingFaceTEISparseTextEmbedder(api_base_url=url)
    for i in np.flatnonzero(ref["lengths"] < 32)[:3]:
        got = embedder.run(str(ref["texts"][i]))["sparse_embedding"]
        want = t.sparse_rows(ref["dense"][i : i + 1])[0]
        assert got.indices == want.indices.tolist()
        np.testing.assert_allclose(got.values, want.values, rtol=1e-4, atol=5e-6)


def test_haystack_tei_ranker_reaches_the_default_reranker(url: str) -> None:
    from haystack import Document
    from haystack_integrations.components.rankers.huggingface_api import HuggingFaceTEIRanker

    ref = reference(DATA / "tasks" / "rerank_bert")
    documents = [str(d) for d in ref["documents"]]
    ranked = HuggingFaceTEIRanker(url=url, top_k=5).run(
        query=str(ref["queries"][3]), documents=[Document(content=d) for d in documents]
    )["documents"]
    assert [d.content for d in ranked] == [documents[i] for i in ref["rank"][3][:5]]
    np.testing.assert_allclose([d.score for d in ranked], ref["scores"][3][ref["rank"][3][:5]], atol=1e-4)


def test_zeromq_clients_reach_the_default_model_of_their_task(running: RunningServer, sentences: tuple) -> None:
    ref = reference(DATA / "tasks" / "rerank_bert")
    documents = [str(d) for d in ref["documents"]]
    texts, normalized, raw = sentences
    with BertClient(port=running.port, port_out=running.port_out, timeout=60_000) as client:
        ranked = client.rerank(str(ref["queries"][3]), documents)
        np.testing.assert_allclose(client.encode(texts), normalized, atol=1e-5)
        np.testing.assert_allclose(client.encode(texts, normalize=False), raw, atol=1e-5)
        with pytest.raises(ValueError, match=r"the served models of task rerank: 'other-ranker', 'ranker'"):
            client.rerank("a query", documents, model="embedder")
        with pytest.raises(ValueError, match="output=int8 cuts ranges calibrated on the model's own vectors"):
            client.encode(texts, output="int8", normalize=False)
    assert [r.index for r in ranked] == ref["rank"][3].tolist()


def test_the_root_answers_by_the_task_of_the_model_it_reaches(url: str, sentences: tuple) -> None:
    import httpx

    ref = reference(DATA / "tasks" / "rerank_bert")
    documents = [str(d) for d in ref["documents"]]
    texts, normalized, _ = sentences
    with httpx.Client(base_url=url, timeout=60) as http:
        ranked = http.post("/", json={"query": str(ref["queries"][3]), "texts": documents}).json()  # TEI's rerank
        assert [r["index"] for r in ranked] == ref["rank"][3].tolist()
        sparse = http.post("/invocations", json={"model": "splade", "inputs": texts[0], "truncate": True})
        assert sparse.status_code == 200 and all({"index", "value"} == set(t) for t in sparse.json()[0])
        named = http.post("/", json={"model": "other-embedder", "inputs": texts[:2]}).json()
        assert np.asarray(named).shape == (2, 32)  # mpnet's vectors, not the default model's 24
        np.testing.assert_allclose(http.post("/", json={"inputs": texts}).json(), normalized, atol=1e-5)
        refusals = {
            "not JSON": (http.post("/", content=b'{"inputs": "x",}'), 400, "the body is not valid JSON: "),
            "not an object": (http.post("/", json=["x"]), 422, "the body must be a JSON object, not list"),
            "unknown model": (http.post("/", json={"model": "nope", "inputs": "x"}), 404, "is not served here"),
            "bad model": (http.post("/", json={"model": 3, "inputs": "x"}), 422, "model must be a string"),
            "bad inputs": (http.post("/", json={"inputs": 3}), 422, "inputs"),
            "bad parameters": (http.post("/", json={"inputs": "x", "parameters": {"k": 1}}), 422, "parameters.k"),
            "bad similarity": (http.post("/", json={"inputs": {"source_sentence": "a"}}), 422, "sentences"),
            "int8 of other vectors": (
                http.post("/embed", json={"inputs": "x", "normalize": False, "embedding_types": ["int8"]}),
                422,
                "calibrated on the model's own vectors, which are normalized",
            ),
        }
        for what, (answer, status, says) in refusals.items():
            assert answer.status_code == status and says in answer.json()["error"], (what, answer.text)


def test_requests_of_both_normalizes_merged_into_one_run_never_cross(running: RunningServer, sentences: tuple) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from bertserve.client import ConcurrentBertClient

    texts, normalized, raw = sentences
    with (
        ConcurrentBertClient(port=running.port, port_out=running.port_out, max_concurrency=8, timeout=60_000) as pool,
        ThreadPoolExecutor(8) as threads,
    ):
        asked = [(i % len(texts), i % 2 == 0) for i in range(64)]
        answers = list(threads.map(lambda a: pool.encode([texts[a[0]]], normalize=a[1]), asked))
    for (row, normal), answer in zip(asked, answers, strict=True):
        np.testing.assert_allclose(answer[0], (normalized if normal else raw)[row], atol=1e-5)
