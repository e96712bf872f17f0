"""Reading a model's weights, once its directory is checked (:mod:`.model_dir`): a Google
checkpoint or safetensors files, with a fine-tuned checkpoint applied last.

Weights come out under one name per role, whatever the family's own names
(:func:`canonical_name`): Google's (``bert/encoder/layer_0/attention/self/query/kernel``) for
the post-norm families, ``modernbert/layer_0/Wqkv/kernel`` and so on for ModernBERT, ``qwen3/layer_0/q_proj/kernel``
for Qwen3, and
``head/dense_0/kernel`` for a sentence-transformers Dense module. Dense kernels are laid out
``[in, out]``, whatever the layout they came from, and every weight is checked against the
shape the config implies.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator

import numpy as np

from ..errors import ModelFileError, ModelShapeError
from . import bert_variants
from .families import EncoderConfig
from .model_dir import ModelFiles
from .task_heads import expected_shapes, head_name

logger = logging.getLogger("bertserve.model")


def read_weights(model: ModelFiles) -> dict[str, np.ndarray]:
    """Read every weight source in order (a fine-tuned checkpoint last) and check the shapes."""
    family = model.config.family
    weights = _read_sources(model.weight_sources, family)
    if model.tuned_sources:
        tuned = _read_sources(model.tuned_sources, family)
        if not set(tuned) & set(weights):
            where = model.tuned_sources[0][1]
            raise ModelFileError(f"the fine-tuned checkpoint {where} has no BERT weights to apply")
        logger.info("%d tensors come from the fine-tuned checkpoint", len(tuned))
        weights.update(tuned)
    _check_shapes(model, weights)
    weights.update(read_dense(model))
    return weights


def _read_sources(sources: list[tuple[str, str]], family: str) -> dict[str, np.ndarray]:
    weights: dict[str, np.ndarray] = {}
    for kind, path in sources:
        weights.update(_read_checkpoint(path) if kind == "checkpoint" else _read_safetensors([path], family))
    return weights


def _read_checkpoint(prefix: str) -> dict[str, np.ndarray]:
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(prefix)
        names = reader.get_variable_to_shape_map()
        return {
            name: np.asarray(reader.get_tensor(name))
            for name in names
            if name.startswith("bert/") and not re.search(r"/adam_[mv]$|_slot_", name)
        }
    except (tf.errors.OpError, ValueError) as exc:
        raise ModelFileError(f"cannot read checkpoint {prefix}: {exc}") from exc


def _read_safetensors(paths: Iterable[str], family: str = "bert") -> dict[str, np.ndarray]:
    weights: dict[str, np.ndarray] = {}
    for path, raw in _safetensors_files(paths):
        found = 0
        for name, value in raw.items():
            canonical = head_name(name, family) or canonical_name(name, family)
            if canonical is not None:
                weights[canonical] = value.T if canonical.endswith("/kernel") else value
                found += 1
        if raw and not found:
            names = ", ".join(sorted(raw)[:3])
            raise ModelFileError(
                f"{path} holds no weight of a {family} encoder under a name bertserve knows (it holds {names}, ...)"
            )
    return weights


def _safetensors_files(paths: Iterable[str]) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    import ml_dtypes  # noqa: F401  (TensorFlow's own dependency: gives numpy the bfloat16 some models are stored in)
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    for path in paths:
        try:
            yield path, load_file(path)
        except (SafetensorError, OSError, ValueError, TypeError) as exc:
            raise ModelFileError(f"cannot read {path}: {exc}") from exc


def read_dense(model: ModelFiles) -> dict[str, np.ndarray]:
    """The sentence-transformers Dense layers' weights, as ``head/dense_{i}/kernel`` [in, out]."""
    weights: dict[str, np.ndarray] = {}
    for i, layer in enumerate(model.defaults.dense):
        ((path, raw),) = _safetensors_files([layer.path])
        kernel = raw.get("linear.weight")
        if kernel is None or kernel.shape != (layer.out_features, layer.in_features):
            shape = None if kernel is None else tuple(kernel.shape)
            raise ModelShapeError(
                f"{path}: linear.weight should have shape {(layer.out_features, layer.in_features)}, not {shape}"
            )
        weights[f"head/dense_{i}/kernel"] = kernel.T.astype(np.float32)
        bias = raw.get("linear.bias")
        if layer.bias:
            if bias is None or bias.shape != (layer.out_features,):
                raise ModelShapeError(f"{path}: linear.bias should have shape {(layer.out_features,)}")
            weights[f"head/dense_{i}/bias"] = bias.astype(np.float32)
    return weights


