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
============  =======================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelError, ModelFileError, ModelShapeError
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
}
#: ``architectures`` prefixes, for a config without ``model_type``, longest first.
_ARCHITECTURES = (
    ("XLMRoberta", "roberta"),
    ("Camembert", "roberta"),
    ("Roberta", "roberta"),
    ("DistilBert", "distilbert"),
    ("ModernBert", "modernbert"),
    ("MPNet", "mpnet"),
    ("Bert", "bert"),
)
FAMILIES = ("bert", "roberta", "distilbert", "mpnet", "modernbert")
SUPPORTED = "BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT, MPNet and ModernBERT"

#: Bounds on a config's sizes, far above any encoder's (XLM-RoBERTa's vocabulary is 250,002,
#: ModernBERT's positions 8,192), so that a damaged or hostile config.json is refused before
#: anything is allocated for it.
_LIMITS = {
    "vocab_size": 4_000_000,
    "hidden_size": 65_536,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "intermediate_size": 262_144,
    "max_position_embeddings": 1 << 20,
}

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu")


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

    @property
    def max_tokens(self) -> int:
        """The longest input the position table allows, special tokens included."""
        if self.family == "modernbert":
            return self.max_position_embeddings
        return self.max_position_embeddings - self.position_offset

    @property
    def has_pooler(self) -> bool:
        return self.family not in ("distilbert", "modernbert")

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
        return family
    architectures = raw.get("architectures")
    if isinstance(architectures, list) and architectures:
        name = str(architectures[0])
        for prefix, family in _ARCHITECTURES:
            if name.startswith(prefix):
                return family
        raise ModelError(f"{path}: architecture {name!r} is not one bertserve runs; it runs {SUPPORTED} encoders")
    return "bert"


#: Keys that change an encoder's maths in ways the families here do not compute: a config that
#: says ``bert`` or ``xlm-roberta`` and carries one is another model (jina-embeddings-v3 is an
#: XLM-RoBERTa with rotary positions and LoRA adapters), and would be served wrong in silence.
_ROTARY_KEYS = (
    *("rotary_emb_base", "rotary_emb_dim", "rotary_emb_fraction", "rotary_emb_interleaved", "rotary_emb_scale_base"),
    *("rope_theta", "rope_scaling", "rope_parameters"),
)
_ALIBI_KEYS = ("alibi", "use_alibi", "alibi_bias_max", "alibi_slopes")
_LORA_KEYS = ("lora_adaptations", "lora_rank", "lora_alpha", "lora_dropout_p", "lora_main_params_trainable")
ELSEWHERE = "sentence-transformers with trust_remote_code=True runs such a model with its own code"


def refuse_unread_maths(path: str, raw: dict[str, Any], family: str) -> None:
    """Raise a :class:`ModelError` naming the key when ``raw`` carries what changes the maths
    beyond what the loader reads for ``family``: positions other than absolute, rotary or
    ALiBi keys, LoRA adapters, or model code of its own (``auto_map``)."""
    position = raw.get("position_embedding_type", "absolute")
    if family != "modernbert" and position not in ("absolute", None):
        raise ModelError(
            f"{path}: position_embedding_type {position!r}: bertserve runs {family} with absolute positions only, "
            f"and would compute this model wrong; {ELSEWHERE}"
        )
    rotary = [] if family == "modernbert" else [key for key in _ROTARY_KEYS if _given(raw, key)]
    alibi = [key for key in _ALIBI_KEYS if _given(raw, key)]
    for keys, what in ((rotary, "rotary positions"), (alibi, "ALiBi attention")):
        if keys:
            raise ModelError(
                f"{path}: {keys[0]} says {what}, which bertserve's {family} does not compute; "
                f"it would serve this model wrong; {ELSEWHERE}"
            )
    lora = [key for key in _LORA_KEYS if _given(raw, key)]
    if lora:
        raise ModelError(
            f"{path}: {lora[0]} says the model carries LoRA adapters, which bertserve does not apply; "
            f"merge the adapter you want into the weights (PEFT's merge_and_unload) and serve that, or: {ELSEWHERE}"
        )
    auto_map = raw.get("auto_map")
    code = {k: v for k, v in auto_map.items() if str(k).startswith("AutoModel")} if isinstance(auto_map, dict) else {}
    if code:
        name, target = next(iter(code.items()))
        raise ModelError(
            f"{path}: auto_map names model code of its own ({name}: {str(target)[:120]}): the model computes what "
            f"that code says, not what transformers' {family} does, and bertserve does not run it; {ELSEWHERE}"
        )


