"""Every encoder family against what the reference stack computes for it.

``tests/data/families/<name>/`` holds a tiny random model of each family, made and saved by
transformers and sentence-transformers (``benchmarks/make_family_references.py``), and
``<name>.npz`` what that stack computes for it: the tokenizer's ids, ``encode`` with all the
model's modules (Dense and Normalize included), each pooling mode alone, the second-to-last
layer, and the token vectors. bertserve reads the same directory and must agree: min cosine
at least 0.99999 in fp32 and 0.999 in bf16, and the very same token ids.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from bertserve.server import Encoder, ModelConfig
from bertserve.server.errors import ModelError
from bertserve.server.model.options import resolve_options
from checks import bf16_bound

DATA = Path(__file__).resolve().parents[3] / "data" / "families"
FAMILIES = sorted(p.stem for p in DATA.glob("*.npz")) if DATA.is_dir() else []
MODES = {
    "cls": "CLS_TOKEN",
    "mean": "REDUCE_MEAN",
    "max": "REDUCE_MAX",
    "mean_sqrt_len_tokens": "REDUCE_MEAN_SQRT_LEN",
    "weightedmean": "WEIGHTED_MEAN",
    "lasttoken": "LAST_TOKEN",
}

pytestmark = pytest.mark.skipif(not FAMILIES, reason="tests/data/families holds no reference models")


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return float((a * b).sum(-1).min())


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / f"{name}.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("graphs"))


@pytest.fixture(scope="module")
def bare_models(tmp_path_factory) -> dict[str, str]:
    """Each model with only its Transformer and Pooling modules: what ``pool_<mode>`` is of."""
    root = tmp_path_factory.mktemp("bare")
    out = {}
    for name in FAMILIES:
        target = root / name
        shutil.copytree(DATA / name, target)
        modules = json.loads((target / "modules.json").read_text())
        kept = [m for m in modules if m["type"].endswith((".Transformer", ".Pooling"))]
        (target / "modules.json").write_text(json.dumps(kept))
        out[name] = str(target)
    return out


@pytest.mark.parametrize("name", FAMILIES)
def test_token_ids_are_the_models_own(name):
    ref = reference(name)
    _, tokenizer = resolve_options(ModelConfig.of(model_dir=str(DATA / name)))
    sentences = [str(s) for s in ref["sentences"]]
    for direction, ids, lengths in (("right", "ids", "lengths"), ("left", "ids_left", "lengths_left")):
        batch = tokenizer.tokenize(sentences, truncation_direction=direction)
        np.testing.assert_array_equal(batch.lengths, ref[lengths], err_msg=direction)
        np.testing.assert_array_equal(batch.input_ids, ref[ids][:, : batch.input_ids.shape[1]], err_msg=direction)
    pairs = [f"{a} ||| {b}" for a, b in zip(ref["pairs_first"], ref["pairs_second"], strict=True)]
    batch = tokenizer.tokenize(pairs)
    np.testing.assert_array_equal(batch.lengths, ref["pair_lengths"])
    width = batch.input_ids.shape[1]
    np.testing.assert_array_equal(batch.input_ids, ref["pair_ids"][:, :width])
    np.testing.assert_array_equal(batch.segment_ids * batch.input_mask, ref["pair_type_ids"][:, :width])


@pytest.mark.parametrize(
    ("name", "dtype", "bound"),
    [(n, d, b) for n in FAMILIES for d, b in (("fp32", 0.99999), ("bf16", bf16_bound(0.999, 0.995)))],
)
def test_vectors_with_all_the_models_modules(name, dtype, bound, graph_dir):
    ref = reference(name)
    encoder = Encoder(str(DATA / name), dtype=dtype, graph_dir=graph_dir)
    vectors = encoder.encode([str(s) for s in ref["sentences"]])
    assert vectors.shape == ref["st_default"].shape
    assert min_cosine(vectors, ref["st_default"]) >= bound
    if dtype == "fp32":
        np.testing.assert_allclose(
            np.linalg.norm(vectors, axis=1), np.linalg.norm(ref["st_default"], axis=1), rtol=1e-5
        )
        pairs = [f"{a} ||| {b}" for a, b in zip(ref["pairs_first"], ref["pairs_second"], strict=True)]
        assert min_cosine(encoder.encode(pairs), ref["st_pairs"]) >= bound


@pytest.mark.parametrize("name", FAMILIES)
def test_every_pooling_mode(name, bare_models, graph_dir):
    ref = reference(name)
    sentences = [str(s) for s in ref["sentences"]]
    for mode, strategy in MODES.items():
        encoder = Encoder(
            bare_models[name], pooling_strategy=strategy, normalize=False, dtype="fp32", graph_dir=graph_dir
        )
        vectors = encoder.encode(sentences)
        assert min_cosine(vectors, ref[f"pool_{mode}"]) >= 0.99999, mode
        np.testing.assert_allclose(vectors, ref[f"pool_{mode}"], rtol=1e-3, atol=1e-4, err_msg=mode)


@pytest.mark.parametrize("name", FAMILIES)
def test_second_to_last_layer_and_token_vectors(name, bare_models, graph_dir):
    ref = reference(name)
    sentences = [str(s) for s in ref["sentences"]]
    layer = Encoder(
        bare_models[name],
        pooling_strategy="REDUCE_MEAN",
        pooling_layer=[-2],
        normalize=False,
        dtype="fp32",
        graph_dir=graph_dir,
    )
    assert min_cosine(layer.encode(sentences), ref["layer_minus2_mean"]) >= 0.99999
    tokens = Encoder(bare_models[name], pooling_strategy="NONE", normalize=False, dtype="fp32", graph_dir=graph_dir)
    expected = ref["tokens_last"]
    got = tokens.encode(sentences[: len(expected)])
    width = min(got.shape[1], expected.shape[1])
    lengths = ref["lengths"][: len(expected)]
    for row, length in enumerate(lengths):
        assert min_cosine(got[row, :length], expected[row, :length]) >= 0.99999
    assert not got[:, :width][np.arange(width)[None, :] >= lengths[:, None]].any()


@pytest.mark.parametrize("name", FAMILIES)
def test_int8_stays_close(name, graph_dir):
    ref = reference(name)
    vectors = Encoder(str(DATA / name), dtype="int8", graph_dir=graph_dir).encode([str(s) for s in ref["sentences"]])
    cosines = min_cosine(vectors, ref["st_default"])
    assert cosines >= 0.99


def test_an_unknown_architecture_names_the_supported_families(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(DATA / FAMILIES[0], model)
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "deberta-v2"
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ModelError, match=r"model_type 'deberta-v2' is not a family bertserve runs; it runs BERT, RoBERTa"
    ):
        resolve_options(ModelConfig.of(model_dir=str(model)))
    del config["model_type"]
    config["architectures"] = ["T5EncoderModel"]
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ModelError,
        match=r"architecture .T5EncoderModel. is not one bertserve runs.*GTE.*JinaBERT and jina-embeddings-v3",
    ):
        resolve_options(ModelConfig.of(model_dir=str(model)))


def test_a_dense_module_refuses_a_pooling_of_another_width(tmp_path):
    if "distilbert" not in FAMILIES:
        pytest.skip("no DistilBERT reference model")
    with pytest.raises(ModelError, match=r"Dense module .* takes 32-wide vectors, and REDUCE_MEAN_MAX over 1 layer"):
        resolve_options(ModelConfig.of(model_dir=str(DATA / "distilbert"), pooling_strategy="REDUCE_MEAN_MAX"))
    with pytest.raises(ModelError, match="long_inputs=chunk cannot be used with this model's Dense module"):
        resolve_options(ModelConfig.of(model_dir=str(DATA / "distilbert"), long_inputs="chunk"))


def test_a_max_seq_len_past_the_positions_is_refused():
    if "roberta" not in FAMILIES:
        pytest.skip("no RoBERTa reference model")
    config = json.loads((DATA / "roberta" / "config.json").read_text())
    limit = config["max_position_embeddings"] - config["pad_token_id"] - 1
    resolve_options(ModelConfig.of(model_dir=str(DATA / "roberta"), max_seq_len=limit))
    with pytest.raises(ModelError, match=f"max_seq_len {limit + 1} is above the {limit} tokens"):
        resolve_options(ModelConfig.of(model_dir=str(DATA / "roberta"), max_seq_len=limit + 1))


def test_the_model_defaults_come_from_its_own_files():
    for name in FAMILIES:
        info, _ = resolve_options(ModelConfig.of(model_dir=str(DATA / name)))
        meta = json.loads(str(reference(name)["meta"]))
        assert info["max_seq_len"] == meta["max_seq_length"], name
    assert os.path.isdir(DATA)


def test_weights_stored_in_bfloat16_and_float16(tmp_path, graph_dir):
    """Models published in half precision are read as float32 (numpy's bfloat16 is
    ml_dtypes', which the reader imports itself)."""
    import tensorflow as tf
    from safetensors.numpy import load_file
    from safetensors.tensorflow import save_file

    name = FAMILIES[0]
    ref = reference(name)
    sentences = [str(s) for s in ref["sentences"]]
    for dtype in (tf.bfloat16, tf.float16):
        model = tmp_path / dtype.name
        shutil.copytree(DATA / name, model)
        weights = load_file(str(model / "model.safetensors"))
        save_file(
            {k: tf.cast(v, dtype) if v.dtype.kind == "f" else tf.constant(v) for k, v in weights.items()},
            str(model / "model.safetensors"),
        )
        vectors = Encoder(str(model), dtype="fp32", graph_dir=graph_dir).encode(sentences)
        assert min_cosine(vectors, ref["st_default"]) >= 0.995, dtype.name


@pytest.mark.parametrize("name", [n for n in ("roberta", "mpnet", "modernbert") if n in FAMILIES])
def test_chunked_long_inputs_are_the_weighted_mean_of_their_windows(name, bare_models, graph_dir):
    """Windows carry the family's own special tokens, and a chunked input's vector is the mean
    of its windows' vectors, each weighted by its tokens."""
    ref = reference(name)
    longest = str(ref["sentences"][int(np.argmax(ref["untruncated_lengths"]))])
    options = {"pooling_strategy": "REDUCE_MEAN", "normalize": False, "dtype": "fp32", "graph_dir": graph_dir}
    chunked = Encoder(bare_models[name], long_inputs="chunk", chunk_stride=4, **options)
    plain = Encoder(bare_models[name], **options)
    _, tokenizer = resolve_options(ModelConfig.of(model_dir=bare_models[name], chunk_stride=4))
    batch = tokenizer.tokenize([longest], chunk=True)
    assert len(batch) > 1
    cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
    windows = [batch.input_ids[i, : batch.lengths[i]] for i in range(len(batch))]
    assert all(w[0] == cls_id and w[-1] == sep_id for w in windows)
    vectors = plain.encode([tokenizer.tokens_of(w.tolist()) for w in windows], is_tokenized=True)
    expected = (vectors * batch.lengths[:, None]).sum(0) / batch.lengths.sum()
    np.testing.assert_allclose(chunked.encode([longest])[0], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", [n for n in ("mpnet", "modernbert", "distilbert") if n in FAMILIES])
def test_int8_keeps_the_products_its_family_needs_in_fp32(name, graph_dir):
    """ModernBERT's GeGLU input is as wide as a fused query, key and value (2 x 1152 = 3 x 768):
    each product is still told apart; MPNet keeps its query, key and value and its ffn_out in fp32."""
    from bertserve.server.model import int8
    from bertserve.server.model.graph import read_cache

    encoder = Encoder(str(DATA / name), dtype="int8", graph_dir=graph_dir)
    cached = read_cache(os.path.join(graph_dir, f"{encoder.meta.key}.lite"), encoder.meta.key)
    assert cached is not None
    roles = {product.split("/")[1] for product in int8.products(bytes(cached[0]))}
    assert roles == ({"attn_out", "ffn_in"} if name == "mpnet" else {"qkv", "attn_out", "ffn_in", "ffn_out"})
    layers = json.loads((DATA / name / "config.json").read_text()).get("num_hidden_layers", 2)
    assert len(int8.products(bytes(cached[0]))) == len(roles) * layers


HOSTILE = [
    ("roberta", {"num_hidden_layers": 10**9}, "num_hidden_layers 1000000000 is outside 1 to 1,024"),
    ("roberta", {"hidden_size": "32"}, "missing or non-integer hidden_size"),
    ("roberta", {"pad_token_id": 10**6}, "pad_token_id 1000000 leaves no position"),
    ("roberta", {"model_type": 12}, "model_type should be a string"),
    ("roberta", {"layer_norm_eps": -1.0}, "epsilon -1.0 is outside 0 to 1"),
    ("mpnet", {"relative_attention_num_buckets": 8}, "relative_attention_num_buckets 8 is outside 32 to 4096"),
    ("modernbert", {"local_attention": -4}, "local_attention -4 is outside 2"),
    ("modernbert", {"global_rope_theta": "big"}, "rotary base of the full_attention layers should be a number"),
    ("modernbert", {"rope_parameters": {"full_attention": {"rope_type": "yarn"}}}, "rope_type 'yarn' is not supported"),
    ("distilbert", {"activation": "swish"}, "activation 'swish' is not supported"),
]


@pytest.mark.parametrize(("name", "change", "message"), HOSTILE, ids=[m for _, _, m in HOSTILE])
def test_a_damaged_or_hostile_config_is_refused_naming_the_key(name, change, message, tmp_path):
    if name not in FAMILIES:
        pytest.skip(f"no {name} reference model")
    model = tmp_path / name
    shutil.copytree(DATA / name, model)
    config = json.loads((model / "config.json").read_text())
    config.update(change)
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=re.escape(message)):
        resolve_options(ModelConfig.of(model_dir=str(model)))


def test_an_id_past_the_embeddings_is_refused_before_the_model_runs(tmp_path):
    """A vocabulary with gaps, or a special token the post-processor writes, whose id the
    embedding table does not have: a clear error, not a failed gather in a worker."""
    if "roberta" not in FAMILIES:
        pytest.skip("no RoBERTa reference model")
    model = tmp_path / "roberta"
    shutil.copytree(DATA / "roberta", model)
    vocab_size = json.loads((model / "config.json").read_text())["vocab_size"]
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    tokenizer["post_processor"]["cls"] = ["<s>", vocab_size + 7]
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ModelError, match=rf"up to id {vocab_size + 7} \(.*\), but the model embeds only vocab_size"):
        resolve_options(ModelConfig.of(model_dir=str(model)))


