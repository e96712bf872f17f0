"""``dtype int8``: every run on LiteRT with int8 matrix weights, against fp32 on the tiny BERT
and against the reference numbers on all-MiniLM-L6-v2."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from bertserve.server import Encoder, ModelError
from bertserve.server.model import int8, lite
from bertserve.server.model.graph import read_cache
from checks import cosine_rows

TEXTS = [
    "the quick brown fox jumps over the lazy dog.",
    "hello world!",
    "a",
    "the dog , the fox and the world ?",
    "the fox ||| the dog",
    " ".join(["the quick brown fox"] * 20),
]
CORPUS = Path(__file__).resolve().parents[4] / "benchmarks" / "data" / "corpus-long.txt"


@pytest.fixture(scope="module")
def tiny_int8(tiny_google: str, session_graph_dir: str) -> Encoder:
    return Encoder(tiny_google, dtype="int8", graph_dir=session_graph_dir)


def test_every_run_goes_to_litert_and_stays_close_to_fp32(
    tiny_int8: Encoder, tiny_google: str, session_graph_dir: str
) -> None:
    fp32 = Encoder(tiny_google, dtype="fp32", lite_max_tokens=0, graph_dir=session_graph_dir)
    assert tiny_int8.describe()["dtype"] == "int8" and tiny_int8.describe()["runtime"] == "LiteRT"
    assert tiny_int8.describe()["lite_max_tokens"] == 0  # no size limit: every run is LiteRT's
    many = TEXTS * 30  # bulk runs of 64 rows, far above lite_max_tokens
    got, want = tiny_int8.encode(many), fp32.encode(many)
    assert got.shape == want.shape and got.dtype == np.float32
    assert cosine_rows(got, want).min() >= 0.99
    singles = np.concatenate([tiny_int8.encode([text]) for text in TEXTS])
    np.testing.assert_allclose(singles, got[: len(TEXTS)], atol=1e-5)  # the batch does not change a row


def test_int8_small_runs_go_to_an_interpreter_of_one_thread_of_their_own(
    tiny_google: str, session_graph_dir: str, monkeypatch
) -> None:
    monkeypatch.setattr(Encoder, "_threads", lambda self: 2)
    encoder = Encoder(tiny_google, dtype="int8", graph_dir=session_graph_dir)
    runner = encoder._lite
    assert isinstance(runner, lite.LiteRunner) and runner.one_thread_tokens == 64
    used: list[str] = []

    def counted(name: str):  # type: ignore[no-untyped-def]
        interpreter = getattr(runner, name)
        return lambda *arrays: used.append(name) or interpreter(*arrays)

    for name in ("_one", "_many"):
        monkeypatch.setattr(runner, name, counted(name))
    alone = np.concatenate([encoder.encode([text]) for text in TEXTS[:4]])  # each at most 16 padded tokens
    together = encoder.encode(TEXTS * 8)  # runs of up to 64 rows
    assert used[:4] == ["_one"] * 4 and set(used[4:]) == {"_many"}
    np.testing.assert_allclose(alone, together[:4], atol=1e-5)
    monkeypatch.setattr(Encoder, "_threads", lambda self: 1)
    single = Encoder(tiny_google, dtype="int8", graph_dir=session_graph_dir)._lite
    assert isinstance(single, lite.LiteRunner) and single._one is None  # one thread already: one interpreter


def test_int8_is_not_the_fp32_model(tiny_int8: Encoder, tiny_google: str, session_graph_dir: str) -> None:
    """The vectors differ from fp32's in the way rounding makes them differ: close, not equal."""
    fp32 = Encoder(tiny_google, lite_max_tokens=0, graph_dir=session_graph_dir)
    assert not np.array_equal(tiny_int8.encode(TEXTS), fp32.encode(TEXTS))
    assert tiny_int8.meta.key != fp32.meta.key


def test_token_vectors_and_other_poolings(tiny_google: str, session_graph_dir: str) -> None:
    for options in ({"pooling_strategy": "NONE"}, {"pooling_strategy": "CLS_TOKEN", "pooling_layer": [-2]}):
        quantized = Encoder(tiny_google, dtype="int8", graph_dir=session_graph_dir, **options)
        plain = Encoder(tiny_google, lite_max_tokens=0, graph_dir=session_graph_dir, **options)
        got, want = quantized.encode(TEXTS[:4]), plain.encode(TEXTS[:4])
        assert got.shape == want.shape
        assert cosine_rows(got, want).min() >= 0.99