def _given(raw: dict[str, Any], key: str) -> bool:
    """``key`` is in ``raw`` with a value that says something (not null, false or empty)."""
    value = raw.get(key)
    return value is not None and value is not False and value != [] and value != {}


def read_config(path: str, raw: dict[str, Any]) -> EncoderConfig:
    """``raw`` (the content of ``path``) as an :class:`EncoderConfig`, checked; a config whose
    maths the family here would not compute is refused (:func:`refuse_unread_maths`)."""
    family = family_of(path, raw)
    refuse_unread_maths(path, raw, family)
    if family == "distilbert":
        raw = _distilbert_keys(raw)
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
        named = [_DISTILBERT_NAMES.get(key, key) if family == "distilbert" else key for key in missing]
        raise ModelFileError(f"{path}: missing or non-integer {', '.join(named)}")
    for key in required:
        if not 1 <= raw[key] <= _LIMITS[key]:
            raise ModelShapeError(f"{path}: {key} {raw[key]} is outside 1 to {_LIMITS[key]:,}")
    values: dict[str, Any] = {key: raw[key] for key in required}
    if values["hidden_size"] % values["num_attention_heads"]:
        raise ModelShapeError(
            f"{path}: hidden_size {values['hidden_size']} is not a multiple of "
            f"num_attention_heads {values['num_attention_heads']}"
        )
    act = raw.get("hidden_activation" if family == "modernbert" else "hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ModelError(f"{path}: activation {act!r} is not supported ({', '.join(ACTIVATIONS)})")
    values.update(family=family, hidden_act=act)
    values.update(_FAMILY_KEYS[family](path, raw))
    if not 0.0 <= values["layer_norm_eps"] < 1.0:
        raise ModelFileError(f"{path}: the layer norm's epsilon {values['layer_norm_eps']} is outside 0 to 1")
    return EncoderConfig(**values)


def _bert_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    return {
        "type_vocab_size": _int(path, raw, "type_vocab_size", 2),
        "layer_norm_eps": _float(path, raw, "layer_norm_eps", 1e-12),
    }


def _roberta_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    # transformers' defaults for a key left out (its published configs say 1 and 1e-5)
    return {
        "type_vocab_size": _int(path, raw, "type_vocab_size", 2),
        "layer_norm_eps": _float(path, raw, "layer_norm_eps", 1e-12),
        "position_offset": _offset(path, raw),
    }


def _offset(path: str, raw: dict[str, Any]) -> int:
    """Where RoBERTa's positions start: past the padding index, inside the position table."""
    pad = _int(path, raw, "pad_token_id", 1)
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
        "layer_norm_eps": _float(path, raw, "layer_norm_eps", 1e-12),
        "position_offset": 2,
        "relative_attention_buckets": _buckets(path, raw),
    }


def _buckets(path: str, raw: dict[str, Any]) -> int:
    """MPNet's relative position table: it computes buckets 0 to 31 whatever the config says."""
    buckets = _int(path, raw, "relative_attention_num_buckets", 32)
    if not 32 <= buckets <= 4096:
        raise ModelShapeError(f"{path}: relative_attention_num_buckets {buckets} is outside 32 to 4096")
    return buckets


def _modernbert_keys(path: str, raw: dict[str, Any]) -> dict[str, Any]:
    layers = int(raw["num_hidden_layers"])
    local = _int(path, raw, "local_attention", 128)
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
        every = max(_int(path, raw, "global_attn_every_n_layers", 3), 1)
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
        "layer_norm_eps": _float(path, raw, "norm_eps", 1e-5),
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
}


def _int(path: str, raw: dict[str, Any], key: str, default: int) -> int:
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise ModelFileError(f"{path}: {key} should be an integer, not {value!r}")
    return value


def _float(path: str, raw: dict[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ModelFileError(f"{path}: {key} should be a number, not {value!r}")
    return float(value)
