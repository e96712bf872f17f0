"""The encoder families bertserve runs, told apart by a model's ``config.json``.

``model_type`` names the family (``architectures`` when it is missing; a Google
``bert_config.json`` has neither and is BERT). Each family's config keys are read into one
:class:`EncoderConfig`, which the forward passes (:mod:`.bert` for the post-norm families,
:mod:`.modernbert`) and the weight reader (:mod:`.weights`) take:

============  =======================================================================
family        what differs from BERT
============  =======================================================================
roberta       positions start after the padding index; one token type (XLM-RoBERTa,
              CamemBERT are this family too)
distilbert    no token types, no pooler; its own config keys and weight names
mpnet         positions as RoBERTa's, no token types, and a bucketed relative position
              bias added to every layer's attention scores
modernbert    pre-norm, no biases by default, rotary positions, GeGLU, every few layers
              global attention and the others a sliding window
qwen3         a decoder (Qwen3-Embedding): pre-norm with RMSNorm, grouped-query attention
              with its own head width and RMSNorm on each query and key head, rotary
              positions, causal attention, SwiGLU; no token types, no pooler
gemma3        Gemma3's text model (EmbeddingGemma): as qwen3, with bidirectional attention
              in a window on most layers, GeGLU, norms after attention and the feed-forward
              too, scaled embeddings (:mod:`.decoder` says how each differs)
gte           GTE's "new" model, NomicBERT, JinaBERT and jina-embeddings-v3: post-norm BERTs
nomic_bert    with rotary positions or ALiBi, gated feed-forwards or LoRA task adapters, each
jina_bert     shipping code of its own (:mod:`.bert_variants` says how each differs)
jina_v3
============  =======================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelError, ModelFileError, ModelShapeError
from . import bert_variants
from .config_guard import ROTARY_FAMILIES, refuse_unread_maths
from .config_values import LIMITS, float_key, int_key
from .decoder_config import gemma3_keys, qwen3_keys
from .json_file import read_json

#: ``model_type`` -> family. Sentence-transformers' models keep the base model's type.
_MODEL_TYPES = {
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "camembert": "roberta",
    "distilbert": "distilbert",
    "mpnet": "mpnet",
    "modernbert": "modernbert",
    "qwen3": "qwen3",
    "gemma3-text": "gemma3",
    "new": "gte",
    "nomic-bert": "nomic_bert",
}
#: ``architectures`` prefixes, for a config without ``model_type``, longest first.
_ARCHITECTURES = (
    ("XLMRoberta", "roberta"),
    ("Camembert", "roberta"),
    ("Roberta", "roberta"),
    ("DistilBert", "distilbert"),
    ("ModernBert", "modernbert"),
    ("Qwen3", "qwen3"),
    ("Gemma3Text", "gemma3"),
    ("NewModel", "gte"),
    ("NomicBert", "nomic_bert"),
    ("JinaBert", "jina_bert"),
    ("MPNet", "mpnet"),
    ("Bert", "bert"),
)
FAMILIES = ("bert", "roberta", "distilbert", "mpnet", "modernbert", "qwen3", "gemma3", *bert_variants.VARIANTS)
SUPPORTED = (
    "BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT, MPNet, ModernBERT, Qwen3, Gemma3, GTE (new), NomicBERT, "
    "JinaBERT and jina-embeddings-v3"
)
DECODERS = ("qwen3", "gemma3")  # run by .decoder

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu")
DECODER_ACTIVATIONS = {"qwen3": ("silu",), "gemma3": ("gelu_pytorch_tanh",)}  # SwiGLU, GeGLU
VARIANT_ACTIVATIONS = {"nomic_bert": ("silu", "gelu", "gelu_new")}  # SwiGLU, GeGLU, or an ungated MLP


@dataclass(frozen=True)
class EncoderConfig:
    """One encoder's shape, in every family's terms. Fields a family does not use keep
    their defaults; all of it goes into the graph cache's key."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2  # 0: the family has no token type embeddings
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    family: str = "bert"
    position_offset: int = 0  # position of the first token: padding index + 1 for RoBERTa's kind
    relative_attention_buckets: int = 0  # MPNet's relative position bias
    relative_max_distance: int = 128
    # ModernBERT: per layer, the sliding window's half-width (0: global attention)
    layer_windows: tuple[int, ...] = field(default_factory=tuple)
    rope_theta_global: float = 160_000.0
    rope_theta_local: float = 10_000.0
    norm_bias: bool = True
    attention_bias: bool = True
    mlp_bias: bool = True
    # The decoders (.decoder): grouped-query attention (key and value heads), each head's width,
    # causal or not, the scores' and the embeddings' scales, norms scaling by offset + weight,
    # and norms after attention and the feed-forward too (Gemma3)
    num_key_value_heads: int = 0
    head_dim: int = 0
    causal: bool = False
    attention_scale: float = 0.0  # 0: head_dim ** -0.5
    embedding_scale: float = 1.0
    norm_offset: float = 0.0
    post_norms: bool = False
    # The BERT variants (.bert_variants): rotary positions over the first rotary_dim values of
    # each head (0: none; rope_theta_global their base, NTK-scaled by rope_ntk_factor), ALiBi,
    # and a gated feed-forward (act(gate) * up)
    rotary_dim: int = 0
    rope_ntk_factor: float = 1.0
    alibi: bool = False
    glu: bool = False
    # jina-embeddings-v3's LoRA task adapters: their names, rank, and scale (alpha / rank)
    adapters: tuple[str, ...] = field(default_factory=tuple)
    lora_rank: int = 0
    lora_scaling: float = 0.0

    @property
    def max_tokens(self) -> int:
        """The longest input the position table allows, special tokens included."""
        if self.family in ROTARY_FAMILIES or self.family == "jina_bert":
            return self.max_position_embeddings
        return self.max_position_embeddings - self.position_offset

    @property
    def has_pooler(self) -> bool:
        return self.family not in ("distilbert", "modernbert", "gte", "nomic_bert", "jina_v3", *DECODERS)

    @classmethod
    def from_json(cls, path: str) -> EncoderConfig:
        return read_config(path, read_json(path))


