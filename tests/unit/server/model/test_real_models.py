"""Real weights of each family that the package index ships, against what sentence-transformers
computes for them (``tests/data/real/<name>.npz``, made by ``benchmarks/make_real_references.py``
with ``max_seq_length`` 128): the tokenizer's very ids, and min cosine 0.99999 in fp32, 0.999
in bf16 and 0.99 in int8 (mean 0.998) over the 130 sentences of ``tests/data/sentences.json``.

A model whose packages are not installed is skipped with the pip line that installs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bertserve.server import Encoder, ModelConfig
from bertserve.server.model.options import resolve_options
from checks import bf16_bound
from real_models import REAL_MODELS, RealModel

DATA = Path(__file__).resolve().parents[3] / "data" / "real"
MAX_SEQ_LEN = 128


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return float((a * b).sum(-1).min())


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return float((a * b).sum(-1).mean())


def reference(model: RealModel) -> dict[str, np.ndarray]:
    with np.load(DATA / f"{model.name}.npz") as data:
        return {key: data[key] for key in data.files}


def sentences() -> list[str]:
    return json.loads((DATA.parent / "sentences.json").read_text(encoding="utf-8"))


@pytest.fixture(
    scope="module", params=[m for m in REAL_MODELS if (DATA / f"{m.name}.npz").is_file()], ids=lambda m: m.name
)
def real_model(request) -> tuple[RealModel, str]:
    model: RealModel = request.param
    directory = model.find()
    if directory is None:
        pytest.skip(model.missing)
    return model, directory


def test_the_token_ids_are_the_models_own(real_model):
    model, directory = real_model
    ref = reference(model)
    _, tokenizer = resolve_options(ModelConfig.of(model_dir=directory, max_seq_len=MAX_SEQ_LEN))
    batch = tokenizer.tokenize(sentences())
    np.testing.assert_array_equal(batch.lengths, ref["hf_lengths_right128"])
    for row, length in enumerate(batch.lengths):
        np.testing.assert_array_equal(batch.input_ids[row, :length], ref["hf_ids_right128"][row, :length])
    np.testing.assert_array_equal(
        tokenizer.count_whole(sentences()), ref["hf_lengths"] - tokenizer.num_special_tokens()
    )


@pytest.mark.parametrize(
    ("dtype", "bound", "mean_bound"),
    [("fp32", 0.99999, 0.99999), ("bf16", bf16_bound(0.999, 0.997), bf16_bound(0.9999, 0.9995)), ("int8", 0.99, 0.998)],
)
def test_the_vectors_are_sentence_transformers(real_model, dtype, bound, mean_bound, session_graph_dir):
    model, directory = real_model
    ref = reference(model)
    encoder = Encoder(directory, max_seq_len=MAX_SEQ_LEN, dtype=dtype, graph_dir=session_graph_dir)
    vectors = encoder.encode(sentences())
    assert vectors.shape == ref["st_plain"].shape
    assert min_cosine(vectors, ref["st_plain"]) >= bound, model.family
    assert mean_cosine(vectors, ref["st_plain"]) >= mean_bound, model.family
