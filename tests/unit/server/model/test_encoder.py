"""The Encoder on a tiny BERT the tests write, checked against an independent numpy BERT."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from bertserve.server import Encoder, ModelError
from bertserve.server.testing import tiny_bert
from checks import cosine_rows

TEXTS = [
    "the quick brown fox jumps over the lazy dog.",
    "hello world!",
    "a",
    "the dog , the fox and the world ?",
    "你好 世界",
    "the fox ||| the dog",
]


def _expected(directory: str, encoder: Encoder, texts: list[str]) -> list[np.ndarray]:
    """Every layer's hidden states for ``texts`` from the numpy reference model."""
    config, weights = tiny_bert.make_weights(seed=1)
    batch = encoder.tokenize(texts)
    return tiny_bert.reference_forward(config, weights, batch.input_ids, batch.segment_ids, batch.lengths)


def _pool(hidden: np.ndarray, lengths: np.ndarray, strategy: str) -> np.ndarray:
    rows = []
    for h, n in zip(hidden, lengths, strict=True):
        real = h[:n]
        rows.append(
            {
                "REDUCE_MEAN": real.mean(0),
                "REDUCE_MAX": real.max(0),
                "REDUCE_MEAN_MAX": np.concatenate([real.mean(0), real.max(0)]),
                "CLS_TOKEN": real[0],
                "SEP_TOKEN": real[-1],
            }[strategy]
        )
    return np.stack(rows)


@pytest.mark.parametrize("strategy", ["REDUCE_MEAN", "REDUCE_MAX", "REDUCE_MEAN_MAX", "CLS_TOKEN", "SEP_TOKEN"])
@pytest.mark.parametrize("layer", [-1, -2, 0])
def test_pooling_matches_numpy_bert(tiny_google: str, session_graph_dir: str, strategy: str, layer: int) -> None:
    encoder = Encoder(tiny_google, pooling_strategy=strategy, pooling_layer=layer, graph_dir=session_graph_dir)
    got = encoder.encode(TEXTS)
    hidden = _expected(tiny_google, encoder, TEXTS)[layer]
    want = _pool(hidden, encoder.tokenize(TEXTS).lengths, strategy)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


def test_first_and_last_token_are_aliases(tiny_google: str, session_graph_dir: str) -> None:
    first = Encoder(tiny_google, pooling_strategy="FIRST_TOKEN", graph_dir=session_graph_dir)
    cls = Encoder(tiny_google, pooling_strategy="cls_token", graph_dir=session_graph_dir)
    last = Encoder(tiny_google, pooling_strategy="LAST_TOKEN", graph_dir=session_graph_dir)
    sep = Encoder(tiny_google, pooling_strategy="SEP_TOKEN", graph_dir=session_graph_dir)
    np.testing.assert_array_equal(first.encode(TEXTS), cls.encode(TEXTS))
    np.testing.assert_array_equal(last.encode(TEXTS), sep.encode(TEXTS))


def test_cls_pooled_is_the_pooler_of_the_last_layer(tiny_google: str, session_graph_dir: str) -> None:
    encoder = Encoder(tiny_google, pooling_strategy="CLS_POOLED", graph_dir=session_graph_dir)
    _, weights = tiny_bert.make_weights(seed=1)
    cls = _expected(tiny_google, encoder, TEXTS)[-1][:, 0]
    want = np.tanh(cls @ weights["bert/pooler/dense/kernel"] + weights["bert/pooler/dense/bias"])
    np.testing.assert_allclose(encoder.encode(TEXTS), want, atol=2e-5)
    with pytest.raises(ModelError, match="last layer"):
        Encoder(tiny_google, pooling_strategy="CLS_POOLED", pooling_layer=-2, graph_dir=session_graph_dir)


def test_cls_pooled_without_pooler_weights_is_refused(tmp_path: str, session_graph_dir: str) -> None:
    directory = tiny_bert.write_tiny_bert(str(tmp_path), "huggingface", seed=1, with_pooler=False)
    with pytest.raises(ModelError, match="pooler"):
        Encoder(directory, pooling_strategy="CLS_POOLED", graph_dir=session_graph_dir)
    assert Encoder(directory, graph_dir=session_graph_dir).encode(["hello"]).shape == (1, 32)


