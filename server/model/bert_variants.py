"""The BERTs with positions of another kind, which ship their own model code (``auto_map``):
their ``config.json`` keys, their tensors' names and shapes. :mod:`.bert` runs them, as the
post-norm layers they are.

==========  ==========================================================================
family      what differs from BERT (the published code each was checked against)
==========  ==========================================================================
gte         GTE's "new" model (``Alibaba-NLP/new-impl``: gte-*-v1.5, gte-multilingual-base,
            snowflake-arctic-embed-m-v2.0): rotary positions (NTK-scaled by
            ``rope_scaling``), Q, K and V fused, a gated feed-forward (up, then gate),
            no absolute positions, token types only if ``type_vocab_size`` says so
nomic_bert  NomicBERT (``nomic-ai/nomic-bert-2048``: nomic-embed-text-v1, v1.5): GPT-2's key
            names, rotary positions over a fraction of each head, Q, K and V fused,
            SwiGLU (``fc11`` up, ``fc12`` gate, its width rounded up to 256), biases as the
            config says, a vocabulary padded to a multiple
jina_bert   JinaBERT (``jinaai/jina-bert-implementation``: jina-embeddings-v2): symmetric
            ALiBi in place of positions, a gated feed-forward (gate, then up: GTE's halves
            the other way round)
jina_v3     jina-embeddings-v3 (``jinaai/xlm-roberta-flash-implementation``): XLM-RoBERTa with
            rotary positions in place of absolute ones, Q, K and V fused, and LoRA task
            adapters on every product and embedding table, one chosen per input (the
            request's ``prompt_name``, as its ``encode(task=...)`` takes it) or none
==========  ==========================================================================

What these configs can say that the forward pass does not compute (pre-norm blocks, RMSNorm,
interleaved or dynamically scaled rotary positions) is refused by name.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ModelError, ModelFileError
from .config_values import float_key, int_key

VARIANTS = ("gte", "nomic_bert", "jina_bert", "jina_v3")

#: The Hub repository of each family's published code: an ``auto_map`` naming other code
#: (``repo--module.Class``) is another model. (JinaBERT's variant for code,
#: ``jinaai/jina-bert-v2-qk-post-norm``, norms queries and keys, and is refused.)
CODE = {
    "gte": "Alibaba-NLP/new-impl",
    "nomic_bert": "nomic-ai/nomic-bert-2048",
    "jina_bert": "jinaai/jina-bert-implementation",
    "jina_v3": "jinaai/xlm-roberta-flash-implementation",
}


def jina_bert(raw: dict[str, Any]) -> bool:
    """Whether a config that says ``bert`` is JinaBERT's: its code in ``auto_map`` (a BERT that
    says ALiBi without it is refused, :mod:`.config_guard`)."""
    auto_map = raw.get("auto_map")
    code = " ".join(str(v) for v in auto_map.values()) if isinstance(auto_map, dict) else ""
    return "jina-bert" in code or "JinaBert" in code


def jina_v3(raw: dict[str, Any]) -> bool:
    """Whether a config that says ``xlm-roberta`` is jina-embeddings-v3's: its code in ``auto_map``."""
    auto_map = raw.get("auto_map")
    code = " ".join(str(v) for v in auto_map.values()) if isinstance(auto_map, dict) else ""
    return CODE["jina_v3"] + "--" in code


def jina_v3_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    if raw.get("position_embedding_type") != "rotary":
        kind = raw.get("position_embedding_type")
        raise ModelError(
            f"{path}: position_embedding_type {kind!r}: bertserve runs jina-embeddings-v3 with rotary only"
        )
    for key, what in (("rotary_emb_interleaved", "interleaved rotary positions"), ("rotary_emb_scale_base", "xPos")):
        if raw.get(key):
            raise ModelError(f"{path}: {key} {raw[key]!r} says {what}, which bertserve does not compute")
    head_dim = int(raw["hidden_size"]) // int(raw["num_attention_heads"])
    rotary = int_key(path, raw, "rotary_emb_dim", head_dim) or head_dim
    if not 0 < rotary <= head_dim or rotary % 2:
        raise ModelError(f"{path}: rotary_emb_dim {rotary} is not an even part of each head's {head_dim} values")
    return {
        "type_vocab_size": int_key(path, raw, "type_vocab_size", 1),
        "layer_norm_eps": float_key(path, raw, "layer_norm_eps", 1e-5),
        "rotary_dim": rotary,
        "rope_theta_global": _base(path, raw, "rotary_emb_base", 10_000.0),
        **_adapters(path, raw),
    }