def test_a_cased_tokenizer_json_is_not_lowercased_without_a_vocab_txt(tmp_path):
    """A copy with only tokenizer.json (as fetched from the Hub) keeps the case its own
    normalizer keeps, as a full copy does."""
    if "bert_st6" not in FAMILIES:
        pytest.skip("no BERT reference model")
    model = tmp_path / "cased"
    shutil.copytree(DATA / "bert_st6", model)
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    tokenizer["normalizer"]["lowercase"] = False
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("do_lower_case", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    assert not (model / "vocab.txt").exists()
    info, tokenizer_ = resolve_options(ModelConfig.of(model_dir=str(model)))
    assert info["do_lower_case"] is False
    assert tokenizer_.tokenize(["Hello"]).input_ids.tolist() != tokenizer_.tokenize(["hello"]).input_ids.tolist()


@pytest.mark.parametrize("strategy", ["REDUCE_MEAN_SQRT_LEN", "WEIGHTED_MEAN"])
def test_the_new_poolings_are_not_chunked_and_say_why(strategy):
    with pytest.raises(ModelError, match=f"{strategy} reads every token, but its windows' vectors cannot be merged"):
        resolve_options(
            ModelConfig.of(model_dir=str(DATA / FAMILIES[0]), pooling_strategy=strategy, long_inputs="chunk")
        )