def family_of(path: str, raw: dict[str, Any]) -> str:
    """The family ``raw`` (the content of ``path``) belongs to, or a :class:`ModelError`
    naming the families bertserve runs."""
    model_type = raw.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ModelFileError(f"{path}: model_type should be a string, not {model_type!r}")
    if isinstance(model_type, str):
        family = _MODEL_TYPES.get(model_type.lower().replace("_", "-"))
        if family is None:
            raise ModelError(
                f"{path}: model_type {model_type!r} is not a family bertserve runs; it runs {SUPPORTED} encoders"
            )
        if family == "bert" and bert_variants.jina_bert(raw):
            return "jina_bert"
        return "jina_v3" if family == "roberta" and bert_variants.jina_v3(raw) else family
    architectures = raw.get("architectures")
    if isinstance(architectures, list) and architectures:
        name = str(architectures[0])
        for prefix, family in _ARCHITECTURES:
            if name.startswith(prefix):
                return family
        raise ModelError(f"{path}: architecture {name!r} is not one bertserve runs; it runs {SUPPORTED} encoders")
    return "bert"


def read_config(path: str, raw: dict[str, Any]) -> EncoderConfig:
    """``raw`` (the content of ``path``) as an :class:`EncoderConfig`, checked; a config whose
    maths the family here would not compute is refused (:func:`refuse_unread_maths`)."""
    family = family_of(path, raw)
    refuse_unread_maths(path, raw, family)
    if family == "distilbert":
        raw = _distilbert_keys(raw)
    if family == "nomic_bert":
        raw = bert_variants.nomic_as_bert(raw)
    required = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
    )
    missing = [key for key in required if not isinstance(raw.get(key), int) or isinstance(raw.get(key), bool)]
    if missing:
        theirs = {"distilbert": _DISTILBERT_NAMES, "nomic_bert": bert_variants.NOMIC_NAMES}.get(family, {})
        named = [theirs.get(key, key) for key in missing]
        raise ModelFileError(f"{path}: missing or non-integer {', '.join(named)}")
    for key in required:
        if not 1 <= raw[key] <= LIMITS[key]:
            raise ModelShapeError(f"{path}: {key} {raw[key]} is outside 1 to {LIMITS[key]:,}")
    values: dict[str, Any] = {key: raw[key] for key in required}
    if values["hidden_size"] % values["num_attention_heads"] and family not in DECODERS:  # they say their head width
        raise ModelShapeError(
            f"{path}: hidden_size {values['hidden_size']} is not a multiple of "
            f"num_attention_heads {values['num_attention_heads']}"
        )
    act = raw.get("hidden_activation" if family in ("modernbert", "gemma3") else "hidden_act", "gelu")
    allowed = DECODER_ACTIVATIONS.get(family, VARIANT_ACTIVATIONS.get(family, ACTIVATIONS))
    if act not in allowed:
        raise ModelError(f"{path}: activation {act!r} is not supported ({', '.join(allowed)})")
    values.update(family=family, hidden_act=act)
    values.update(_FAMILY_KEYS[family](path, raw))
    if not 0.0 <= values["layer_norm_eps"] < 1.0:
        raise ModelFileError(f"{path}: the layer norm's epsilon {values['layer_norm_eps']} is outside 0 to 1")
    return EncoderConfig(**values)


def _bert_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    return {
        "type_vocab_size": int_key(path, raw, "type_vocab_size", 2),
        "layer_norm_eps": float_key(path, raw, "layer_norm_eps", 1e-12),
    }


def _roberta_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    # transformers' defaults for a key left out (its published configs say 1 and 1e-5)
    return {
        "type_vocab_size": int_key(path, raw, "type_vocab_size", 2),
        "layer_norm_eps": float_key(path, raw, "layer_norm_eps", 1e-12),
        "position_offset": _offset(path, raw),
    }


