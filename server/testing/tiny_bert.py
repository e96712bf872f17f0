"""A tiny random BERT written to disk in Google's and Hugging Face's layouts, plus a numpy reference.

Both layouts hold identical numbers, so a test can load either and compare the served
embeddings against :func:`reference_forward`, an independent float64 implementation of BERT.
Weights are kept under Google's TF1 names with dense kernels laid out ``[in, out]``.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import string
from typing import Any

import numpy as np
import numpy.typing as npt

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_PUNCTUATION = list(".,!?'\"-:;()[]{}/&%$#@*+=<>_~`|\\^")
_WORD_TEXT = """the quick brown fox jumps over lazy dog hello world a an and or but not is are was were be
been have has had do does did will would can could should may might must i you he she it we they me him
her us them my your his its our their this that these those what which who when where why how all any
some no yes one two three first last good bad new old big small long short high low day time year
people way man woman child life work school house home city country water food book word sentence
text model server test run walk talk play read write make take give see look find think know say go
come love like want need use"""
_SUFFIXES = ["##ing", "##ed", "##s", "##er", "##ly"]
_CJK = list("你好世界中文")
_HF_ONLY = ("model_type", "architectures")


def tiny_vocab() -> list[str]:
    """The tokens of the tiny uncased WordPiece vocabulary, in id order."""
    chars = list(string.ascii_lowercase + string.digits) + _PUNCTUATION
    tokens = SPECIAL_TOKENS + chars + ["##" + c for c in chars]
    return list(dict.fromkeys(tokens + _WORD_TEXT.split() + _SUFFIXES + _CJK))


def write_vocab(path: str) -> list[str]:
    """Write ``vocab.txt`` at ``path`` (or inside it, when it is a directory); return the tokens."""
    if os.path.isdir(path):
        path = os.path.join(path, "vocab.txt")
    tokens = tiny_vocab()
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return tokens


def make_weights(
    *,
    vocab_size: int | None = None,
    hidden_size: int = 32,
    num_layers: int = 3,
    num_heads: int = 4,
    intermediate_size: int = 64,
    max_position: int = 64,
    type_vocab_size: int = 2,
    seed: int = 0,
    with_pooler: bool = True,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A BERT config dict and random float32 weights under Google's names (``vocab_size`` defaults
    to the size of :func:`tiny_vocab`)."""
    vocab_size = len(tiny_vocab()) if vocab_size is None else vocab_size
    rng = np.random.default_rng(seed)
    h, inter = hidden_size, intermediate_size
    weights: dict[str, np.ndarray] = {}

    def matrix(name: str, *shape: int) -> None:
        weights[name] = (rng.standard_normal(shape) * 0.2).astype(np.float32)

    def dense(prefix: str, n_in: int, n_out: int) -> None:
        matrix(prefix + "/kernel", n_in, n_out)
        weights[prefix + "/bias"] = (rng.standard_normal(n_out) * 0.05).astype(np.float32)

    def layer_norm(prefix: str) -> None:
        weights[prefix + "/gamma"] = (1.0 + rng.standard_normal(h) * 0.1).astype(np.float32)
        weights[prefix + "/beta"] = (rng.standard_normal(h) * 0.05).astype(np.float32)

    matrix("bert/embeddings/word_embeddings", vocab_size, h)
    matrix("bert/embeddings/position_embeddings", max_position, h)
    matrix("bert/embeddings/token_type_embeddings", type_vocab_size, h)
    layer_norm("bert/embeddings/LayerNorm")
    for i in range(num_layers):
        p = f"bert/encoder/layer_{i}"
        for part in ("query", "key", "value"):
            dense(f"{p}/attention/self/{part}", h, h)
        dense(f"{p}/attention/output/dense", h, h)
        layer_norm(f"{p}/attention/output/LayerNorm")
        dense(f"{p}/intermediate/dense", h, inter)
        dense(f"{p}/output/dense", inter, h)
        layer_norm(f"{p}/output/LayerNorm")
    if with_pooler:
        dense("bert/pooler/dense", h, h)
    config = {
        "vocab_size": vocab_size,
        "hidden_size": h,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "intermediate_size": inter,
        "max_position_embeddings": max_position,
        "type_vocab_size": type_vocab_size,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        "model_type": "bert",
        "architectures": ["BertModel"],
    }
    return config, weights