#: The prefix a task model (``BertForMaskedLM``...) puts before the encoder's own names.
_PREFIX = re.compile(r"^(?:bert|roberta|distilbert|mpnet|model|encoder_model|new)\.")

#: DistilBERT's and MPNet's layer names, rewritten as BERT's.
_AS_BERT = {
    "distilbert": [
        (r"^transformer\.layer\.(\d+)\.attention\.q_lin\.", r"encoder.layer.\1.attention.self.query."),
        (r"^transformer\.layer\.(\d+)\.attention\.k_lin\.", r"encoder.layer.\1.attention.self.key."),
        (r"^transformer\.layer\.(\d+)\.attention\.v_lin\.", r"encoder.layer.\1.attention.self.value."),
        (r"^transformer\.layer\.(\d+)\.attention\.out_lin\.", r"encoder.layer.\1.attention.output.dense."),
        (r"^transformer\.layer\.(\d+)\.sa_layer_norm\.", r"encoder.layer.\1.attention.output.LayerNorm."),
        (r"^transformer\.layer\.(\d+)\.ffn\.lin1\.", r"encoder.layer.\1.intermediate.dense."),
        (r"^transformer\.layer\.(\d+)\.ffn\.lin2\.", r"encoder.layer.\1.output.dense."),
        (r"^transformer\.layer\.(\d+)\.output_layer_norm\.", r"encoder.layer.\1.output.LayerNorm."),
    ],
    "mpnet": [
        (r"^(encoder\.layer\.\d+\.attention)\.attn\.q\.", r"\1.self.query."),
        (r"^(encoder\.layer\.\d+\.attention)\.attn\.k\.", r"\1.self.key."),
        (r"^(encoder\.layer\.\d+\.attention)\.attn\.v\.", r"\1.self.value."),
        (r"^(encoder\.layer\.\d+\.attention)\.attn\.o\.", r"\1.output.dense."),
        (r"^(encoder\.layer\.\d+\.attention)\.LayerNorm\.", r"\1.output.LayerNorm."),
    ],
}
_LAYER = r"^encoder\.layer\.(\d+)\.(.+)"
_BERT_RENAMES = [
    (r"^embeddings\.(\w+)_embeddings\.weight$", r"bert/embeddings/\1_embeddings"),
    (r"^embeddings\.LayerNorm\.(weight|gamma)$", "bert/embeddings/LayerNorm/gamma"),
    (r"^embeddings\.LayerNorm\.(bias|beta)$", "bert/embeddings/LayerNorm/beta"),
    (_LAYER + r"\.LayerNorm\.(weight|gamma)$", r"bert/encoder/layer_\1/\2/LayerNorm/gamma"),
    (_LAYER + r"\.LayerNorm\.(bias|beta)$", r"bert/encoder/layer_\1/\2/LayerNorm/beta"),
    (_LAYER + r"\.weight$", r"bert/encoder/layer_\1/\2/kernel"),
    (_LAYER + r"\.bias$", r"bert/encoder/layer_\1/\2/bias"),
    (r"^pooler\.dense\.weight$", "bert/pooler/dense/kernel"),
    (r"^pooler\.dense\.bias$", "bert/pooler/dense/bias"),
    (r"^encoder\.relative_attention_bias\.weight$", "bert/encoder/relative_attention_bias/table"),
]
_MODERNBERT_RENAMES = [
    (r"^embeddings\.tok_embeddings\.weight$", "modernbert/embeddings/word_embeddings"),
    (r"^embeddings\.norm\.weight$", "modernbert/embeddings/norm/gamma"),
    (r"^embeddings\.norm\.bias$", "modernbert/embeddings/norm/beta"),
    (r"^layers\.(\d+)\.(attn_norm|mlp_norm)\.weight$", r"modernbert/layer_\1/\2/gamma"),
    (r"^layers\.(\d+)\.(attn_norm|mlp_norm)\.bias$", r"modernbert/layer_\1/\2/beta"),
    (r"^layers\.(\d+)\.attn\.(Wqkv|Wo)\.weight$", r"modernbert/layer_\1/\2/kernel"),
    (r"^layers\.(\d+)\.attn\.(Wqkv|Wo)\.bias$", r"modernbert/layer_\1/\2/bias"),
    (r"^layers\.(\d+)\.mlp\.(Wi|Wo)\.weight$", r"modernbert/layer_\1/mlp_\2/kernel"),
    (r"^layers\.(\d+)\.mlp\.(Wi|Wo)\.bias$", r"modernbert/layer_\1/mlp_\2/bias"),
    (r"^final_norm\.weight$", "modernbert/final_norm/gamma"),
    (r"^final_norm\.bias$", "modernbert/final_norm/beta"),
]