def test_none_pooling_gives_token_vectors_with_zero_padding(tiny_google: str, session_graph_dir: str) -> None:
    encoder = Encoder(
        tiny_google, pooling_strategy="NONE", pooling_layer=-1, max_seq_len=16, graph_dir=session_graph_dir
    )
    got = encoder.encode(TEXTS)
    lengths = encoder.tokenize(TEXTS).lengths
    hidden = _expected(tiny_google, encoder, TEXTS)[-1]
    assert got.shape == (len(TEXTS), 16, 32)
    for row, n in enumerate(lengths):
        np.testing.assert_allclose(got[row, :n], hidden[row, :n], atol=2e-5)
        assert not got[row, n:].any()


def test_dynamic_max_seq_len_pads_to_the_longest(tiny_google: str, session_graph_dir: str) -> None:
    encoder = Encoder(tiny_google, pooling_strategy="NONE", max_seq_len="NONE", graph_dir=session_graph_dir)
    got = encoder.encode(TEXTS)
    assert got.shape[1] == max(encoder.tokenize(TEXTS).lengths)
    assert encoder.max_len == 64  # the model's position embeddings


def test_concatenated_layers_and_mask_cls_sep(tiny_google: str, session_graph_dir: str) -> None:
    encoder = Encoder(
        tiny_google,
        pooling_layer=[-1, -3],
        mask_cls_sep=True,
        pooling_strategy="REDUCE_MEAN",
        graph_dir=session_graph_dir,
    )
    got = encoder.encode(TEXTS)
    assert got.shape == (len(TEXTS), 64)
    hidden = _expected(tiny_google, encoder, TEXTS)
    lengths = encoder.tokenize(TEXTS).lengths
    for half, layer in ((got[:, :32], -1), (got[:, 32:], -3)):
        want = [hidden[layer][i, 1 : n - 1].mean(0) if n > 2 else np.zeros(32) for i, n in enumerate(lengths)]
        np.testing.assert_allclose(half, np.stack(want), atol=2e-5)


def test_normalize_and_float16_output(tiny_google: str, session_graph_dir: str) -> None:
    encoder = Encoder(tiny_google, normalize=True, output_dtype="float16", graph_dir=session_graph_dir)
    got = encoder.encode(TEXTS)
    assert got.dtype == np.float16
    np.testing.assert_allclose(np.linalg.norm(got.astype(np.float32), axis=1), 1.0, atol=2e-3)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_reduced_precision_stays_close(tiny_google: str, session_graph_dir: str, dtype: str) -> None:
    full = Encoder(tiny_google, graph_dir=session_graph_dir).encode(TEXTS)
    low = Encoder(tiny_google, dtype=dtype, graph_dir=session_graph_dir).encode(TEXTS)
    assert low.dtype == np.float32
    assert cosine_rows(full, low).min() >= 0.999


def test_both_layouts_give_the_same_vectors(tiny_google: str, tiny_hf: str, session_graph_dir: str) -> None:
    google = Encoder(tiny_google, pooling_layer=-1, graph_dir=session_graph_dir)
    hf = Encoder(
        tiny_hf,
        pooling_layer=-1,
        normalize=False,
        pooling_strategy="REDUCE_MEAN",
        graph_dir=session_graph_dir,
    )
    np.testing.assert_allclose(google.encode(TEXTS), hf.encode(TEXTS), atol=1e-6)


def test_tuned_checkpoint_overrides_the_weights(tiny_google: str, tmp_path, session_graph_dir: str) -> None:
    tuned_dir = str(tmp_path / "tuned")
    config, _ = tiny_bert.make_weights(seed=1)
    _, tuned_weights = tiny_bert.make_weights(seed=7)
    tiny_bert.write_google_checkpoint(tuned_dir, config, tuned_weights, ckpt_name="model.ckpt-100", extra_vars=True)
    base = Encoder(tiny_google, graph_dir=session_graph_dir).encode(TEXTS)
    tuned = Encoder(
        tiny_google, tuned_model_dir=tuned_dir, ckpt_name="model.ckpt-100", graph_dir=session_graph_dir
    ).encode(TEXTS)
    assert cosine_rows(base, tuned).max() < 0.99
    # The tuned weights alone, written as a base model, give exactly the tuned vectors.
    alone = tiny_bert.write_tiny_bert(str(tmp_path / "alone"), "google", seed=7)
    np.testing.assert_allclose(Encoder(alone, graph_dir=session_graph_dir).encode(TEXTS), tuned, atol=1e-6)