def test_the_int8_model_is_cached_under_its_own_key(tiny_google: str, tmp_path) -> None:
    first = Encoder(tiny_google, dtype="int8", graph_dir=str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [f"{first.meta.key}.graph", f"{first.meta.key}.lite"]
    cached = (tmp_path / f"{first.meta.key}.lite").stat().st_mtime_ns
    second = Encoder(tiny_google, dtype="int8", graph_dir=str(tmp_path))
    assert (tmp_path / f"{first.meta.key}.lite").stat().st_mtime_ns == cached  # read, not converted again
    np.testing.assert_array_equal(first.encode(TEXTS), second.encode(TEXTS))


def test_tasks_and_mpnet_keep_the_query_key_and_value_product_in_fp32() -> None:
    assert int8.kept_float("bert", "embed") == ()
    assert int8.kept_float("roberta", "rerank") == int8.kept_float("bert", "classify") == ("*/qkv",)
    assert int8.kept_float("mpnet", "embed") == int8.kept_float("mpnet", "sparse") == ("*/qkv", "*/ffn_out")


def test_every_product_is_int8(tiny_google: str, tmp_path) -> None:
    encoder = Encoder(tiny_google, dtype="int8", graph_dir=str(tmp_path))
    cached = read_cache(str(tmp_path / f"{encoder.meta.key}.lite"), encoder.meta.key)
    assert cached is not None
    quantized = int8.products(bytes(cached[0]))
    assert {name.split("/")[1] for name in quantized} == {"qkv", "attn_out", "ffn_in", "ffn_out"}  # KEEP_FLOAT
    assert len(quantized) == 4 * encoder.meta.layers_run


def test_the_embedding_tables_stay_exact(tiny_google: str, tmp_path) -> None:
    """The converter stores the tables in int8 too; they are written back with the graph's
    own values and gathered as fp32, with no dequantization left."""
    from ai_edge_litert.tools import flatbuffer_utils

    encoder = Encoder(tiny_google, dtype="int8", graph_dir=str(tmp_path))
    cached = read_cache(str(tmp_path / f"{encoder.meta.key}.lite"), encoder.meta.key)
    assert cached is not None
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(bytes(cached[0])))
    graph = model.subgraphs[0]
    assert "DEQUANTIZE" not in {flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) for op in graph.operators}
    graph_def, _ = lite.read_graph_def(str(tmp_path), encoder.meta.key)
    want = {node.name: node for node in graph_def.node if node.name == "embeddings__word_embeddings"}
    table = next(t for t in graph.tensors if t.name == b"embeddings__word_embeddings")
    values = np.frombuffer(bytes(model.buffers[table.buffer].data), dtype=np.float32).reshape(table.shape)
    import tensorflow as tf

    np.testing.assert_array_equal(values, tf.make_ndarray(want["embeddings__word_embeddings"].attr["value"].tensor))


def test_restoring_every_product_gives_back_fp32_weights(tiny_google: str, session_graph_dir: str) -> None:
    encoder = Encoder(tiny_google, lite_max_tokens=0, graph_dir=session_graph_dir)
    graph_def, meta = lite.read_graph_def(session_graph_dir, encoder.meta.key)
    quantized = int8.convert(graph_def, meta, keep_float=())
    assert {name.split("/")[1] for name in int8.products(quantized)} >= {"qkv", "attn_out", "ffn_in", "ffn_out"}
    restored = int8.restore_float(quantized, lambda name: True)
    assert int8.products(restored) == []
    runner = lite.LiteRunner(restored, 1)
    batch = encoder.tokenize(TEXTS[:4])
    got = runner(batch.input_ids, batch.input_mask, batch.segment_ids)
    assert cosine_rows(got, encoder.encode(TEXTS[:4])).min() >= 0.999  # only the weights' rounding is left
    graph_def, meta = lite.read_graph_def(session_graph_dir, encoder.meta.key)
    exact = int8.exact_weights(graph_def, lambda name: True)
    assert {name.split("/")[1] for name in exact if "/" in name} == {"qkv", "attn_out", "ffn_in", "ffn_out"}
    exactly = lite.LiteRunner(int8.restore_float(quantized, lambda name: True, exact), 1)
    np.testing.assert_allclose(
        exactly(batch.input_ids, batch.input_mask, batch.segment_ids), encoder.encode(TEXTS[:4]), atol=2e-5
    )  # the graph's own weights: fp32's vectors


def test_int8_is_refused_on_a_gpu_and_without_litert(tiny_google: str, session_graph_dir: str, monkeypatch) -> None:
    with pytest.raises(ModelError, match="CPU only"):
        Encoder(tiny_google, dtype="int8", device="/GPU:0", graph_dir=session_graph_dir)
    with pytest.raises(ModelError, match="XLA"):
        Encoder(tiny_google, dtype="int8", xla=True, graph_dir=session_graph_dir)
    monkeypatch.setattr(lite, "available", lambda: False)
    with pytest.raises(ModelError, match="pip install ai-edge-litert"):
        Encoder(tiny_google, dtype="int8", graph_dir=session_graph_dir)


def test_a_graph_that_does_not_convert_is_a_clear_error(tiny_google: str, tmp_path, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("the converter found an op it does not know")

    monkeypatch.setattr(int8, "convert", broken)
    with pytest.raises(ModelError, match="does not convert to LiteRT's int8 form"):
        Encoder(tiny_google, dtype="int8", graph_dir=str(tmp_path))


# -- the real model ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_int8(minilm: str, session_graph_dir: str) -> Encoder:
    return Encoder(minilm, max_seq_len=128, dtype="int8", graph_dir=session_graph_dir)


@pytest.mark.minilm
def test_minilm_int8_against_the_reference(minilm_int8: Encoder, reference, reference_sentences) -> None:
    want = reference["REDUCE_MEAN_-1"] / np.linalg.norm(reference["REDUCE_MEAN_-1"], axis=1, keepdims=True)
    together = cosine_rows(minilm_int8.encode(reference_sentences), want)
    one_by_one = cosine_rows(np.concatenate([minilm_int8.encode([s]) for s in reference_sentences]), want)
    for similarity in (together, one_by_one):
        assert similarity.min() >= 0.99 and similarity.mean() >= 0.998, (similarity.min(), similarity.mean())


@pytest.mark.minilm
def test_minilm_int8_on_the_benchmark_corpus(minilm_int8: Encoder, minilm: str, session_graph_dir: str) -> None:
    """Sentences the model's reference never saw, 13 to 134 tokens, against fp32."""
    sentences = CORPUS.read_text(encoding="utf-8").splitlines()[::10]
    fp32 = Encoder(minilm, max_seq_len=128, dtype="fp32", lite_max_tokens=0, graph_dir=session_graph_dir)
    similarity = cosine_rows(minilm_int8.encode(sentences), fp32.encode(sentences))
    assert len(sentences) == 250
    assert similarity.min() >= 0.99 and similarity.mean() >= 0.998, (similarity.min(), similarity.mean())
