"""The tasks' answers without a model: rerank pairs and their refusals, activations, ranking,
sparse rows, compact forms (bit-identical to sentence-transformers' quantize_embeddings, kept in
tests/data/tasks/quantize.npz), and how a model's task is read from its files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bertserve.client import tasks as t
from bertserve.server.errors import ModelError, ModelFileError
from bertserve.server.model.tasks import read_task

DATA = Path(__file__).resolve().parents[3] / "data" / "tasks"


def test_rerank_pairs_write_the_query_as_one_sentence_before_each_document() -> None:
    pairs = t.rerank_pairs("what ||| is", ["a ||| b", "c"])
    assert pairs == ["what | | | is ||| a ||| b", "what | | | is ||| c"]


@pytest.mark.parametrize(
    ("query", "documents", "message"),
    [
        ("", ["a"], "query is empty"),
        ("   ", ["a"], "query is empty"),
        (3, ["a"], "query must be a string"),
        ("q", [], "documents is empty"),
        ("q", "a document", "documents must be a list"),
        ("q", ["a", ""], "documents[1] is empty"),
        ("q", ["a", None], "documents[1] must be a string"),
    ],
)
def test_rerank_pairs_name_what_is_wrong(query: object, documents: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        t.rerank_pairs(query, documents)


def test_activations_and_probabilities() -> None:
    logits = np.array([-2.0, 0.0, 3.0], np.float32)
    np.testing.assert_allclose(t.activate(logits, "sigmoid"), 1 / (1 + np.exp(-logits)), rtol=1e-6)
    np.testing.assert_array_equal(t.activate(logits, "identity"), logits)
    with pytest.raises(ValueError, match="unknown activation"):
        t.activate(logits, "softplus")
    probs = t.label_probabilities(np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], np.float32))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    assert probs[0].argmax() == 2
    np.testing.assert_allclose(t.label_probabilities(np.array([[0.0]], np.float32)), [[0.5]])


def test_ranking_is_highest_first_ties_in_input_order() -> None:
    assert t.ranking(np.array([0.1, 0.9, 0.1, 0.5])) == [1, 3, 0, 2]
    assert t.ranking(np.array([0.1, 0.9, 0.1, 0.5]), 2) == [1, 3]
    ranked = t.ranked(np.array([0.2, 0.8]), ["a", "b"])
    assert [(r.index, r.document) for r in ranked] == [(1, "b"), (0, "a")]
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="top_n"):
            t.check_top(bad, "top_n")


def test_sparse_rows_keep_the_non_zero_terms_and_the_top_k() -> None:
    weights = np.array([[0.0, 1.5, 0.0, 0.2, 3.0], [0.0] * 5], np.float32)
    rows = t.sparse_rows(weights)
    assert rows[0].indices.tolist() == [1, 3, 4]
    np.testing.assert_array_equal(rows[0].values, np.array([1.5, 0.2, 3.0], np.float32))
    assert rows[1].indices.tolist() == []
    top = t.sparse_rows(weights, top_k=2)
    assert top[0].as_dict() == {1: 1.5, 4: 3.0}


def test_predict_inputs_take_texts_and_pairs() -> None:
    assert t.predict_inputs(["a ||| b", ("c", "d")]) == ["a | | | b", "c ||| d"]
    for bad, message in (([("a", "")], r"inputs\[0\]\[1\] is empty"), (["a", 3], r"inputs\[1\]"), ("a", "list")):
        with pytest.raises(ValueError, match=message):
            t.predict_inputs(bad)


def test_embedding_types_are_checked() -> None:
    assert t.check_embedding_types("binary") == ("binary",)
    assert t.check_embedding_types(["float", "ubinary"]) == ("float", "ubinary")
    for bad in ([], "int4", ["float", "float"], [3], None):
        with pytest.raises(ValueError, match="embedding_types"):
            t.check_embedding_types(bad)


def test_int8_without_ranges_says_how_to_calibrate() -> None:
    with pytest.raises(ValueError, match="bertserve calibrate"):
        t.quantize(np.ones((1, 8), np.float32), "int8")


@pytest.mark.skipif(not (DATA / "quantize.npz").is_file(), reason="tests/data/tasks/quantize.npz is not there")
def test_compact_forms_are_those_of_sentence_transformers() -> None:
    ref = np.load(DATA / "quantize.npz")
    vectors = ref["float"]
    for kind in ("binary", "ubinary"):
        got = t.quantize(vectors, kind)
        assert got.dtype == ref[kind].dtype
        np.testing.assert_array_equal(got, ref[kind])
    ranges = ref["ranges"]
    inside = ((vectors >= ranges[0]) & (vectors <= ranges[1])).all(axis=1)
    assert inside.sum() >= 100  # the calibration rows at least
    for kind in ("int8", "uint8"):
        got = t.quantize(vectors, kind, ranges)
        assert got.dtype == ref[kind].dtype
        np.testing.assert_array_equal(got[inside], ref[kind][inside])
        low, high = (-128, 127) if kind == "int8" else (0, 255)
        assert got.min() >= low and got.max() <= high  # clipped, never wrapped


def _model_dir(tmp_path: Path, config: dict, modules: list | None = None) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    if modules is not None:
        (tmp_path / "modules.json").write_text(json.dumps(modules))
    return str(tmp_path)


def test_a_task_is_read_from_the_architecture(tmp_path: Path) -> None:
    ce = _model_dir(tmp_path, {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}})
    head = read_task(ce, "bert", None)
    assert (head.task, head.labels, head.activation) == ("rerank", ("LABEL_0",), "sigmoid")
    cl = _model_dir(
        tmp_path,
        {
            "architectures": ["XLMRobertaForSequenceClassification"],
            "id2label": {"1": "pos", "0": "neg"},
            "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"},
        },
    )
    assert read_task(cl, "roberta", None).labels == ("neg", "pos")
    assert read_task(cl, "roberta", None).task == "classify"
    assert read_task(cl, "roberta", "embed").task == "embed"  # its encoder serves vectors too
    mlm = _model_dir(tmp_path, {"architectures": ["BertForMaskedLM"]})
    assert read_task(mlm, "bert", None).task == "sparse"
    pooled = _model_dir(
        tmp_path,
        {"architectures": ["BertForMaskedLM"]},
        [{"type": "sentence_transformers.models.Pooling", "path": "1"}],
    )
    assert read_task(pooled, "bert", None).task == "embed"


def test_a_task_the_model_cannot_do_is_refused_with_what_it_is(tmp_path: Path) -> None:
    encoder = _model_dir(tmp_path, {"architectures": ["BertModel"]})
    with pytest.raises(ModelError, match=r"needs a sequence classification model.*BertModel"):
        read_task(encoder, "bert", "rerank")
    with pytest.raises(ModelError, match="needs a masked language model"):
        read_task(encoder, "bert", "sparse")
    classifier = _model_dir(tmp_path, {"architectures": ["BertForSequenceClassification"], "num_labels": 3})
    with pytest.raises(ModelError, match=r"3 labels.*task=classify"):
        read_task(classifier, "bert", "rerank")
    mpnet = _model_dir(tmp_path, {"architectures": ["MPNetForMaskedLM"]})
    with pytest.raises(ModelError, match="task=sparse runs bert, distilbert, roberta"):
        read_task(mpnet, "mpnet", None)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"architectures": ["BertForSequenceClassification"], "id2label": {"a": "x"}}, "id2label"),
        ({"architectures": ["BertForSequenceClassification"], "id2label": {"1": "x"}}, "id2label"),
        ({"architectures": ["BertForSequenceClassification"], "num_labels": 0}, "num_labels"),
        ({"architectures": ["BertForSequenceClassification"], "num_labels": 10**9}, "num_labels"),
        (
            {
                "architectures": ["BertForSequenceClassification"],
                "num_labels": 1,
                "sentence_transformers": {"activation_fn": "torch.nn.Softplus"},
            },
            "activation",
        ),
    ],
)
def test_a_damaged_task_config_is_refused(tmp_path: Path, config: dict, message: str) -> None:
    with pytest.raises((ModelError, ModelFileError), match=message):
        read_task(_model_dir(tmp_path, config), "bert", None)