def test_sentence_transformers_defaults(tmp_path, session_graph_dir: str) -> None:
    directory = tiny_bert.write_tiny_bert(str(tmp_path), "huggingface", seed=1, sentence_transformers=True)
    encoder = Encoder(directory, graph_dir=session_graph_dir)
    assert encoder.config.max_seq_len == 48
    assert encoder.config.pooling_strategy.value == "REDUCE_MEAN"
    assert encoder.config.pooling_layer == (-1,) and encoder.config.normalize
    plain = Encoder(directory, pooling_layer=-1, normalize=False, graph_dir=session_graph_dir).encode(TEXTS)
    want = plain / np.linalg.norm(plain, axis=1, keepdims=True)
    np.testing.assert_allclose(encoder.encode(TEXTS), want, atol=1e-6)


def test_plain_bert_gets_bert_as_service_defaults(tiny_google: str, session_graph_dir: str) -> None:
    config = Encoder(tiny_google, graph_dir=session_graph_dir).config
    assert (config.max_seq_len, config.pooling_layer, config.normalize) == (25, (-2,), False)
    assert config.pooling_strategy.value == "REDUCE_MEAN"


def test_pruning_drops_the_layers_above_the_deepest_pooled_one(tiny_google: str, session_graph_dir: str) -> None:
    import tensorflow as tf
    from bertserve.server.model.graph import encoder_layers_in

    def layers(**options: object) -> set[int]:
        encoder = Encoder(tiny_google, graph_dir=session_graph_dir, **options)
        graph_def = tf.compat.v1.GraphDef()
        with open(encoder.graph_path, "rb") as f:
            blob = f.read()
        graph_def.ParseFromString(blob[-encoder.graph_size :])
        assert encoder.meta.layers_run == len(encoder_layers_in(graph_def))
        return encoder_layers_in(graph_def)

    assert layers(pooling_layer=-1) == {0, 1, 2}
    assert layers(pooling_layer=-2) == {0, 1}
    assert layers(pooling_layer=0) == {0}
    assert layers(pooling_layer=[0, -2]) == {0, 1}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_matrix_products_read_their_weights_straight_from_constants(
    tiny_google: str, session_graph_dir: str, dtype: str
) -> None:
    """oneDNN caches a weight's reordered copy only when it comes from a Const node."""
    import tensorflow as tf

    encoder = Encoder(tiny_google, graph_dir=session_graph_dir, dtype=dtype)
    graph_def = tf.compat.v1.GraphDef()
    with open(encoder.graph_path, "rb") as f:
        graph_def.ParseFromString(f.read()[-encoder.graph_size :])
    ops = {node.name: node.op for node in graph_def.node}
    weights = [node.input[1].split(":")[0] for node in graph_def.node if node.op == "MatMul"]
    assert weights and all(ops[name] == "Const" for name in weights), [ops[name] for name in weights]
    assert not [n.name for n in graph_def.node if n.op == "Identity" and ops[n.input[0].split(":")[0]] == "Const"]


