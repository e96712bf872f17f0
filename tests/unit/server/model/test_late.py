"""The late-interaction models of tests/data/multivector (tiny random models that FlagEmbedding
1.4.2 and PyLate 1.6.0 made and saved, benchmarks/make_multivector_references.py) through the
graph path, in fp32, against what those libraries compute: BGE-M3's dense vectors (min cosine
0.99999), its sparse weights (the same non-zero ids, each weight to 1e-4 relative, 5e-6 absolute
for the weights near ReLU's 0), its and ColBERT's token vectors (the same count, each cosine
0.99999), the ids a ColBERT query and document are read as (prefix, [MASK] expansion, skiplist),
and MaxSim scores to 1e-4 with every query's ranking the same. One model run answers every task
its rows ask for; a run holds at most ``batch_size`` rows."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from bertserve.client import late, tasks as t
from bertserve.server.config.model import ModelConfig
from bertserve.server.errors import ModelError
from bertserve.server.model.late import LateModel
from bertserve.server.model.tasks import late_kind, model_tasks

pytestmark = pytest.mark.timeout(600)

DATA = Path(__file__).resolve().parents[3] / "data" / "multivector"
COLBERTS = ["colbert_bert", "colbert_modernbert"]


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / f"{name}.npz") as data:
        return {key: data[key] for key in data.files if key != "meta"}


@cache
def model(name: str, graph_dir: str, batch_size: int = 64) -> LateModel:
    options = ModelConfig.of(model_dir=str(DATA / name), dtype="fp32", graph_dir=graph_dir, batch_size=batch_size)
    return LateModel(options)


def texts(values: np.ndarray) -> list[str]:
    return [str(value) for value in values]


def min_cosine(rows: list[np.ndarray], expected: np.ndarray, counts: np.ndarray) -> float:
    for row, count in zip(rows, counts, strict=True):
        assert len(row) == count
    return min(float((row * expected[i, : len(row)]).sum(axis=1).min()) for i, row in enumerate(rows))


def test_the_tasks_are_read_from_the_files_alone() -> None:
    assert late_kind(str(DATA / "bge_m3")) == "bge-m3"
    assert late_kind(str(DATA / "colbert_bert")) == "colbert"
    assert model_tasks(str(DATA / "bge_m3"), None) == ("embed", "sparse", "multivector", "rerank")
    assert model_tasks(str(DATA / "colbert_modernbert"), None) == ("multivector", "rerank")
    assert model_tasks(str(DATA / "bge_m3"), "sparse") == ("sparse", "embed", "multivector", "rerank")


def test_bge_m3_gives_flagembeddings_three_outputs_from_one_run(session_graph_dir: str) -> None:
    ref, m3 = reference("bge_m3"), model("bge_m3", session_graph_dir)
    inputs = texts(ref["texts"])
    batch = m3.tokenize(inputs)
    assert np.array_equal(batch.input_ids, ref["ids"][:, : batch.input_ids.shape[1]])
    rows = np.arange(len(inputs))
    calls = []
    run = m3.encoder.run_padded
    m3.encoder.run_padded = lambda part: calls.append(len(part)) or run(part)  # type: ignore[method-assign]
    try:
        out = m3.run_tasks(batch, {"embed": rows[::2], "sparse": rows, "multivector": rows[1::2]})
    finally:
        del m3.encoder.run_padded
    assert sum(calls) == len(inputs)  # each row run once for the three
    dense = out["embed"] / np.linalg.norm(out["embed"], axis=1, keepdims=True)
    assert (dense * ref["dense"][::2]).sum(axis=1).min() >= 0.99999
    for i, row in enumerate(t.sparse_rows(out["sparse"])):
        count = int(ref["sparse_counts"][i])
        order = np.argsort(ref["sparse_ids"][i, :count])
        assert row.indices.tolist() == ref["sparse_ids"][i, :count][order].tolist(), i
        np.testing.assert_allclose(row.values, ref["sparse_weights"][i, :count][order], rtol=1e-4, atol=5e-6)
    vectors = late.multivector_rows(out["multivector"])
    assert min_cosine(vectors, ref["colbert"][1::2], ref["colbert_counts"][1::2]) >= 0.99999


def test_bge_m3_dense_alone_is_encode(session_graph_dir: str) -> None:
    ref, m3 = reference("bge_m3"), model("bge_m3", session_graph_dir)
    vectors = m3.encode(texts(ref["texts"]))
    assert (vectors * ref["dense"]).sum(axis=1).min() >= 0.99999


@pytest.mark.parametrize("name", COLBERTS)
def test_colbert_reads_queries_and_documents_as_pylate(name: str, session_graph_dir: str) -> None:
    ref, colbert = reference(name), model(name, session_graph_dir)
    inputs = texts(ref["texts"])
    queries = colbert.tokenize(inputs, reads="query")
    assert np.array_equal(queries.input_ids, ref["query_ids"])  # prefix after [CLS], [MASK] to query_length
    documents = colbert.tokenize(inputs)
    width = documents.input_ids.shape[1]
    assert np.array_equal(documents.input_ids, ref["document_ids"][:, :width])
    everyone = np.arange(len(inputs))
    query_vectors = late.multivector_rows(colbert.run_tasks(queries, {"multivector": everyone})["multivector"])
    full = np.full(len(inputs), ref["query_colbert"].shape[1])
    assert min_cosine(query_vectors, ref["query_colbert"], full) >= 0.99999  # the [MASK] rows too
    document_vectors = late.multivector_rows(colbert.run_tasks(documents, {"multivector": everyone})["multivector"])
    assert min_cosine(document_vectors, ref["document_colbert"], ref["document_counts"]) >= 0.99999  # skiplist out


@pytest.mark.parametrize(("name", "scores"), [*((name, "scores") for name in COLBERTS), ("bge_m3", "colbert_scores")])
def test_maxsim_reranks_as_the_library_scores(name: str, scores: str, session_graph_dir: str) -> None:
    ref, late = reference(name), model(name, session_graph_dir)
    queries, documents = texts(ref["queries"]), texts(ref["documents"])
    pairs = [t.rerank_pair(query, document) for query in queries for document in documents]
    batch = late.tokenize(pairs, reads="pairs")
    got = late.run_tasks(batch, {"rerank": np.arange(len(pairs))})["rerank"].reshape(len(queries), -1)
    np.testing.assert_allclose(got, ref[scores], atol=1e-4)
    for row, expected in zip(got, ref[scores], strict=True):
        assert t.ranking(row) == t.ranking(expected)


def test_maxsim_of_the_clients_is_the_servers(session_graph_dir: str) -> None:
    ref, colbert = reference("colbert_bert"), model("colbert_bert", session_graph_dir)
    query, document = texts(ref["queries"])[:1], texts(ref["documents"])[:1]
    q = late.multivector_rows(colbert.run(colbert.tokenize(query, reads="query")))[0]
    d = late.multivector_rows(colbert.run(colbert.tokenize(document)))[0]
    np.testing.assert_allclose(late.maxsim(q, d), ref["scores"][0, 0], atol=1e-4)


def test_a_run_holds_at_most_batch_size_rows(session_graph_dir: str) -> None:
    ref = reference("bge_m3")
    m3 = model("bge_m3", session_graph_dir, batch_size=4)
    runs = []
    run = m3.encoder.run_padded
    m3.encoder.run_padded = lambda part: runs.append(part.input_ids.shape) or run(part)  # type: ignore[method-assign]
    try:
        m3.run_tasks(m3.tokenize(texts(ref["texts"])), {"multivector": np.arange(len(ref["texts"]))})
    finally:
        del m3.encoder.run_padded
    assert max(rows for rows, _ in runs) == 4 and sum(rows for rows, _ in runs) == len(ref["texts"])
    assert max(width for _, width in runs) <= m3.max_len


def test_options_that_do_not_apply_are_refused(session_graph_dir: str) -> None:
    where = {"model_dir": str(DATA / "colbert_bert"), "graph_dir": session_graph_dir}
    for option, value in (("pooling_strategy", "CLS_TOKEN"), ("normalize", True), ("long_inputs", "chunk")):
        with pytest.raises(ModelError, match=option):
            LateModel(ModelConfig.of(**where, **{option: value}))
    with pytest.raises(ModelError, match="answers multivector, rerank"):
        LateModel(ModelConfig.of(**where, task="sparse"))
    colbert = model("colbert_bert", session_graph_dir)
    with pytest.raises(ModelError, match="encode_multivector"):
        colbert.encode(["a sentence"])
    with pytest.raises(ValueError, match=re.escape("query ||| document")):
        colbert.tokenize(["no pair here"], reads="pairs")
