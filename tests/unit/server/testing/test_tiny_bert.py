"""Checks of the tiny-BERT test helper itself: its files, names, transposes and reference forward pass."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from bertserve.server.testing import tiny_bert


@pytest.fixture(scope="module")
def tiny() -> tuple[dict, dict[str, np.ndarray]]:
    return tiny_bert.make_weights(seed=3)


def test_make_weights_names_shapes_and_config(tiny: tuple[dict, dict[str, np.ndarray]]) -> None:
    config, weights = tiny
    h, inter = config["hidden_size"], config["intermediate_size"]
    assert config["vocab_size"] == len(tiny_bert.tiny_vocab())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertModel"]
    assert weights["bert/embeddings/word_embeddings"].shape == (config["vocab_size"], h)
    assert weights["bert/embeddings/position_embeddings"].shape == (config["max_position_embeddings"], h)
    assert weights["bert/encoder/layer_2/intermediate/dense/kernel"].shape == (h, inter)
    assert weights["bert/encoder/layer_2/output/dense/kernel"].shape == (inter, h)
    assert weights["bert/pooler/dense/bias"].shape == (h,)
    assert len(weights) == 5 + 16 * config["num_hidden_layers"] + 2
    assert all(v.dtype == np.float32 for v in weights.values())
    again = tiny_bert.make_weights(seed=3)[1]
    assert all(np.array_equal(weights[k], again[k]) for k in weights)
    assert "bert/pooler/dense/kernel" not in tiny_bert.make_weights(with_pooler=False)[1]


def test_vocab_is_uncased_and_unique(tmp_path) -> None:
    tokens = tiny_bert.write_vocab(str(tmp_path))
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(tokens) == len(set(tokens))
    assert {"the", "fox", "##ing", "##a", ",", "##,", "你"} <= set(tokens)
    assert not any(t[:1].isupper() for t in tokens if not t.startswith("["))
    assert (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines() == tokens


def test_google_checkpoint_names_round_trip(tmp_path, tiny: tuple[dict, dict[str, np.ndarray]]) -> None:
    import tensorflow as tf

    config, weights = tiny
    prefix = tiny_bert.write_google_checkpoint(str(tmp_path), config, weights, extra_vars=True)
    assert prefix == str(tmp_path / "bert_model.ckpt")
    assert sorted(os.listdir(tmp_path)) == [
        "bert_config.json",
        "bert_model.ckpt.data-00000-of-00001",
        "bert_model.ckpt.index",
        "vocab.txt",
    ]
    reader = tf.train.load_checkpoint(prefix)
    names = set(reader.get_variable_to_shape_map())
    extras = {"output_weights", "output_bias", "global_step"}
    extras |= {"bert/encoder/layer_0/attention/self/query/kernel/adam_m", "bert/pooler/dense/bias/adam_v"}
    assert extras <= names
    assert {n for n in names if not n.endswith(("/adam_m", "/adam_v"))} - extras == set(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(reader.get_tensor(name), value)
    saved = json.loads((tmp_path / "bert_config.json").read_text())
    assert "model_type" not in saved and saved["num_hidden_layers"] == config["num_hidden_layers"]


def test_huggingface_files_have_hf_names(tmp_path, tiny: tuple[dict, dict[str, np.ndarray]]) -> None:
    from safetensors.numpy import load_file

    config, weights = tiny
    tiny_bert.write_huggingface(str(tmp_path), config, weights)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    expected = {
        "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight",
        "embeddings.LayerNorm.weight",
        "embeddings.LayerNorm.bias",
        "embeddings.position_ids",
        "pooler.dense.weight",
        "pooler.dense.bias",
    }
    for i in range(config["num_hidden_layers"]):
        for part in (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
            "attention.output.LayerNorm",
            "intermediate.dense",
            "output.dense",
            "output.LayerNorm",
        ):
            expected |= {f"encoder.layer.{i}.{part}.weight", f"encoder.layer.{i}.{part}.bias"}
    assert set(tensors) == expected
    assert tensors["embeddings.position_ids"].dtype == np.int64
    assert tensors["embeddings.position_ids"].shape == (1, config["max_position_embeddings"])
    h, inter = config["hidden_size"], config["intermediate_size"]
    assert tensors["encoder.layer.0.intermediate.dense.weight"].shape == (inter, h)
    assert tensors["encoder.layer.0.output.dense.weight"].shape == (h, inter)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "bert"
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == {"do_lower_case": True}


def test_both_layouts_hold_the_same_numbers(tmp_path) -> None:
    import tensorflow as tf
    from safetensors.numpy import load_file

    google = tiny_bert.write_tiny_bert(str(tmp_path / "g"), "google", seed=5, num_layers=2)
    hf = tiny_bert.write_tiny_bert(str(tmp_path / "h"), "huggingface", seed=5, num_layers=2)
    reader = tf.train.load_checkpoint(os.path.join(google, "bert_model.ckpt"))
    tensors = load_file(os.path.join(hf, "model.safetensors"))
    names = reader.get_variable_to_shape_map()
    assert len(names) == len(tensors) - 1  # position_ids is HF-only
    for name in names:
        value = reader.get_tensor(name)
        other = tensors[tiny_bert.google_to_hf(name)]
        np.testing.assert_array_equal(value, other.T if name.endswith("/kernel") else other)
    query = reader.get_tensor("bert/encoder/layer_1/attention/self/query/kernel")
    x = np.random.default_rng(0).standard_normal((2, query.shape[0]))
    hf_query = tensors["encoder.layer.1.attention.self.query.weight"]
    np.testing.assert_allclose(x @ query, x @ hf_query.T, rtol=1e-6)  # torch Linear: x @ W.T
    with (
        open(os.path.join(google, "vocab.txt"), encoding="utf-8") as a,
        open(os.path.join(hf, "vocab.txt"), encoding="utf-8") as b,
    ):
        assert a.read() == b.read()


def test_tokenizer_json_and_sentence_transformers_files(tmp_path) -> None:
    from tokenizers import Tokenizer

    directory = tiny_bert.write_tiny_bert(str(tmp_path), "huggingface", tokenizer_json=True, sentence_transformers=True)
    tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    assert tokenizer.encode("Hello, World walking!").tokens == [
        "[CLS]",
        "hello",
        ",",
        "world",
        "walk",
        "##ing",
        "!",
        "[SEP]",
    ]
    pair = tokenizer.encode("the dog", "你好")
    assert pair.tokens == ["[CLS]", "the", "dog", "[SEP]", "你", "好", "[SEP]"]
    assert pair.type_ids == [0, 0, 0, 0, 1, 1, 1]
    assert tokenizer.encode("zebra").tokens == ["[CLS]", "z", "##e", "##b", "##r", "##a", "[SEP]"]
    modules = json.loads((tmp_path / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling", "2_Normalize"]
    assert json.loads((tmp_path / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"]
    assert json.loads((tmp_path / "sentence_bert_config.json").read_text())["max_seq_length"] == 48


def test_write_tiny_bert_rejects_unknown_layout(tmp_path) -> None:
    with pytest.raises(ValueError, match="layout"):
        tiny_bert.write_tiny_bert(str(tmp_path), "onnx")


def test_reference_forward_shapes_and_padding(tiny: tuple[dict, dict[str, np.ndarray]]) -> None:
    config, weights = tiny
    rng = np.random.default_rng(1)
    ids = rng.integers(5, config["vocab_size"], size=(3, 9))
    segments = np.zeros_like(ids)
    segments[:, 5:] = 1
    lengths = np.array([9, 6, 4])
    layers = tiny_bert.reference_forward(config, weights, ids, segments, lengths)
    assert len(layers) == config["num_hidden_layers"]
    assert all(layer.shape == (3, 9, config["hidden_size"]) for layer in layers)
    assert all(np.isfinite(layer).all() for layer in layers)
    for row, length in enumerate(lengths):
        alone = tiny_bert.reference_forward(
            config, weights, ids[row : row + 1, :length], segments[row : row + 1, :length], [length]
        )
        for layer, single in zip(layers, alone, strict=True):
            np.testing.assert_allclose(layer[row, :length], single[0], rtol=1e-10, atol=1e-12)
    # the padding really is masked: changing padded ids does not move real tokens
    noisy = ids.copy()
    noisy[1, 6:] = 7
    again = tiny_bert.reference_forward(config, weights, noisy, segments, lengths)
    np.testing.assert_allclose(again[-1][1, :6], layers[-1][1, :6], rtol=1e-10, atol=1e-12)
    # and the layers do something: outputs differ from layer to layer and are layer-normalised
    assert not np.allclose(layers[0], layers[1])
    centred = (layers[-1] - weights["bert/encoder/layer_2/output/LayerNorm/beta"]) / weights[
        "bert/encoder/layer_2/output/LayerNorm/gamma"
    ]
    np.testing.assert_allclose(centred.mean(-1), 0.0, atol=1e-9)
    np.testing.assert_allclose(centred.std(-1), 1.0, atol=1e-6)


def test_reference_gelu_is_exact_erf() -> None:
    gelu = tiny_bert._ACTIVATIONS["gelu"]
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0])
    expected = [-0.0040496941, -0.1586552539, 0.0, 0.3457312306, 1.9544997361]
    np.testing.assert_allclose(gelu(x), expected, rtol=1e-8, atol=1e-10)


@pytest.mark.minilm
def test_reference_forward_matches_real_minilm(minilm: str, reference: dict[str, np.ndarray]) -> None:
    """The numpy reference reproduces PyTorch's all-MiniLM-L6-v2 token embeddings."""
    from safetensors.numpy import load_file

    with open(os.path.join(minilm, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    google = {tiny_bert.google_to_hf(name): name for name in tiny_bert.make_weights(num_layers=6)[1]}
    weights = {}
    for name, value in load_file(os.path.join(minilm, "model.safetensors")).items():
        if name in google:
            weights[google[name]] = value.T if google[name].endswith("/kernel") else value
    assert len(weights) == len(google)
    lengths = reference["lengths"][:8]
    width = int(lengths.max())
    layers = tiny_bert.reference_forward(config, weights, reference["input_ids"][:8, :width], None, lengths)
    for row, length in enumerate(lengths):
        np.testing.assert_allclose(layers[-1][row, :length], reference["NONE_-1"][row, :length], atol=2e-5)