def _decoder_renames(family: str, norms: dict[str, str]) -> list[tuple[str, str]]:
    """A decoder's tensors (transformers' ``Qwen3Model``, ``Gemma3TextModel``) under bertserve's
    names, its layers' norms named by the role ``norms`` gives each."""
    layer, ours = r"^layers\.(\d+)\.", family + r"/layer_\1/"
    return [
        (r"^embed_tokens\.weight$", f"{family}/embeddings/word_embeddings"),
        *((rf"{layer}{theirs}\.weight$", rf"{ours}{role}/gamma") for theirs, role in norms.items()),
        (layer + r"self_attn\.([qkvo])_proj\.weight$", ours + r"\2_proj/kernel"),
        (layer + r"self_attn\.([qkvo])_proj\.bias$", ours + r"\2_proj/bias"),
        (layer + r"self_attn\.([qk])_norm\.weight$", ours + r"\2_norm/gamma"),
        (layer + r"mlp\.(gate|up|down)_proj\.weight$", ours + r"\2_proj/kernel"),
        (r"^norm\.weight$", f"{family}/final_norm/gamma"),
    ]


_QWEN3_RENAMES = [
    *_decoder_renames("qwen3", {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm"}),
    (r"^lm_head\.weight$", "qwen3/lm_head"),  # [vocab, hidden]: a reranker's yes/no rows (.task_heads)
]
_GEMMA3_NORMS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "attn_post_norm",  # Gemma3's is on attention's output; Qwen3's before the MLP
    "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "mlp_post_norm",
}
_GEMMA3_RENAMES = _decoder_renames("gemma3", _GEMMA3_NORMS)
_RENAMES = {"modernbert": _MODERNBERT_RENAMES, "qwen3": _QWEN3_RENAMES, "gemma3": _GEMMA3_RENAMES}


def canonical_name(name: str, family: str = "bert") -> str | None:
    """The name bertserve gives the tensor ``name`` of a Hugging Face checkpoint of ``family``
    (Google's for the post-norm families), or None for a tensor the encoder does not use."""
    name = _PREFIX.sub("", name, count=1)
    for pattern, replacement in _AS_BERT.get(family, []):
        name = re.sub(pattern, replacement, name)
    if family in bert_variants.RENAMES:
        for pattern, replacement in bert_variants.RENAMES[family]:
            canonical, count = re.subn(pattern, replacement, name)
            if count:
                return bert_variants.final_name(canonical.replace(".", "/"))
        return None
    for pattern, replacement in _RENAMES.get(family, _BERT_RENAMES):
        canonical, count = re.subn(pattern, replacement, name)
        if count:
            return canonical.replace(".", "/")
    return None


# -- checks ------------------------------------------------------------------------------


def _expected_shapes(config: EncoderConfig, present: set[str]) -> dict[str, tuple[int, ...]]:
    if config.family in bert_variants.VARIANTS:
        return bert_variants.shapes(config, present)
    if config.family == "modernbert":
        return _modernbert_shapes(config)
    if config.family in ("qwen3", "gemma3"):
        return _decoder_shapes(config)
    h, i = config.hidden_size, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "bert/embeddings/word_embeddings": (config.vocab_size, h),
        "bert/embeddings/position_embeddings": (config.max_position_embeddings, h),
        "bert/embeddings/LayerNorm/gamma": (h,),
        "bert/embeddings/LayerNorm/beta": (h,),
    }
    if config.type_vocab_size:
        shapes["bert/embeddings/token_type_embeddings"] = (config.type_vocab_size, h)
    if config.relative_attention_buckets:
        shapes["bert/encoder/relative_attention_bias/table"] = (
            config.relative_attention_buckets,
            config.num_attention_heads,
        )
    for n in range(config.num_hidden_layers):
        layer = f"bert/encoder/layer_{n}/"
        for name in ("query", "key", "value"):
            shapes[f"{layer}attention/self/{name}/kernel"] = (h, h)
            shapes[f"{layer}attention/self/{name}/bias"] = (h,)
        shapes[f"{layer}attention/output/dense/kernel"] = (h, h)
        shapes[f"{layer}attention/output/dense/bias"] = (h,)
        shapes[f"{layer}intermediate/dense/kernel"] = (h, i)
        shapes[f"{layer}intermediate/dense/bias"] = (i,)
        shapes[f"{layer}output/dense/kernel"] = (i, h)
        shapes[f"{layer}output/dense/bias"] = (h,)
        for block in ("attention/output", "output"):
            shapes[f"{layer}{block}/LayerNorm/gamma"] = (h,)
            shapes[f"{layer}{block}/LayerNorm/beta"] = (h,)
    return shapes