def _write_json(path: str, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)


def write_google_checkpoint(
    directory: str,
    config: dict[str, Any],
    weights: dict[str, np.ndarray],
    *,
    ckpt_name: str = "bert_model.ckpt",
    config_name: str = "bert_config.json",
    vocab: bool = True,
    extra_vars: bool = False,
) -> str:
    """Write ``bert_config.json``, ``vocab.txt`` and a TF1 checkpoint; return the checkpoint prefix.

    ``extra_vars`` adds what fine-tuned checkpoints carry besides BERT: Adam slots,
    a classifier head and ``global_step``.
    """
    import tensorflow as tf

    os.makedirs(directory, exist_ok=True)
    _write_json(os.path.join(directory, config_name), {k: v for k, v in config.items() if k not in _HF_ONLY})
    if vocab:
        write_vocab(os.path.join(directory, "vocab.txt"))
    values: dict[str, np.ndarray] = dict(weights)
    if extra_vars:
        for name in ("bert/encoder/layer_0/attention/self/query/kernel", "bert/pooler/dense/bias"):
            if name in weights:
                values[name + "/adam_m"] = np.full_like(weights[name], 0.01)
                values[name + "/adam_v"] = np.full_like(weights[name], 0.001)
        values["output_weights"] = np.full((2, config["hidden_size"]), 0.02, np.float32)
        values["output_bias"] = np.zeros(2, np.float32)
        values["global_step"] = np.array(1000, np.int64)
    prefix = os.path.join(directory, ckpt_name)
    with tf.Graph().as_default():
        variables = {name: tf.compat.v1.Variable(value, name=name) for name, value in values.items()}
        saver = tf.compat.v1.train.Saver(var_list=variables)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, prefix, write_meta_graph=False, write_state=False)
    saved = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    if saved != {name: list(value.shape) for name, value in values.items()}:
        raise RuntimeError(f"checkpoint {prefix} does not hold exactly the names written")
    return prefix


def google_to_hf(name: str) -> str:
    """The Hugging Face name of a Google weight name (``.../kernel`` becomes ``....weight``)."""
    name = name.removeprefix("bert/").replace("encoder/layer_", "encoder/layer/")
    name = name.replace("/gamma", "/weight").replace("/beta", "/bias").replace("/kernel", "/weight")
    if name.startswith("embeddings/") and name.endswith("_embeddings"):
        name += "/weight"
    return name.replace("/", ".")