def _offset(path: str, raw: dict[str, Any]) -> int:
    """Where RoBERTa's positions start: past the padding index, inside the position table."""
    pad = int_key(path, raw, "pad_token_id", 1)
    if not 0 <= pad < raw["max_position_embeddings"] - 1:
        raise ModelShapeError(
            f"{path}: pad_token_id {pad} leaves no position in the {raw['max_position_embeddings']} the model has"
        )
    return pad + 1


_DISTILBERT_NAMES = {
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "hidden_dim",
}


def _distilbert_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """DistilBERT's config under BERT's key names."""
    renamed = {theirs: ours for ours, theirs in _DISTILBERT_NAMES.items()}
    out = {renamed.get(key, key): value for key, value in raw.items()}
    out["intermediate_size"] = raw.get("hidden_dim")
    out["hidden_act"] = raw.get("activation", "gelu")
    return out


def _distilbert_family_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    return {"type_vocab_size": 0, "layer_norm_eps": 1e-12}


def _mpnet_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    # MPNet's embeddings hard-code padding index 1, whatever pad_token_id says.
    return {
        "type_vocab_size": 0,
        "layer_norm_eps": float_key(path, raw, "layer_norm_eps", 1e-12),
        "position_offset": 2,
        "relative_attention_buckets": _buckets(path, raw),
    }


def _buckets(path: str, raw: dict[str, Any]) -> int:
    """MPNet's relative position table: it computes buckets 0 to 31 whatever the config says."""
    buckets = int_key(path, raw, "relative_attention_num_buckets", 32)
    if not 32 <= buckets <= 4096:
        raise ModelShapeError(f"{path}: relative_attention_num_buckets {buckets} is outside 32 to 4096")
    return buckets


def _modernbert_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    layers = int(raw["num_hidden_layers"])
    local = int_key(path, raw, "local_attention", 128)
    if not 2 <= local <= 1 << 21:
        raise ModelShapeError(f"{path}: local_attention {local} is outside 2 to {1 << 21:,}")
    half_window = local // 2
    layer_types = raw.get("layer_types")
    if layer_types is not None:
        kinds = ("sliding_attention", "full_attention")
        if not isinstance(layer_types, list) or len(layer_types) != layers or not set(layer_types) <= set(kinds):
            raise ModelFileError(f"{path}: layer_types should list {layers} of {' or '.join(kinds)}")
        windows = tuple(half_window if kind == "sliding_attention" else 0 for kind in layer_types)
    else:
        every = max(int_key(path, raw, "global_attn_every_n_layers", 3), 1)
        windows = tuple(half_window if i % every else 0 for i in range(layers))
    declared = raw.get("rope_parameters")
    rope: dict[str, Any] = declared if isinstance(declared, dict) else {}
    theta_global = _theta(path, rope, "full_attention", raw.get("global_rope_theta", 160_000.0))
    theta_local = _theta(path, rope, "sliding_attention", raw.get("local_rope_theta", 10_000.0))
    for rope_layer in ("full_attention", "sliding_attention"):
        section = rope.get(rope_layer)
        kind = section.get("rope_type", "default") if isinstance(section, dict) else "default"
        if kind != "default":
            raise ModelError(f"{path}: rope_type {kind!r} is not supported (only the default rotary positions)")
    return {
        "type_vocab_size": 0,
        "layer_norm_eps": float_key(path, raw, "norm_eps", 1e-5),
        "layer_windows": windows,
        "rope_theta_global": theta_global,
        "rope_theta_local": theta_local,
        "norm_bias": bool(raw.get("norm_bias", False)),
        "attention_bias": bool(raw.get("attention_bias", False)),
        "mlp_bias": bool(raw.get("mlp_bias", False)),
    }


def _theta(path: str, rope: dict[str, Any], layer: str, default: Any) -> float:
    """A rotary base: from ``rope_parameters`` (transformers 5's format) or the older key."""
    section = rope.get(layer)
    value = section.get("rope_theta", default) if isinstance(section, dict) else default
    if not isinstance(value, int | float) or isinstance(value, bool) or not 1.0 < value < 1e12:
        raise ModelFileError(f"{path}: the rotary base of the {layer} layers should be a number above 1, not {value!r}")
    return float(value)


_FAMILY_KEYS = {
    "bert": _bert_keys,
    "roberta": _roberta_keys,
    "distilbert": _distilbert_family_keys,
    "mpnet": _mpnet_keys,
    "modernbert": _modernbert_keys,
    "qwen3": qwen3_keys,
    "gemma3": gemma3_keys,
    "gte": bert_variants.gte_keys,
    "nomic_bert": bert_variants.nomic_keys,
    "jina_bert": bert_variants.jina_bert_keys,
    "jina_v3": bert_variants.jina_v3_keys,
}
