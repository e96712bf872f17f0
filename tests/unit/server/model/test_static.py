"""The static model (model2vec) against what model2vec 0.10's ``StaticModel.encode`` computes
for the tiny models of tests/data/static (benchmarks/make_static_references.py): every vector,
empty and over-long inputs among them; the options it refuses; and no TensorFlow anywhere on
its path, in the head's checks or the worker's model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bertserve.server.config.model import ModelConfig
from bertserve.server.errors import ModelError, ModelFileError
from bertserve.server.model.chunking import unit_rows
from bertserve.server.model.interface import Model
from bertserve.server.model.model_dir import inspect_model
from bertserve.server.model.options import resolve_options
from bertserve.server.model.static import StaticEncoder, is_static_model
from bertserve.server.serving.protocol.link_bodies import ModelInfo

DATA = Path(__file__).resolve().parents[3] / "data"
STATIC = DATA / "static"
NAMES = ("static_norm", "static_raw", "static_weighted")


def reference(name: str) -> tuple[list[str], dict[str, np.ndarray], dict]:
    meta = json.loads((STATIC / f"{name}.json").read_text(encoding="utf-8"))
    with np.load(STATIC / f"{name}.npz") as data:
        arrays = {key: data[key] for key in data.files}
    return meta["texts"], arrays, meta


def min_cosine(ours: np.ndarray, theirs: np.ndarray) -> float:
    """The least cosine over the rows; a row of zeros must be zeros in both."""
    a, b = np.linalg.norm(ours, axis=1), np.linalg.norm(theirs, axis=1)
    assert ((a == 0) == (b == 0)).all(), "rows of zeros differ"
    kept = a > 0
    return float(((ours * theirs).sum(axis=1)[kept] / (a[kept] * b[kept])).min())


@pytest.mark.parametrize("name", NAMES)
def test_vectors_are_model2vec_s(name: str) -> None:
    texts, ref, meta = reference(name)
    model = StaticEncoder(STATIC / name)
    raw = model.run(model.tokenize(texts))
    assert raw.shape == ref["raw"].shape and raw.dtype == np.float32
    assert min_cosine(raw, ref["raw"]) >= 0.99999
    np.testing.assert_allclose(raw, ref["raw"], atol=1e-4)
    vectors = unit_rows(raw) if meta["normalize"] else raw  # the sink's part, where the model normalizes
    assert min_cosine(vectors, ref["vectors"]) >= 0.99999
    empty = np.linalg.norm(ref["raw"], axis=1) == 0
    assert empty.sum() == 3 and not np.abs(raw[empty]).any()  # "", spaces, unknown characters only


@pytest.mark.parametrize("name", NAMES)
def test_encode_normalizes_as_the_model_says(name: str) -> None:
    texts, ref, meta = reference(name)
    model = StaticEncoder(STATIC / name)
    kept = [i for i, text in enumerate(texts) if text.strip()]  # encode refuses empty texts, as Encoder does
    vectors = model.encode([texts[i] for i in kept])
    assert min_cosine(vectors, ref["vectors"][kept]) >= 0.99999
    norms = np.linalg.norm(vectors, axis=1)
    if meta["normalize"]:  # all but the text of unknown characters, which no token is left of
        np.testing.assert_allclose(norms[norms > 0], 1, atol=1e-5)
    np.testing.assert_allclose(model.encode([texts[0]], normalize=False)[0], ref["raw"][0], atol=1e-5)


def test_long_inputs_are_cut_as_model2vec_cuts_them() -> None:
    texts, _, meta = reference("static_raw")
    model = StaticEncoder(STATIC / "static_raw")
    batch = model.tokenize([texts[-1], "short"], keep_tokens=True)
    assert batch.lengths.tolist()[0] == meta["max_length"] and batch.truncated.tolist() == [True, False]
    assert batch.tokens is not None and batch.tokens[1] == ["sh", "##or", "##t"]
    left = model.tokenize([texts[-1]], truncation_direction="left")
    assert left.truncated[0] and left.input_ids[0].tolist() != batch.input_ids[0].tolist()  # its end kept
    words = model.tokenize([["short", "zzzunknownzzz"]], is_tokenized=True)
    assert words.lengths[0] >= 2
    with pytest.raises(ValueError, match="long_inputs=chunk"):
        model.tokenize(["a"], chunk=True)


def test_it_is_a_model_and_describes_itself_as_the_link_allows() -> None:
    model = StaticEncoder(STATIC / "static_norm")
    assert isinstance(model, Model)
    described = model.describe()
    ModelInfo.model_validate(described)  # what a worker may say of its model
    assert described["output_dim"] == 32 and described["normalize"] is True and described["task"] == "embed"
    assert described["max_seq_len"] == 512 and not described["token_level"] and not described["chunking"]
    assert described["pads"] is False  # the head need not sort its bulk work by length
    batch = model.tokenize(["a b c", "a"])
    assert model.token_slots(batch) == int(batch.lengths.sum())
    assert [run.tolist() for run in model.plan(batch)] == [[0, 1]]


def test_detected_by_model_type_or_by_modules_json(tmp_path: Path) -> None:
    assert is_static_model(str(STATIC / "static_norm"))  # config.json: model_type model2vec
    assert is_static_model(str(STATIC / "static_raw"))  # modules.json: a StaticEmbedding in "."
    assert not is_static_model(str(DATA / "families" / "bert_st6"))
    assert not is_static_model(str(tmp_path))
    with pytest.raises(ModelFileError, match="static model"):
        inspect_model(ModelConfig.of(model_dir=str(STATIC / "static_norm")))


def test_head_resolves_options_and_counts_tokens_without_special_tokens() -> None:
    info, tokenizer = resolve_options(ModelConfig.of(model_dir=str(STATIC / "static_raw"), normalize=True))
    assert info["normalize"] is True and info["max_seq_len"] == 16 and info["family"] == "static"
    assert tokenizer.max_len == 16 and tokenizer.num_special_tokens() == 0
    assert tokenizer.count_tokens(["short", "word " * 40]).tolist() == [3, 16]
    info, _ = resolve_options(ModelConfig.of(model_dir=str(STATIC / "static_raw"), max_seq_len=8))
    assert info["max_seq_len"] == 8


@pytest.mark.parametrize(
    ("option", "named"),
    [
        ({"pooling_strategy": "CLS_TOKEN"}, "pooling_strategy"),
        ({"dtype": "int8"}, "dtype int8"),
        ({"dtype": "bf16"}, "dtype bf16"),
        ({"xla": True}, "xla"),
        ({"task": "rerank"}, "task rerank"),
        ({"long_inputs": "chunk"}, "long_inputs=chunk"),
        ({"mask_cls_sep": True}, "mask_cls_sep"),
        ({"max_seq_len": "NONE"}, "max_seq_len NONE"),
    ],
)
def test_options_for_a_graph_are_refused(option: dict, named: str) -> None:
    with pytest.raises(ModelError, match=named):
        StaticEncoder(STATIC / "static_norm", **option)
    with pytest.raises(ModelError, match=named):
        resolve_options(ModelConfig.of(model_dir=str(STATIC / "static_norm"), **option))


def test_ignored_options_are_taken() -> None:
    model = StaticEncoder(STATIC / "static_norm", dtype="fp32", graph_dir="/nonexistent", device="cpu", batch_size=8)
    assert model.describe()["output_dim"] == 32
    half = StaticEncoder(STATIC / "static_norm", output_dtype="float16")
    assert half.encode(["a b"]).dtype == np.float16


def test_no_tensorflow_on_the_static_path() -> None:
    """The head's checks, the worker's model and ``bertserve embed``'s opener, in a fresh
    interpreter: TensorFlow is never imported."""
    model_dir = STATIC / "static_norm"
    code = (
        "import sys\n"
        "from bertserve.server.config.model import ModelConfig\n"
        "from bertserve.server.model.options import resolve_options\n"
        "from bertserve.server.model.opening import open_model\n"
        "from bertserve.server.model.prepare import missing_steps\n"
        "import bertserve.server.serving.worker.worker\n"
        f"config = ModelConfig.of(model_dir={str(model_dir)!r})\n"
        "resolve_options(config)\n"
        "assert missing_steps(config) == []\n"
        "model = open_model(config.replace(device='cpu'))\n"
        "assert type(model).__name__ == 'StaticEncoder', type(model)\n"
        "model.run(model.tokenize(['no tensorflow here']))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'ai_edge_litert')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
