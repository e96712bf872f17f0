"""One server of BGE-M3, two ColBERT models and a plain encoder (the tiny models of
tests/data/multivector and tests/data/families, fp32), asked as users ask: BGE-M3's three
outputs over HTTP (/embed, /embed_sparse, /embed_multivector) and ZeroMQ (``BertClient``,
``AsyncBertClient``), and all three from one request (``encode_outputs``, /embed_outputs);
ColBERT queries and documents; MaxSim on every rerank shape (TEI's /rerank, Cohere's /v2/rerank
through the cohere SDK, ``BertClient.rerank``, gRPC's ``Rerank`` in TEI's protocol). Each answer
is what FlagEmbedding and PyLate compute (tests/data/multivector). The compact forms of
multi-vectors equal the client's own of the float answer. Bad input is a 4xx that names the
field, over HTTP and in a ZeroMQ header the client would not send; an answer past
``--max-reply-bytes`` is a 413 that says how many inputs fit and that binary is smaller."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from bertserve.client import AsyncBertClient, late, protocol as p, tasks as t
from bertserve.client.errors import ServerError
from bertserve.server.testing.launcher import free_port, start_server
from served import Served
from tei_stubs import tei_stubs

pytestmark = pytest.mark.timeout(600)

DATA = Path(__file__).resolve().parent.parent / "data"
KEY = "multivector-key-0123456789"
REPLY_BYTES = 200_000  # 12 of BGE-M3's multi-vector answers as JSON (32 positions x 32 values x 16 bytes)
pb, services = tei_stubs()


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / "multivector" / f"{name}.npz") as data:
        return {key: data[key] for key in data.files if key != "meta"}


def texts(values: np.ndarray) -> list[str]:
    return [str(value) for value in values]


@pytest.fixture(scope="module")
def served(session_graph_dir: str) -> Iterator[Served]:
    models = {
        "m3": DATA / "multivector" / "bge_m3",
        "colbert": DATA / "multivector" / "colbert_bert",
        "modern": DATA / "multivector" / "colbert_modernbert",
        "plain": DATA / "families" / "bert_st6",
    }
    port, grpc_port = free_port(), free_port()
    flags = [arg for name, where in models.items() for arg in ("--model", f"{name}={where},dtype=fp32")]
    running = start_server(
        *("--http-port", str(port), "--grpc-port", str(grpc_port), "--api-key", KEY),
        *("--graph-dir", session_graph_dir, "--max-latency-ms", "2", "--max-reply-bytes", str(REPLY_BYTES), *flags),
    )
    served = Served(running, port, KEY, grpc_port)
    yield served
    served.stop()


def multivectors(served: Served, model: str, inputs: list[str], **body: object) -> list[np.ndarray]:
    rows: list[np.ndarray] = []
    with served.http() as http:
        for start in range(0, len(inputs), 10):  # within the reply bound
            part = {"model": model, "inputs": inputs[start : start + 10], **body}
            answer = http.post("/embed_multivector", json=part)
            assert answer.status_code == 200, answer.text
            rows += [np.asarray(row, np.float32) for row in answer.json()]
    return rows


def assert_vectors(rows: list[np.ndarray], expected: np.ndarray, counts: np.ndarray) -> None:
    assert [len(row) for row in rows] == counts.tolist()
    assert min(float((row * expected[i, : len(row)]).sum(axis=1).min()) for i, row in enumerate(rows)) >= 0.99999


def test_bge_m3_answers_its_three_outputs_over_http_and_zeromq(served: Served) -> None:
    ref = reference("bge_m3")
    inputs = texts(ref["texts"])
    with served.http() as http:
        answer = http.post("/embed", json={"model": "m3", "inputs": inputs, "truncate": True})
        assert answer.status_code == 200, answer.text
        dense = np.asarray(answer.json(), np.float32)
        sparse = http.post("/embed_sparse", json={"model": "m3", "inputs": inputs, "truncate": True}).json()
    assert (dense * ref["dense"]).sum(axis=1).min() >= 0.99999
    for i, terms in enumerate(sparse):
        count = int(ref["sparse_counts"][i])
        order = np.argsort(ref["sparse_ids"][i, :count])
        assert [term["index"] for term in terms] == ref["sparse_ids"][i, :count][order].tolist()
        weights = ref["sparse_weights"][i, :count][order]
        np.testing.assert_allclose([term["value"] for term in terms], weights, rtol=1e-4, atol=5e-6)
    assert_vectors(multivectors(served, "m3", inputs, truncate=True), ref["colbert"], ref["colbert_counts"])
    with served.client("m3") as client:
        client.check_length = False  # BGE-M3 truncates as FlagEmbedding does: the reference is of cut texts
        assert (client.encode(inputs) * ref["dense"]).sum(axis=1).min() >= 0.99999
        assert [len(row.indices) for row in client.encode_sparse(inputs)] == ref["sparse_counts"].tolist()
        assert_vectors(client.encode_multivector(inputs), ref["colbert"], ref["colbert_counts"])

    async def asynchronous() -> list[np.ndarray]:
        async with AsyncBertClient(port=served.running.port, port_out=served.running.port_out, model="m3") as client:
            return await client.encode_multivector(inputs)

    assert_vectors(asyncio.run(asynchronous()), ref["colbert"], ref["colbert_counts"])


def test_one_request_answers_several_outputs_each_as_alone(served: Served) -> None:
    ref = reference("bge_m3")
    inputs = texts(ref["texts"])[:10]
    with served.client("m3") as client:
        client.check_length = False
        every = client.encode_outputs(inputs)
        some = client.encode_outputs(inputs, outputs=["multivector", "sparse"])
    assert (np.stack([answer["embed"] for answer in every]) * ref["dense"][:10]).sum(axis=1).min() >= 0.99999
    assert_vectors([answer["multivector"] for answer in every], ref["colbert"], ref["colbert_counts"][:10])
    for i, (answer, other) in enumerate(zip(every, some, strict=True)):
        count = int(ref["sparse_counts"][i])
        assert answer["sparse"].indices.tolist() == sorted(ref["sparse_ids"][i, :count].tolist())
        assert set(other) == {"multivector", "sparse"}
        np.testing.assert_array_equal(other["sparse"].values, answer["sparse"].values)
    with served.http() as http:
        answer = http.post("/embed_outputs", json={"model": "m3", "inputs": inputs, "truncate": True})
        assert answer.status_code == 200, answer.text
    for got, expected in zip(answer.json(), every, strict=True):
        np.testing.assert_allclose(got["embed"], expected["embed"], atol=1e-6)
        assert [term["index"] for term in got["sparse"]] == expected["sparse"].indices.tolist()
        np.testing.assert_allclose(got["multivector"], expected["multivector"], atol=1e-6)


@pytest.mark.parametrize(("model", "name"), [("colbert", "colbert_bert"), ("modern", "colbert_modernbert")])
def test_colbert_queries_and_documents_are_pylates(served: Served, model: str, name: str) -> None:
    ref = reference(name)
    inputs = texts(ref["texts"])
    queries = multivectors(served, model, inputs, is_query=True)  # cut to the query length, as PyLate cuts
    assert_vectors(queries, ref["query_colbert"], np.full(len(inputs), ref["query_colbert"].shape[1]))
    documents = multivectors(served, model, inputs, truncate=True)
    assert_vectors(documents, ref["document_colbert"], ref["document_counts"])


@pytest.mark.parametrize(
    ("model", "name", "scores"), [("colbert", "colbert_bert", "scores"), ("m3", "bge_m3", "colbert_scores")]
)
def test_maxsim_answers_every_rerank_shape(served: Served, model: str, name: str, scores: str) -> None:
    cohere = pytest.importorskip("cohere")
    ref = reference(name)
    documents = texts(ref["documents"])
    for q, query in enumerate(texts(ref["queries"])):
        expected, rank = ref[scores][q], t.ranking(ref[scores][q])
        with served.http() as http:
            tei = http.post("/rerank", json={"model": model, "query": query, "texts": documents, "raw_scores": True})
        assert tei.status_code == 200, tei.text
        assert [r["index"] for r in tei.json()] == rank
        np.testing.assert_allclose([r["score"] for r in tei.json()], expected[rank], atol=1e-4)
        v2 = cohere.ClientV2(api_key=KEY, base_url=served.url).rerank(model=model, query=query, documents=documents)
        assert [r.index for r in v2.results] == rank
        with served.client(model) as client:
            assert [r.index for r in client.rerank(query, documents)] == rank
        request = pb.RerankRequest(query=query, texts=documents, raw_scores=True)
        answer = services.RerankStub(served.channel).Rerank(request, metadata=served.metadata(model), timeout=60)
        assert [r.index for r in answer.ranks] == rank
        np.testing.assert_allclose([r.score for r in answer.ranks], expected[rank], atol=1e-4)


def test_compact_forms_are_the_clients_own_of_the_float_answer(served: Served) -> None:
    inputs = texts(reference("colbert_bert")["documents"])[:6]
    (floats,) = [multivectors(served, "colbert", inputs)]
    with served.http() as http:
        body = {"model": "colbert", "inputs": inputs, "embedding_types": ["float16", "binary", "ubinary"]}
        forms = http.post("/embed_multivector", json=body).json()
        alone = http.post("/embed_multivector", json={**body, "embedding_types": "binary"}).json()
    assert set(forms) == {"float16", "binary", "ubinary"}
    for kind in ("float16", "binary", "ubinary"):
        for row, got in zip(floats, forms[kind], strict=True):
            expected = late.multivector_form(row, kind)  # float16 as JSON: the shortest text that reads back to it
            np.testing.assert_array_equal(np.asarray(got).astype(expected.dtype), expected)
    assert alone == forms["binary"]  # one type named alone: its rows, as /embed answers it


def test_bad_input_is_a_4xx_that_names_the_field(served: Served) -> None:
    cases = [
        ({"model": "colbert", "inputs": [""]}, 422, "inputs"),
        ({"model": "colbert", "inputs": []}, 422, "inputs"),
        ({"model": "colbert", "inputs": ["a"], "is_query": "yes"}, 422, "is_query"),
        ({"model": "colbert", "inputs": ["a"], "embedding_types": "int8"}, 422, "embedding_types"),
        ({"model": "plain", "inputs": ["a"]}, 400, "model"),
        ({"model": "colbert", "inputs": ["word " * 60], "truncate": False}, 413, None),
        ({"model": "colbert", "inputs": ["word " * 60], "is_query": True, "truncate": False}, 413, None),
    ]
    with served.http() as http:
        for body, status, param in cases:
            answer = http.post("/embed_multivector", json=body)
            assert answer.status_code == status, (body, answer.text)
            assert answer.json()["error"]["param"] == param, answer.text
        empty_query = http.post("/rerank", json={"model": "colbert", "query": " ", "texts": ["a"]})
        assert empty_query.status_code == 422 and "query" in empty_query.text
        long_pair = {"model": "colbert", "query": "a query", "texts": ["short", "word " * 60], "truncate": False}
        refused = http.post("/rerank", json=long_pair)  # the document alone is past ColBERT's document_length
        assert refused.status_code == 413 and "texts[1]" in refused.text, refused.text
        dense = http.post("/embed", json={"model": "colbert", "inputs": ["a"]})
        assert dense.status_code == 400 and "/embed_multivector" in dense.text

    async def raw(header: dict) -> str:
        async with AsyncBertClient(port=served.running.port, port_out=served.running.port_out) as client:
            reply = await client._connection.request(p.ENCODE, "request", {"timeout_ms": 30_000, **header}, ["a"])
            assert not reply.ok
            return str(reply.header)

    not_boolean = {"model": "colbert", "task": "multivector", "is_query": 1}
    assert "is_query must be true or false" in asyncio.run(raw(not_boolean))
    assert "is_query applies to multivector" in asyncio.run(raw({"model": "m3", "task": "sparse", "is_query": True}))
    assert "does not answer multivector" in asyncio.run(raw({"model": "plain", "task": "multivector"}))
    assert "not 'dense'" in asyncio.run(raw({"model": "m3", "outputs": ["dense"]}))
    assert "texts[0] is not a pair" in asyncio.run(raw({"model": "colbert", "task": "rerank"}))  # ["a"]
    assert "not both" in asyncio.run(raw({"model": "m3", "task": "embed", "outputs": ["embed"]}))
    assert "does not answer embed" in asyncio.run(raw({"model": "colbert", "outputs": ["multivector", "embed"]}))
    with served.http() as http:
        answer = http.post("/embed_outputs", json={"model": "m3", "inputs": ["a"], "outputs": "embed"})
        assert answer.status_code == 422 and answer.json()["error"]["param"] == "outputs"


def test_an_answer_past_the_reply_bound_is_refused_first_with_how_to_fit_it(served: Served) -> None:
    long, short = "word " * 40, "a short text"  # a vector for each of at most 32 positions, or of 12 + 4
    with served.http() as http:
        for text, fit in ((long, 12), (short, 24)):  # 200,000 bytes of JSON: 16 KiB an input, or 8 KiB
            body = {"model": "m3", "inputs": [text] * (fit + 1), "truncate": True}
            answer = http.post("/embed_multivector", json=body)
            assert answer.status_code == 413, answer.text
            message = answer.json()["error"]["message"]
            assert f"send at most {fit} of these inputs" in message and "binary" in message
            assert http.post("/embed_multivector", json={**body, "inputs": [text] * fit}).status_code == 200
            assert http.post("/embed_multivector", json={**body, "embedding_types": "binary"}).status_code == 200
    with served.client("m3") as client, pytest.raises(ServerError, match="send at most 48 of these inputs"):
        client.encode_multivector([long] * 49)  # 49 x 32 x 32 float32 > 200,000 bytes