def _adapters(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    """jina-embeddings-v3's LoRA task adapters: their names, rank and scale (alpha / rank)."""
    names = raw.get("lora_adaptations") or []
    if not isinstance(names, list) or not all(isinstance(n, str) and 0 < len(n) <= 64 for n in names):
        raise ModelFileError(f"{path}: lora_adaptations should list the adapters' names, not {names!r}")
    if len(set(names)) != len(names) or len(names) > 64:
        raise ModelFileError(f"{path}: lora_adaptations should name at most 64 adapters, each once")
    if not names:
        return {}
    rank = int_key(path, raw, "lora_rank", 4)
    alpha = float_key(path, raw, "lora_alpha", 1.0)
    if not 1 <= rank <= 1024 or not 0 < alpha < 1e6:
        raise ModelFileError(f"{path}: lora_rank {rank} or lora_alpha {alpha} is out of bounds")
    return {"adapters": tuple(names), "lora_rank": rank, "lora_scaling": alpha / rank}


def gte_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    if raw.get("position_embedding_type", "rope") != "rope":
        kind = raw["position_embedding_type"]
        raise ModelError(f"{path}: position_embedding_type {kind!r}: bertserve runs GTE with rotary positions only")
    if raw.get("layer_norm_type", "layer_norm") != "layer_norm":
        raise ModelError(f"{path}: layer_norm_type {raw['layer_norm_type']!r} is not supported (only layer_norm)")
    if raw.get("logn_attention_scale"):
        raise ModelError(f"{path}: logn_attention_scale is true; bertserve does not scale attention by length")
    head_dim = int(raw["hidden_size"]) // int(raw["num_attention_heads"])
    return {
        "type_vocab_size": int_key(path, raw, "type_vocab_size", 1),
        "layer_norm_eps": float_key(path, raw, "layer_norm_eps", 1e-12),
        "rotary_dim": head_dim,
        "rope_theta_global": _base(path, raw, "rope_theta", 10_000.0),
        "rope_ntk_factor": _ntk_factor(path, raw.get("rope_scaling")),
        "glu": True,
    }


def _ntk_factor(path: str, scaling: Any) -> float:
    """GTE's fixed NTK scaling (``{"type": "ntk", "factor": f}``), used at every length."""
    if scaling is None:
        return 1.0
    if not isinstance(scaling, dict) or scaling.get("type", scaling.get("rope_type")) != "ntk" or "mixed_b" in scaling:
        raise ModelError(f"{path}: rope_scaling {scaling!r} is not supported (only GTE's fixed NTK scaling)")
    factor = scaling.get("factor")
    if not isinstance(factor, int | float) or isinstance(factor, bool) or not 1.0 <= factor <= 1024.0:
        raise ModelFileError(f"{path}: rope_scaling's factor should be a number from 1 to 1024, not {factor!r}")
    return float(factor)


#: NomicBERT's GPT-2 key names, as BERT's.
NOMIC_NAMES = {
    "hidden_size": "n_embd",
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head",
    "intermediate_size": "n_inner",
    "max_position_embeddings": "n_positions",
}
_NOMIC_GATED = {"swiglu": "silu", "geglu": "gelu"}
_NOMIC_REFUSED = {
    "prenorm": "pre-norm blocks",
    "parallel_block": "parallel attention and feed-forward",
    "use_rms_norm": "RMSNorm",
    "rotary_emb_interleaved": "interleaved rotary positions",
    "rotary_emb_scale_base": "xPos scaling",
    "rotary_scaling_factor": "dynamically scaled rotary positions",
    "causal": "causal attention",
    "moe_every_n_layers": "mixture-of-experts layers (nomic-embed-text-v2-moe)",
    "num_experts": "mixture-of-experts layers (nomic-embed-text-v2-moe)",
}


def nomic_as_bert(raw: dict[str, Any]) -> dict[str, Any]:
    """NomicBERT's config under BERT's key names: its vocabulary padded as the model's table is,
    a gated feed-forward's width rounded up to 256 as the model's code rounds it."""
    out = {ours: raw.get(theirs) for ours, theirs in NOMIC_NAMES.items()}
    out = {**raw, **out}
    act = raw.get("activation_function", "gelu_new")
    out["hidden_act"] = _NOMIC_GATED.get(act, act)
    width, vocab = out.get("intermediate_size"), raw.get("vocab_size")
    if width is None and isinstance(out["hidden_size"], int):
        width = 4 * out["hidden_size"]  # GPT-2's n_inner: None
    if act in _NOMIC_GATED and isinstance(width, int):
        width = -(-width // 256) * 256
    out["intermediate_size"] = width
    multiple = raw.get("pad_vocab_size_multiple", 1)
    if isinstance(vocab, int) and isinstance(multiple, int) and 1 <= multiple <= 1024:
        out["vocab_size"] = -(-vocab // multiple) * multiple
    return out


def nomic_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    for key, what in _NOMIC_REFUSED.items():
        if raw.get(key):
            raise ModelError(f"{path}: {key} {raw[key]!r} says {what}, which bertserve's NomicBERT does not compute")
    for key in ("attn_pdrop",):
        if raw.get(key, 0.1) != 0.0:  # its code drops attention weights even in inference
            raise ModelError(
                f"{path}: {key} {raw.get(key, 0.1)!r}: NomicBERT's code drops attention probabilities even at "
                "inference, so its vectors are random; the published models say 0.0"
            )
    fraction = float_key(path, raw, "rotary_emb_fraction", 0.0)
    head_dim = int(raw["hidden_size"]) // int(raw["num_attention_heads"])
    rotary = int(head_dim * fraction)
    if not 0 < rotary <= head_dim or rotary % 2:
        raise ModelError(
            f"{path}: rotary_emb_fraction {fraction} gives {rotary} rotary values of each head's {head_dim}; "
            "bertserve runs NomicBERT with rotary positions over an even part of each head"
        )
    mlp_bias = bool(raw.get("mlp_fc1_bias", True))
    if bool(raw.get("mlp_fc2_bias", True)) != mlp_bias:
        raise ModelError(f"{path}: mlp_fc1_bias and mlp_fc2_bias differ; bertserve runs NomicBERT with both or neither")
    return {
        "type_vocab_size": int_key(path, raw, "type_vocab_size", 2),
        "layer_norm_eps": float_key(path, raw, "layer_norm_epsilon", 1e-5),
        "attention_bias": bool(raw.get("qkv_proj_bias", True)),
        "mlp_bias": mlp_bias,
        "rotary_dim": rotary,
        "rope_theta_global": _base(path, raw, "rotary_emb_base", 10_000.0),
        "glu": raw.get("activation_function") in _NOMIC_GATED,
    }


def jina_bert_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    if raw.get("position_embedding_type") != "alibi":
        raise ModelError(
            f"{path}: JinaBERT with position_embedding_type {raw.get('position_embedding_type')!r}: "
            "bertserve runs it with ALiBi only"
        )
    kind = raw.get("feed_forward_type", "original")
    if kind not in ("geglu", "reglu", "original"):
        raise ModelError(f"{path}: feed_forward_type {kind!r} is not supported (geglu, reglu or original)")
    scaling = raw.get("alibi_scaling", 1)
    if scaling not in (None, 1):
        raise ModelError(f"{path}: alibi_scaling {scaling!r} is not supported (only ALiBi as trained)")
    act = {"geglu": "gelu", "reglu": "relu"}.get(kind, raw.get("hidden_act", "gelu"))
    return {
        "type_vocab_size": int_key(path, raw, "type_vocab_size", 2),
        "layer_norm_eps": float_key(path, raw, "layer_norm_eps", 1e-12),
        "alibi": True,
        "glu": kind != "original",
        "hidden_act": act,
    }


def _base(path: str, raw: dict[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 1.0 < value < 1e12:
        raise ModelFileError(f"{path}: {key} should be a number above 1, not {value!r}")
    return float(value)


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's slope for each head: a geometric series from 2^(-8/n) for n a power of two,
    else the power of two below's, then every other one of twice that's."""

    def powers(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if math.log2(heads).is_integer():
        return powers(heads)
    below = 2 ** math.floor(math.log2(heads))
    return powers(below) + alibi_slopes(2 * below)[0::2][: heads - below]


# -- weights ------------------------------------------------------------------------------

_LAYER = r"^encoder\.layers?\.(\d+)\."
_OURS = r"bert/encoder/layer_\1/"
# jina-embeddings-v3's tensors under torch's parametrizations: the base weight, and each LoRA factor
_BASE = r"(?:parametrizations\.weight\.original|weight)"
_LORA = r"parametrizations\.weight\.0\.lora_(A|B)"
RENAMES = {
    "gte": [
        (r"^embeddings\.(word|token_type)_embeddings\.weight$", r"bert/embeddings/\1_embeddings"),
        (r"^embeddings\.LayerNorm\.weight$", "bert/embeddings/LayerNorm/gamma"),
        (r"^embeddings\.LayerNorm\.bias$", "bert/embeddings/LayerNorm/beta"),
        (_LAYER + r"attention\.qkv_proj\.(weight|bias)$", _OURS + r"attention/self/qkv/\2"),
        (_LAYER + r"attention\.([qkv])_proj\.(weight|bias)$", _OURS + r"attention/self/\2/\3"),
        (_LAYER + r"attention\.o_proj\.(weight|bias)$", _OURS + r"attention/output/dense/\2"),
        (_LAYER + r"attn_ln\.(weight|bias)$", _OURS + r"attention/output/LayerNorm/\2"),
        (_LAYER + r"mlp\.up_gate_proj\.weight$", _OURS + r"intermediate/up_gate/weight"),
        (_LAYER + r"mlp\.down_proj\.(weight|bias)$", _OURS + r"output/dense/\2"),
        (_LAYER + r"mlp_ln\.(weight|bias)$", _OURS + r"output/LayerNorm/\2"),
    ],
    "nomic_bert": [
        (r"^embeddings\.(word|token_type)_embeddings\.weight$", r"bert/embeddings/\1_embeddings"),
        (r"^emb_ln\.weight$", "bert/embeddings/LayerNorm/gamma"),
        (r"^emb_ln\.bias$", "bert/embeddings/LayerNorm/beta"),
        (_LAYER + r"attn\.Wqkv\.(weight|bias)$", _OURS + r"attention/self/qkv/\2"),
        (_LAYER + r"attn\.out_proj\.(weight|bias)$", _OURS + r"attention/output/dense/\2"),
        (_LAYER + r"norm1\.(weight|bias)$", _OURS + r"attention/output/LayerNorm/\2"),
        (_LAYER + r"mlp\.fc11\.(weight|bias)$", _OURS + r"intermediate/up/\2"),
        (_LAYER + r"mlp\.fc12\.(weight|bias)$", _OURS + r"intermediate/gate/\2"),
        (_LAYER + r"mlp\.fc1\.(weight|bias)$", _OURS + r"intermediate/dense/\2"),
        (_LAYER + r"mlp\.fc2\.(weight|bias)$", _OURS + r"output/dense/\2"),
        (_LAYER + r"norm2\.(weight|bias)$", _OURS + r"output/LayerNorm/\2"),
    ],
    "jina_bert": [
        (r"^embeddings\.(word|token_type)_embeddings\.weight$", r"bert/embeddings/\1_embeddings"),
        (r"^embeddings\.LayerNorm\.weight$", "bert/embeddings/LayerNorm/gamma"),
        (r"^embeddings\.LayerNorm\.bias$", "bert/embeddings/LayerNorm/beta"),
        (_LAYER + r"attention\.self\.(query|key|value)\.(weight|bias)$", _OURS + r"attention/self/\2/\3"),
        (_LAYER + r"attention\.output\.dense\.(weight|bias)$", _OURS + r"attention/output/dense/\2"),
        (_LAYER + r"attention\.output\.LayerNorm\.(weight|bias)$", _OURS + r"attention/output/LayerNorm/\2"),
        (_LAYER + r"mlp\.gated_layers\.weight$", _OURS + r"intermediate/gate_up/weight"),
        (_LAYER + r"intermediate\.dense\.(weight|bias)$", _OURS + r"intermediate/dense/\2"),
        (_LAYER + r"mlp\.wo\.(weight|bias)$", _OURS + r"output/dense/\2"),
        (_LAYER + r"output\.dense\.(weight|bias)$", _OURS + r"output/dense/\2"),
        (_LAYER + r"mlp\.layernorm\.(weight|bias)$", _OURS + r"output/LayerNorm/\2"),
        (_LAYER + r"output\.LayerNorm\.(weight|bias)$", _OURS + r"output/LayerNorm/\2"),
        (r"^pooler\.dense\.(weight|bias)$", r"bert/pooler/dense/\1"),
    ],
    "jina_v3": [
        (rf"^embeddings\.(word|token_type)_embeddings\.{_BASE}$", r"bert/embeddings/\1_embeddings"),
        (rf"^embeddings\.(word|token_type)_embeddings\.{_LORA}$", r"lora/\1_embeddings/\2"),
        (r"^emb_ln\.(weight|bias)$", r"bert/embeddings/LayerNorm/\1"),
        *(
            rename
            for theirs, ours, role in (
                (r"mixer\.Wqkv", "attention/self/qkv", "qkv"),
                (r"mixer\.out_proj", "attention/output/dense", "attn_out"),
                (r"mlp\.fc1", "intermediate/dense", "ffn_in"),
                (r"mlp\.fc2", "output/dense", "ffn_out"),
            )
            for rename in (
                (rf"{_LAYER}{theirs}\.{_BASE}$", rf"{_OURS}{ours}/weight"),
                (rf"{_LAYER}{theirs}\.bias$", rf"{_OURS}{ours}/bias"),
                (rf"{_LAYER}{theirs}\.{_LORA}$", rf"lora/layer_\1/{role}/\2"),
            )
        ),
        (_LAYER + r"norm1\.(weight|bias)$", _OURS + r"attention/output/LayerNorm/\2"),
        (_LAYER + r"norm2\.(weight|bias)$", _OURS + r"output/LayerNorm/\2"),
    ],
}


def final_name(name: str) -> str:
    """A renamed tensor under Google's last part: kernel, bias, gamma, beta."""
    if "/LayerNorm/" in name:
        return name.replace("/weight", "/gamma").replace("/bias", "/beta")
    return name.replace("/weight", "/kernel")


def shapes(config: Any, present: set[str]) -> dict[str, tuple[int, ...]]:
    """The shape of each tensor a model of a variant family has (``present``: the names the
    checkpoint holds, which say whether GTE's Q, K and V are packed)."""
    h, i = config.hidden_size, config.intermediate_size
    out: dict[str, tuple[int, ...]] = {
        "bert/embeddings/word_embeddings": (config.vocab_size, h),
        "bert/embeddings/LayerNorm/gamma": (h,),
        "bert/embeddings/LayerNorm/beta": (h,),
    }
    if config.type_vocab_size:
        out["bert/embeddings/token_type_embeddings"] = (config.type_vocab_size, h)
    for n in range(config.num_hidden_layers):
        layer = f"bert/encoder/layer_{n}/"
        own: dict[str, tuple[int, ...]] = {}
        if config.family == "jina_bert" or layer + "attention/self/q/kernel" in present:
            names = ("query", "key", "value") if config.family == "jina_bert" else ("q", "k", "v")
            own.update({f"attention/self/{x}/kernel": (h, h) for x in names})
        else:
            own["attention/self/qkv/kernel"] = (h, 3 * h)
        own["attention/output/dense/kernel"] = (h, h)
        own["output/dense/kernel"] = (i, h)
        if not config.glu:
            own["intermediate/dense/kernel"] = (h, i)
        elif config.family == "gte":
            own["intermediate/up_gate/kernel"] = (h, 2 * i)
        elif config.family == "jina_bert":
            own["intermediate/gate_up/kernel"] = (h, 2 * i)
        else:
            own["intermediate/up/kernel"] = own["intermediate/gate/kernel"] = (h, i)
        for block in ("attention/output", "output"):
            own[f"{block}/LayerNorm/gamma"] = own[f"{block}/LayerNorm/beta"] = (h,)
        for name in [name for name in own if name.endswith("/kernel")]:
            if _has_bias(config, name):
                own[name.replace("/kernel", "/bias")] = (own[name][1],)
        out.update({layer + name: shape for name, shape in own.items()})
    out.update(lora_shapes(config))
    return out


#: The products that carry LoRA adapters, by role, and their (in, out) widths' names.
LORA_PRODUCTS = {"qkv": ("h", "3h"), "attn_out": ("h", "h"), "ffn_in": ("h", "i"), "ffn_out": ("i", "h")}


def lora_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """jina-embeddings-v3's LoRA factors, as its checkpoint holds them: for a product of
    ``in`` to ``out``, A [adapters, rank, in] and B [adapters, out, rank]; for an embedding
    table of ``rows``, A [adapters, rows, rank] and B [adapters, rank, hidden]."""
    n, r, h = len(config.adapters), config.lora_rank, config.hidden_size
    if not n:
        return {}
    width = {"h": h, "3h": 3 * h, "i": config.intermediate_size}
    out: dict[str, tuple[int, ...]] = {}
    for table, rows in (("word", config.vocab_size), ("token_type", config.type_vocab_size)):
        out[f"lora/{table}_embeddings/A"], out[f"lora/{table}_embeddings/B"] = (n, rows, r), (n, r, h)
    for layer in range(config.num_hidden_layers):
        for role, (into, outof) in LORA_PRODUCTS.items():
            out[f"lora/layer_{layer}/{role}/A"] = (n, r, width[into])
            out[f"lora/layer_{layer}/{role}/B"] = (n, width[outof], r)
    return out


def _has_bias(config: Any, kernel: str) -> bool:
    """Whether the product ``kernel`` has a bias: the fused gated ones never do; the others as
    the config says (NomicBERT's ``qkv_proj_bias``, ``mlp_fc1_bias``; always for GTE and JinaBERT)."""
    if kernel.endswith(("/up_gate/kernel", "/gate_up/kernel")):
        return False
    return config.attention_bias if kernel.startswith("attention/") else config.mlp_bias