def _modernbert_shapes(config: EncoderConfig) -> dict[str, tuple[int, ...]]:
    h, i = config.hidden_size, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"modernbert/embeddings/word_embeddings": (config.vocab_size, h)}
    norms = ["modernbert/embeddings/norm", "modernbert/final_norm"]
    for n in range(config.num_hidden_layers):
        layer = f"modernbert/layer_{n}/"
        norms += [layer + "mlp_norm"] + ([layer + "attn_norm"] if n else [])
        shapes[layer + "Wqkv/kernel"] = (h, 3 * h)
        shapes[layer + "Wo/kernel"] = (h, h)
        shapes[layer + "mlp_Wi/kernel"] = (h, 2 * i)
        shapes[layer + "mlp_Wo/kernel"] = (i, h)
        if config.attention_bias:
            shapes[layer + "Wqkv/bias"], shapes[layer + "Wo/bias"] = (3 * h,), (h,)
        if config.mlp_bias:
            shapes[layer + "mlp_Wi/bias"], shapes[layer + "mlp_Wo/bias"] = (2 * i,), (h,)
    for norm in norms:
        shapes[norm + "/gamma"] = (h,)
        if config.norm_bias:
            shapes[norm + "/beta"] = (h,)
    return shapes


def _decoder_shapes(config: EncoderConfig) -> dict[str, tuple[int, ...]]:
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    family = config.family
    shapes: dict[str, tuple[int, ...]] = {
        f"{family}/embeddings/word_embeddings": (config.vocab_size, h),
        f"{family}/final_norm/gamma": (h,),
    }
    norms = ("attn_norm", "mlp_norm", "attn_post_norm", "mlp_post_norm")[: 4 if config.post_norms else 2]
    for n in range(config.num_hidden_layers):
        layer = f"{family}/layer_{n}/"
        products = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
        products.update({"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)})
        shapes.update({f"{layer}{name}/kernel": shape for name, shape in products.items()})
        shapes.update({f"{layer}{name}/gamma": (h,) for name in norms})
        shapes.update({f"{layer}{name}/gamma": (d,) for name in ("q_norm", "k_norm")})
        if config.attention_bias:
            shapes.update(
                {f"{layer}{name}/bias": (products[name][1],) for name in ("q_proj", "k_proj", "v_proj", "o_proj")}
            )
    return shapes


def _check_shapes(model: ModelFiles, weights: dict[str, np.ndarray]) -> None:
    expected = _expected_shapes(model.config, set(weights))
    expected.update(expected_shapes(model.config, model.head, set(weights)))
    if "bert/pooler/dense/kernel" in weights and model.config.has_pooler:
        h = model.config.hidden_size
        expected["bert/pooler/dense/kernel"] = (h, h)
        expected["bert/pooler/dense/bias"] = (h,)
    missing = sorted(set(expected) - set(weights))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelShapeError(
            f"the {model.layout} weights of this {model.config.family} model lack {', '.join(missing[:3])}{more} "
            f"(config says {model.config.num_hidden_layers} layers)"
        )
    for name, shape in expected.items():
        actual = tuple(weights[name].shape)
        if actual != shape:
            raise ModelShapeError(f"weight {name} has shape {actual}, but the config implies {shape}")
        if weights[name].dtype != np.float32:
            weights[name] = weights[name].astype(np.float32)
    for name in set(weights) - set(expected):
        del weights[name]