def test_the_graph_cache_is_reused_and_survives_damage(tiny_google: str, tmp_path) -> None:
    graph_dir = str(tmp_path / "graphs")
    first = Encoder(tiny_google, graph_dir=graph_dir)
    assert first.graph_built
    second = Encoder(tiny_google, graph_dir=graph_dir)
    assert not second.graph_built and second.graph_path == first.graph_path
    # The graph and its LiteRT conversion for small runs, and no temporary left behind.
    assert sorted(os.listdir(graph_dir)) == [f"{first.meta.key}.graph", f"{first.meta.key}.lite"]
    other = Encoder(tiny_google, graph_dir=graph_dir, pooling_layer=-1)
    assert other.graph_built and other.graph_path != first.graph_path

    with open(first.graph_path, "r+b") as f:  # truncate it, as a crash mid-copy would
        f.truncate(os.path.getsize(first.graph_path) // 2)
    rebuilt = Encoder(tiny_google, graph_dir=graph_dir)
    assert rebuilt.graph_built
    np.testing.assert_array_equal(rebuilt.encode(TEXTS), first.encode(TEXTS))
    with open(first.graph_path, "wb") as f:
        f.write(b"garbage")
    assert Encoder(tiny_google, graph_dir=graph_dir).graph_built


def test_changed_weights_change_the_cache_key(tmp_path) -> None:
    graph_dir = str(tmp_path / "graphs")
    a = tiny_bert.write_tiny_bert(str(tmp_path / "a"), "huggingface", seed=1)
    b = tiny_bert.write_tiny_bert(str(tmp_path / "b"), "huggingface", seed=2)
    assert Encoder(a, graph_dir=graph_dir).meta.key != Encoder(b, graph_dir=graph_dir).meta.key


def test_xla_compiled_graph_gives_the_same_vectors(tiny_google: str, session_graph_dir: str) -> None:
    plain = Encoder(tiny_google, graph_dir=session_graph_dir).encode(TEXTS)
    xla = Encoder(tiny_google, xla=True, graph_dir=session_graph_dir).encode(TEXTS)
    np.testing.assert_allclose(xla, plain, atol=1e-5)


def test_long_input_is_truncated_and_reported(tiny_google: str, session_graph_dir: str) -> None:
    encoder = Encoder(tiny_google, max_seq_len=8, graph_dir=session_graph_dir)
    texts = ["the quick brown fox jumps over the lazy dog", "hello"]
    vectors, tokens = encoder.encode(texts, show_tokens=True)
    assert vectors.shape == (2, 32)
    assert len(tokens[0]) == 8 and tokens[0][0] == "[CLS]" and tokens[0][-1] == "[SEP]"
    assert tokens[1] == ["[CLS]", "hello", "[SEP]"]
    assert encoder.tokenize(texts).truncated.tolist() == [True, False]


def test_pretokenized_input(tiny_google: str, session_graph_dir: str) -> None:
    encoder = Encoder(tiny_google, graph_dir=session_graph_dir)
    from_text = encoder.encode(["hello world !", "the fox ||| the dog"])
    from_tokens = encoder.encode([["hello", "world", "!"], ["the", "fox", "|||", "the", "dog"]], is_tokenized=True)
    np.testing.assert_allclose(from_tokens, from_text, atol=1e-6)


def test_batching_does_not_change_results(tiny_google: str, session_graph_dir: str) -> None:
    texts = [" ".join(["the dog"] * (i % 9 + 1)) for i in range(50)]
    small = Encoder(tiny_google, batch_size=3, graph_dir=session_graph_dir).encode(texts)
    whole = Encoder(tiny_google, batch_size=128, graph_dir=session_graph_dir).encode(texts)
    one_by_one = np.concatenate(
        [whole[:0]] + [Encoder(tiny_google, graph_dir=session_graph_dir).encode([t]) for t in texts[:5]]
    )
    np.testing.assert_allclose(small, whole, atol=1e-5)
    np.testing.assert_allclose(one_by_one, whole[:5], atol=1e-5)
    # Seventeen runs, two at a time on TensorFlow (Encoder._runner): each row written by its own run.
    side_by_side = Encoder(tiny_google, batch_size=3, lite_max_tokens=0, graph_dir=session_graph_dir)
    assert len(side_by_side.plan(side_by_side.tokenize(texts))) >= 17
    np.testing.assert_allclose(side_by_side.encode(texts), whole, atol=1e-5)


def test_empty_and_bad_inputs(tiny_google: str, session_graph_dir: str) -> None:
    encoder = Encoder(tiny_google, graph_dir=session_graph_dir)
    empty = encoder.encode([])
    assert empty.shape == (0, 32) and empty.dtype == np.float32
    with pytest.raises(ValueError, match=r"texts\[1\] is empty"):
        encoder.encode(["hello", ""])
    with pytest.raises(ValueError, match=r"texts\[2\] is empty"):
        encoder.encode(["hello", "world", "   \t"])
    with pytest.raises(ValueError, match=r"texts\[1\] must be a string, not int"):
        encoder.encode(["hello", 3])
    with pytest.raises(ValueError, match=r"texts\[0\] must be a string, not NoneType"):
        encoder.encode([None])
    with pytest.raises(TypeError, match="list of strings"):
        encoder.encode("hello")
    with pytest.raises(ValueError, match=r"texts\[0\] is a sentence pair with an empty side"):
        encoder.encode(["hello |||  "])
    with pytest.raises(ValueError, match=r"texts\[0\]\[1\]"):
        encoder.encode([["hello", ""]], is_tokenized=True)
    with pytest.raises(ValueError, match=r"texts\[1\] is an empty token list"):
        encoder.encode([["hello"], []], is_tokenized=True)


def test_option_errors_name_the_problem(tiny_google: str, session_graph_dir: str) -> None:
    with pytest.raises(ModelError, match="max_seq_len 65 is above the 64 tokens the model's positions allow"):
        Encoder(tiny_google, max_seq_len=65, graph_dir=session_graph_dir)
    with pytest.raises(ModelError, match="pooling_layer -4 is out of range"):
        Encoder(tiny_google, pooling_layer=-4, graph_dir=session_graph_dir)
    with pytest.raises(ModelError, match="unknown pooling_strategy"):
        Encoder(tiny_google, pooling_strategy="AVERAGE", graph_dir=session_graph_dir)
    with pytest.raises(ModelError, match="unknown dtype"):
        Encoder(tiny_google, dtype="int4", graph_dir=session_graph_dir)
    with pytest.raises(TypeError, match="pooling_stratgy"):
        Encoder(tiny_google, pooling_stratgy="NONE")


def test_vocabulary_larger_than_the_embeddings_is_refused(tmp_path, session_graph_dir: str) -> None:
    directory = tiny_bert.write_tiny_bert(str(tmp_path), "google", seed=1)
    with open(os.path.join(directory, "vocab.txt"), "a", encoding="utf-8") as f:
        f.write("extra\nwords\n")
    with pytest.raises(ModelError, match=r"vocab\.txt has 282 tokens but the model embeds only vocab_size=280"):
        Encoder(directory, graph_dir=session_graph_dir)


def test_weight_shape_disagreeing_with_config(tmp_path, session_graph_dir: str) -> None:
    directory = tiny_bert.write_tiny_bert(str(tmp_path), "huggingface", seed=1)
    path = os.path.join(directory, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["intermediate_size"] = 48
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    with pytest.raises(ModelError, match=r"intermediate/dense/kernel has shape \(32, 64\), but the config implies"):
        Encoder(directory, graph_dir=session_graph_dir)


@pytest.mark.parametrize("strategy", ["REDUCE_MEAN", "SEP_TOKEN", "NONE", "CLS_POOLED"])
def test_small_runs_on_litert_give_tensorflows_vectors(tiny_google: str, session_graph_dir: str, strategy: str) -> None:
    options = {"pooling_strategy": strategy, "max_seq_len": 32, "graph_dir": session_graph_dir}
    lite = Encoder(tiny_google, lite_max_tokens=10_000, **options)
    plain = Encoder(tiny_google, lite_max_tokens=0, **options)
    assert lite.uses_lite and not plain.uses_lite
    assert lite.describe()["lite_max_tokens"] == 10_000 and plain.describe()["lite_max_tokens"] == 0
    for text in TEXTS:  # one at a time: lengths that are and are not a multiple of the padding step
        np.testing.assert_allclose(lite.encode([text]), plain.encode([text]), atol=2e-5)
    np.testing.assert_allclose(lite.encode(TEXTS), plain.encode(TEXTS), atol=2e-5)


def test_litert_takes_only_small_fp32_cpu_runs(tiny_google: str, session_graph_dir: str, monkeypatch) -> None:
    assert Encoder(tiny_google, graph_dir=session_graph_dir).uses_lite  # on by default
    assert not Encoder(tiny_google, dtype="bf16", graph_dir=session_graph_dir).uses_lite
    assert not Encoder(tiny_google, xla=True, graph_dir=session_graph_dir).uses_lite
    encoder = Encoder(tiny_google, lite_max_tokens=8, graph_dir=session_graph_dir)
    calls: list[tuple[int, ...]] = []
    runner = encoder._lite
    monkeypatch.setattr(
        encoder, "_lite", lambda ids, mask, segments: calls.append(ids.shape) or runner(ids, mask, segments)
    )
    encoder.encode(["a"])  # [CLS] a [SEP]: 3 tokens, padded to 8
    encoder.encode(["the quick brown fox jumps over the lazy dog."])  # 12 tokens: TensorFlow
    assert calls == [(1, 8)]


def test_auto_bf16_gives_small_runs_to_litert_in_fp32(tiny_google: str, tmp_path, monkeypatch) -> None:
    """Where auto picks bf16, a lone sentence runs in fp32 on LiteRT (faster there, and more
    accurate than bf16) and a bulk run in bf16 on TensorFlow; a bf16 the user names stays bf16."""
    monkeypatch.setenv("BERTSERVE_CPU_FLAGS", "avx512f amx_bf16")
    graph_dir = str(tmp_path)
    auto = Encoder(tiny_google, graph_dir=graph_dir, max_seq_len=32)
    fp32 = Encoder(tiny_google, graph_dir=graph_dir, max_seq_len=32, dtype="fp32", lite_max_tokens=0)
    bf16 = Encoder(tiny_google, graph_dir=graph_dir, max_seq_len=32, dtype="bf16")
    described = auto.describe()
    assert (described["dtype"], described["dtype_requested"]) == ("bf16", "auto")
    assert (described["small_run_dtype"], described["lite_max_tokens"]) == ("fp32", 64)
    assert described["runtime"] == "TensorFlow and LiteRT"
    assert not bf16.uses_lite and "small_run_dtype" not in bf16.describe()
    # The fp32 graph's LiteRT form sits beside the bf16 graph, under the fp32 graph's key.
    assert f"{fp32.meta.key}.lite" in os.listdir(graph_dir)
    for text in TEXTS:  # one sentence: fp32's vectors
        np.testing.assert_allclose(auto.encode([text]), fp32.encode([text]), atol=2e-5)
    batch = TEXTS * 8  # past 64 tokens: bf16's vectors
    np.testing.assert_array_equal(auto.encode(batch), bf16.encode(batch))
    monkeypatch.setenv("BERTSERVE_CPU_FLAGS", "avx2 fma")
    assert "small_run_dtype" not in Encoder(tiny_google, graph_dir=graph_dir).describe()  # auto is fp32 there


def test_a_damaged_litert_cache_is_converted_again(tiny_google: str, tmp_path) -> None:
    graph_dir = str(tmp_path / "graphs")
    first = Encoder(tiny_google, graph_dir=graph_dir)
    want = first.encode(TEXTS[:2])
    lite_path = os.path.join(graph_dir, f"{first.meta.key}.lite")
    with open(lite_path, "r+b") as f:
        f.truncate(os.path.getsize(lite_path) // 2)
    again = Encoder(tiny_google, graph_dir=graph_dir)
    assert again.uses_lite and not again.graph_built
    np.testing.assert_array_equal(again.encode(TEXTS[:2]), want)


def test_a_litert_failure_falls_back_to_tensorflow(tiny_google: str, session_graph_dir: str, monkeypatch) -> None:
    encoder = Encoder(tiny_google, graph_dir=session_graph_dir)
    want = Encoder(tiny_google, lite_max_tokens=0, graph_dir=session_graph_dir).encode(["hello world!"])

    def broken(*arrays: np.ndarray) -> np.ndarray:
        raise RuntimeError("tensor allocation failed")

    monkeypatch.setattr(encoder, "_lite", broken)
    np.testing.assert_allclose(encoder.encode(["hello world!"]), want, atol=1e-6)
    assert not encoder.uses_lite  # and it stays on TensorFlow