def write_huggingface(
    directory: str,
    config: dict[str, Any],
    weights: dict[str, np.ndarray],
    *,
    tokenizer_json: bool = False,
    sentence_transformers: bool = False,
) -> str:
    """Write ``config.json``, ``vocab.txt``, ``model.safetensors`` and tokenizer/sentence-transformers
    files; return the directory."""
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    _write_json(os.path.join(directory, "config.json"), config)
    tokens = write_vocab(os.path.join(directory, "vocab.txt"))
    tensors = {
        google_to_hf(name): np.ascontiguousarray(value.T if name.endswith("/kernel") else value)
        for name, value in weights.items()
    }
    tensors["embeddings.position_ids"] = np.arange(config["max_position_embeddings"], dtype=np.int64)[None]
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    _write_json(os.path.join(directory, "tokenizer_config.json"), {"do_lower_case": True})
    if tokenizer_json:
        _write_tokenizer_json(os.path.join(directory, "tokenizer.json"), tokens)
    if sentence_transformers:
        parts = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")]
        modules = [
            {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
            for i, (path, kind) in enumerate(parts)
        ]
        _write_json(os.path.join(directory, "modules.json"), modules)
        for path, _ in parts[1:]:
            os.makedirs(os.path.join(directory, path), exist_ok=True)
        modes = {f"pooling_mode_{m}": m == "mean_tokens" for m in ("cls_token", "mean_tokens", "max_tokens")}
        pooling = {"word_embedding_dimension": config["hidden_size"], **modes}
        _write_json(os.path.join(directory, "1_Pooling", "config.json"), pooling)
        _write_json(
            os.path.join(directory, "sentence_bert_config.json"),
            {"max_seq_length": 48, "do_lower_case": False},
        )
    return str(directory)


def _write_tokenizer_json(path: str, tokens: list[str]) -> None:
    """A ``tokenizer.json`` equivalent to ``BertWordPieceTokenizer(vocab, lowercase=True)``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.save(path)


def write_tiny_bert(directory: str, layout: str = "google", *, seed: int = 0, **kwargs: Any) -> str:
    """Write a tiny random BERT in ``layout`` ("google" or "huggingface"); return the directory.

    ``kwargs`` go to :func:`make_weights` when they are its parameters, else to the layout's writer.
    """
    own = set(inspect.signature(make_weights).parameters)
    config, weights = make_weights(seed=seed, **{k: v for k, v in kwargs.items() if k in own})
    writer_kwargs = {k: v for k, v in kwargs.items() if k not in own}
    if layout == "google":
        write_google_checkpoint(directory, config, weights, **writer_kwargs)
    elif layout == "huggingface":
        write_huggingface(directory, config, weights, **writer_kwargs)
    else:
        raise ValueError(f"layout must be 'google' or 'huggingface', not {layout!r}")
    return str(directory)


# -- numpy reference ---------------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])
_ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_new": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: np.maximum(x, 0.0),
}
_ACTIVATIONS["gelu_pytorch_tanh"] = _ACTIVATIONS["gelu_new"]


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def reference_forward(
    config: dict[str, Any],
    weights: dict[str, np.ndarray],
    input_ids: npt.ArrayLike,
    segment_ids: npt.ArrayLike | None,
    lengths: npt.ArrayLike,
) -> list[np.ndarray]:
    """Every encoder layer's output, float64 ``[batch, len, hidden]``, by textbook BERT.

    Positions at or beyond a row's length are padding: they get an additive ``-10000``
    attention mask, as in Google's BERT, and their own outputs are meaningless.
    """
    w = {name: np.asarray(value, np.float64) for name, value in weights.items()}
    ids = np.asarray(input_ids)
    batch, width = ids.shape
    segments = np.zeros_like(ids) if segment_ids is None else np.asarray(segment_ids)
    eps = float(config.get("layer_norm_eps", 1e-12))
    heads = config["num_attention_heads"]
    size = config["hidden_size"] // heads
    act = _ACTIVATIONS[config.get("hidden_act", "gelu")]
    emb = "bert/embeddings/"
    x = w[emb + "word_embeddings"][ids] + w[emb + "token_type_embeddings"][segments]
    x = x + w[emb + "position_embeddings"][:width]
    x = _layer_norm(x, w[emb + "LayerNorm/gamma"], w[emb + "LayerNorm/beta"], eps)
    mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
    bias = np.where(mask, 0.0, -10000.0)[:, None, None, :]  # [batch, 1, 1, key]

    def dense(value: np.ndarray, prefix: str) -> np.ndarray:
        return value @ w[prefix + "/kernel"] + w[prefix + "/bias"]

    def split(value: np.ndarray) -> np.ndarray:  # [batch, len, hidden] -> [batch, heads, len, size]
        return value.reshape(batch, width, heads, size).transpose(0, 2, 1, 3)

    outputs = []
    for i in range(config["num_hidden_layers"]):
        p = f"bert/encoder/layer_{i}/"
        q, k, v = (split(dense(x, p + "attention/self/" + part)) for part in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(size) + bias
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, width, heads * size)
        attn = dense(context, p + "attention/output/dense") + x
        x = _layer_norm(attn, w[p + "attention/output/LayerNorm/gamma"], w[p + "attention/output/LayerNorm/beta"], eps)
        hidden = act(dense(x, p + "intermediate/dense"))
        out = dense(hidden, p + "output/dense") + x
        x = _layer_norm(out, w[p + "output/LayerNorm/gamma"], w[p + "output/LayerNorm/beta"], eps)
        outputs.append(x)
    return outputs
