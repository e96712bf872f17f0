"""Each task model of tests/data/tasks (tiny random models that sentence-transformers 6.3 made
and saved, benchmarks/make_task_references.py) through the graph path, against what
sentence-transformers computes for it: a cross-encoder's scores (CrossEncoder.predict) to 1e-4
with the same ranking of every query's documents, a classifier's probabilities to 1e-5 with the
same labels, SPLADE's non-zero terms with their weights to 1e-4 relative (5e-6 absolute for the
weights near 0); the ids of every pair,
cut as CrossEncoder cuts them; bf16 and int8 within their bounds."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from bertserve.client import tasks as t
from bertserve.server import Encoder
from bertserve.server.errors import ModelError
from checks import bf16_bound

pytestmark = pytest.mark.timeout(600)

DATA = Path(__file__).resolve().parents[3] / "data" / "tasks"
RERANKERS = sorted(p.stem for p in DATA.glob("rerank_*.npz"))
CLASSIFIERS = sorted(p.stem for p in DATA.glob("classify_*.npz"))
SPLADE = sorted(p.stem for p in DATA.glob("splade_*.npz"))


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / f"{name}.npz") as data:
        return {key: data[key] for key in data.files}


@cache
def encoder(name: str, dtype: str, graph_dir: str) -> Encoder:
    return Encoder(DATA / name, dtype=dtype, graph_dir=graph_dir)


def pairs_of(ref: dict[str, np.ndarray]) -> list[str]:
    return t.rerank_pairs(str(ref["queries"][0]), [str(d) for d in ref["documents"]])


def all_pairs(ref: dict[str, np.ndarray]) -> list[str]:
    return [p for q in ref["queries"] for p in t.rerank_pairs(str(q), [str(d) for d in ref["documents"]])]


@pytest.mark.parametrize("name", RERANKERS)
def test_rerank_scores_are_those_of_cross_encoder(name: str, session_graph_dir: str) -> None:
    ref = reference(name)
    model = encoder(name, "fp32", session_graph_dir)
    meta = json.loads((DATA / f"{name}.json").read_text())
    assert model.describe()["task"] == "rerank"
    pairs = all_pairs(ref)
    batch = model.tokenize(pairs)
    ids = np.zeros_like(ref["pair_ids"])
    for i, row in enumerate(batch.input_ids):
        ids[i, : batch.lengths[i]] = row[: batch.lengths[i]]
    np.testing.assert_array_equal(ids, ref["pair_ids"], err_msg=f"{name}: pair ids")
    np.testing.assert_array_equal(batch.truncated, ref["truncated"].reshape(-1).astype(bool))
    logits = model.encode(pairs)[:, 0].reshape(ref["logits"].shape)
    np.testing.assert_allclose(logits, ref["logits"], atol=1e-4, err_msg=f"{name}: logits")
    scores = t.activate(logits, model.describe()["activation"])
    np.testing.assert_allclose(scores, ref["scores"], atol=1e-4, err_msg=f"{name} ({meta.get('layout')}): scores")
    for q in range(len(ref["queries"])):
        assert t.ranking(scores[q]) == ref["rank"][q].tolist(), f"{name}: the ranking of query {q}"


def test_the_activation_is_the_models_own() -> None:
    named = {name: json.loads((DATA / f"{name}.json").read_text()) for name in RERANKERS}
    from bertserve.server.model.tasks import read_task

    for name in named:
        head = read_task(str(DATA / name), "bert", None)
        expected = "identity" if "identity" in name else "sigmoid"
        assert head.activation == expected, name


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_classifier_probabilities_are_those_of_cross_encoder(name: str, session_graph_dir: str) -> None:
    ref = reference(name)
    model = encoder(name, "fp32", session_graph_dir)
    assert model.describe()["task"] == "classify"
    labels = model.describe()["labels"]
    texts = [str(text) for text in ref["texts"]]
    logits = model.encode(t.predict_inputs(texts))
    np.testing.assert_allclose(logits, ref["logits"], atol=1e-4)
    got = t.predictions(logits, labels)
    probs = np.array([[dict((p.label, p.score) for p in row)[label] for label in labels] for row in got])
    np.testing.assert_allclose(probs, ref["probs"], atol=1e-5)
    assert [row[0].label for row in got] == [str(label) for label in ref["labels"]]
    pairs = list(zip((str(a) for a in ref["pairs_first"]), (str(b) for b in ref["pairs_second"]), strict=True))
    pair_probs = t.label_probabilities(model.encode(t.predict_inputs(pairs)))
    np.testing.assert_allclose(pair_probs, ref["pair_probs"], atol=1e-5)


@pytest.mark.parametrize("name", SPLADE)
def test_splade_terms_are_those_of_sparse_encoder(name: str, session_graph_dir: str) -> None:
    ref = reference(name)
    model = encoder(name, "fp32", session_graph_dir)
    assert model.describe()["task"] == "sparse"
    weights = model.encode([str(text) for text in ref["texts"]])
    for got, want in zip(t.sparse_rows(weights), t.sparse_rows(ref["dense"]), strict=True):
        np.testing.assert_array_equal(got.indices, want.indices)
        # 1e-4 relative; a weight near 0 (log1p of a logit just above 0) to the fp32 noise of its logit
        np.testing.assert_allclose(got.values, want.values, rtol=1e-4, atol=5e-6)


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
@pytest.mark.parametrize(
    "name", ["rerank_bert", "rerank_xlm_roberta", "rerank_modernbert", "rerank_qwen3", "classify_distilbert"]
)
def test_bf16_and_int8_stay_close(name: str, dtype: str, session_graph_dir: str) -> None:
    ref = reference(name)
    model = encoder(name, dtype, session_graph_dir)
    if name.startswith("rerank"):
        got = model.encode(all_pairs(ref))[:, 0].reshape(ref["logits"].shape)
        want = ref["logits"]
    else:
        got, want = model.encode(t.predict_inputs([str(x) for x in ref["texts"]])), ref["logits"]
    # These random models magnify rounding far more than trained ones do (all-MiniLM-L6-v2's bf16
    # vectors are at cosine 0.99996): bounds on these, in units of the logits' spread.
    # Emulated bf16 (a CPU without bf16 instructions) rounds more: its bounds are looser (checks.bf16_bound).
    spread = float(np.std(want))
    most, least = (bf16_bound(0.1, 0.3), bf16_bound(0.9995, 0.995)) if dtype == "bf16" else (0.2, 0.995)
    assert float(np.max(np.abs(got - want))) < most * spread, name
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > least, name


def test_task_options_that_do_not_apply_are_refused(session_graph_dir: str) -> None:
    with pytest.raises(ModelError, match="pooling_strategy does not apply to a rerank model"):
        Encoder(DATA / "rerank_bert", pooling_strategy="REDUCE_MEAN", graph_dir=session_graph_dir)
    with pytest.raises(ModelError, match="long_inputs=chunk does not apply"):
        Encoder(DATA / "rerank_bert", long_inputs="chunk", graph_dir=session_graph_dir)
    with pytest.raises(ModelError, match="task=sparse needs a masked language model"):
        Encoder(DATA / "rerank_bert", task="sparse", graph_dir=session_graph_dir)


def test_a_reranker_serves_vectors_when_asked(session_graph_dir: str) -> None:
    model = Encoder(DATA / "rerank_bert", task="embed", graph_dir=session_graph_dir, dtype="fp32")
    assert model.describe()["task"] == "embed"
    assert model.encode(["a sentence"]).shape == (1, 32)


def test_a_yes_no_rerankers_instruction_is_the_one_asked_for(session_graph_dir: str) -> None:
    """Qwen3-Reranker's task instruction is part of its template: by default its model card's,
    or the one ``instruction`` names, as its model card writes a custom one in."""
    ref = reference("rerank_qwen3")
    meta = json.loads(str(ref["meta"]))
    custom = meta["scoring"]["custom_instruction"]
    model = Encoder(DATA / "rerank_qwen3", dtype="fp32", graph_dir=session_graph_dir, instruction=custom)
    logits = model.encode(all_pairs(ref))[:, 0].reshape(ref["scores_custom"].shape)
    np.testing.assert_allclose(t.activate(logits, "sigmoid"), ref["scores_custom"], atol=1e-4)
    assert np.abs(ref["scores_custom"] - ref["scores"]).max() > 0.1  # the instruction matters
    with pytest.raises(ModelError, match="instruction applies to a reranker that writes each pair"):
        Encoder(DATA / "rerank_bert", instruction=custom, graph_dir=session_graph_dir).encode(["a ||| b"])
