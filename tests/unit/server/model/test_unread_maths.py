"""No model served wrong in silence: a config.json of a family bertserve runs is refused when it
carries what changes the maths beyond what the loader reads, naming the key.

jina-embeddings-v3's config says ``xlm-roberta`` and ``XLMRobertaModel``, and is an XLM-RoBERTa
with rotary positions, LoRA task adapters and code of its own: without the guard its weights
would load into bertserve's XLM-RoBERTa and give wrong vectors.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bertserve.server import ModelConfig
from bertserve.server.errors import ModelError
from bertserve.server.model.families import EncoderConfig
from bertserve.server.model.model_dir import inspect_model

DATA = Path(__file__).resolve().parents[3] / "data"

JINA_V3: dict[str, Any] = {  # its published config.json, keys and values as released
    "_name_or_path": "jinaai/jina-embeddings-v3",
    "architectures": ["XLMRobertaModel"],
    "attention_probs_dropout_prob": 0.1,
    "auto_map": {
        "AutoConfig": "jinaai/xlm-roberta-flash-implementation--configuration_xlm_roberta.XLMRobertaFlashConfig",
        "AutoModel": "jinaai/xlm-roberta-flash-implementation--modeling_lora.XLMRobertaLoRA",
        "AutoModelForPreTraining": (
            "jinaai/xlm-roberta-flash-implementation--modeling_xlm_roberta.XLMRobertaForPreTraining"
        ),
    },
    "bos_token_id": 0,
    "classifier_dropout": None,
    "emb_pooler": None,
    "eos_token_id": 2,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "layer_norm_eps": 1e-05,
    "load_trained_adapters": True,
    "lora_adaptations": ["retrieval.query", "retrieval.passage", "separation", "classification", "text-matching"],
    "lora_alpha": 1,
    "lora_dropout_p": 0.0,
    "lora_main_params_trainable": False,
    "lora_rank": 4,
    "matryoshka_dimensions": [32, 64, 128, 256, 512, 768, 1024],
    "max_position_embeddings": 8194,
    "model_type": "xlm-roberta",
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "output_past": True,
    "pad_token_id": 1,
    "position_embedding_type": "rotary",
    "rotary_emb_base": 20000.0,
    "torch_dtype": "bfloat16",
    "type_vocab_size": 1,
    "use_cache": True,
    "use_flash_attn": True,
    "vocab_size": 250002,
}


def _read(raw: dict[str, Any], tmp_path: Path) -> EncoderConfig:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return EncoderConfig.from_json(str(path))


def test_jina_v3_is_read_as_its_own_code_computes_it_and_without_that_code_refused(tmp_path: Path) -> None:
    config = _read(JINA_V3, tmp_path)  # its auto_map names its published code: bertserve's jina_v3
    assert (config.family, config.rotary_dim, config.rope_theta_global) == ("jina_v3", 64, 20000.0)
    assert config.adapters == tuple(JINA_V3["lora_adaptations"]) and config.lora_scaling == 0.25
    shaped = {key: value for key, value in JINA_V3.items() if key != "auto_map"}  # says xlm-roberta, and no more
    with pytest.raises(ModelError, match="position_embedding_type 'rotary'") as refused:
        _read(shaped, tmp_path)
    assert "trust_remote_code=True" in str(refused.value)  # what would serve it


@pytest.mark.parametrize(
    ("kept", "said"),
    [
        ("rotary_emb_base", "rotary_emb_base says rotary positions"),
        ("lora_adaptations", "lora_adaptations says the model carries LoRA adapters"),
        ("auto_map", "auto_map names model code of its own (AutoModel: someone/"),
    ],
)
def test_each_key_alone_is_refused_by_its_name(tmp_path: Path, kept: str, said: str) -> None:
    others = {"position_embedding_type", "rotary_emb_base", "auto_map", *(k for k in JINA_V3 if k.startswith("lora_"))}
    raw = {key: value for key, value in JINA_V3.items() if key not in others - {kept}}
    if kept == "auto_map":  # code other than jina-embeddings-v3's own
        raw["auto_map"] = {"AutoModel": "someone/xlm-roberta-custom--modeling.XLMRobertaModel"}
    if kept == "lora_adaptations":
        raw.update({key: JINA_V3[key] for key in JINA_V3 if key.startswith("lora_")})
    with pytest.raises(ModelError, match=said.replace("(", r"\(")):
        _read(raw, tmp_path)


@pytest.mark.parametrize(
    "extra",
    [
        {"position_embedding_type": "alibi"},
        {"position_embedding_type": "relative_key_query"},
        {"alibi": True},
        {"rope_theta": 10000.0},
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
        {"lora_rank": 8},
        {"auto_map": {"AutoModel": "org/code--modeling_bert.MyBertModel"}},
    ],
    ids=lambda extra: next(iter(extra)),
)
@pytest.mark.parametrize("family", ["bert_st6", "roberta", "xlm_roberta", "distilbert", "mpnet"])
def test_a_served_family_with_a_key_it_does_not_compute_is_refused(
    tmp_path: Path, family: str, extra: dict[str, Any]
) -> None:
    raw = json.loads((DATA / "families" / family / "config.json").read_text(encoding="utf-8"))
    assert _read(raw, tmp_path).hidden_size > 0  # served as it is
    with pytest.raises(ModelError, match=next(iter(extra))):
        _read({**raw, **extra}, tmp_path)


def test_what_says_nothing_is_no_reason_to_refuse(tmp_path: Path) -> None:
    raw = json.loads((DATA / "families" / "xlm_roberta" / "config.json").read_text(encoding="utf-8"))
    quiet = {"position_embedding_type": "absolute", "rope_scaling": None, "alibi": False, "lora_adaptations": []}
    config = _read({**raw, **quiet, "auto_map": {"AutoConfig": "org/x--configuration.Config"}}, tmp_path)
    assert config.family == "roberta"


def test_modernbert_keeps_its_own_rotary_positions(tmp_path: Path) -> None:
    raw = json.loads((DATA / "families" / "modernbert" / "config.json").read_text(encoding="utf-8"))
    assert _read(raw, tmp_path).family == "modernbert"
    with pytest.raises(ModelError, match="lora_rank"):
        _read({**raw, "lora_rank": 4}, tmp_path)


def test_a_model_directory_shaped_like_jina_v3_is_refused_before_anything_loads(tmp_path: Path) -> None:
    model = tmp_path / "jina-like"
    shutil.copytree(DATA / "families" / "xlm_roberta", model)
    raw = json.loads((model / "config.json").read_text(encoding="utf-8"))
    keys = ("position_embedding_type", "rotary_emb_base", "lora_adaptations", "lora_rank")  # not its code
    (model / "config.json").write_text(json.dumps({**raw, **{key: JINA_V3[key] for key in keys}}), encoding="utf-8")
    with pytest.raises(ModelError, match="position_embedding_type 'rotary'"):
        inspect_model(ModelConfig.of(model_dir=str(model)))


def _variant(name: str) -> dict[str, Any]:
    return json.loads((DATA / "families" / name / "config.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("name", "change", "said"),
    [
        ("gte", {"auto_map": {"AutoModel": "someone/other-impl--modeling.NewModel"}}, "auto_map names model code"),
        ("gte", {"layer_norm_type": "rms_norm"}, "layer_norm_type 'rms_norm'"),
        ("gte", {"logn_attention_scale": True}, "logn_attention_scale"),
        ("gte", {"rope_scaling": {"type": "ntk", "factor": 2.0, "mixed_b": 0.5}}, "rope_scaling"),
        ("gte", {"position_embedding_type": "absolute"}, "position_embedding_type 'absolute'"),
        ("gte", {"lora_rank": 4}, "lora_rank"),
        ("nomic_bert", {"prenorm": True}, "prenorm True says pre-norm blocks"),
        ("nomic_bert", {"rotary_emb_interleaved": True}, "interleaved"),
        ("nomic_bert", {"rotary_scaling_factor": 2.0}, "rotary_scaling_factor"),
        ("nomic_bert", {"attn_pdrop": 0.1}, "attn_pdrop 0.1"),
        ("nomic_bert", {"use_rms_norm": True}, "use_rms_norm"),
        ("nomic_bert", {"moe_every_n_layers": 2, "num_experts": 8}, "moe_every_n_layers 2 says mixture-of-experts"),
        ("nomic_bert", {"mlp_fc2_bias": True}, "mlp_fc1_bias and mlp_fc2_bias differ"),
        ("nomic_bert", {"alibi": True}, "alibi says ALiBi"),
        (
            "jina_bert",
            {"auto_map": {"AutoModel": "jinaai/jina-bert-v2-qk-post-norm--modeling_bert.JinaBertModel"}},
            "auto_map names model code",
        ),
        ("jina_bert", {"feed_forward_type": "swiglu"}, "feed_forward_type 'swiglu'"),
        ("jina_bert", {"position_embedding_type": "absolute"}, "ALiBi only"),
        ("jina_bert", {"rotary_emb_base": 10000.0}, "rotary_emb_base says rotary positions"),
    ],
    ids=lambda value: value if isinstance(value, str) and len(value) < 12 else None,
)
def test_a_bert_variant_with_what_its_code_would_compute_otherwise_is_refused(
    tmp_path: Path, name: str, change: dict[str, Any], said: str
) -> None:
    raw = _variant(name)
    assert _read(raw, tmp_path).family == name  # its own code, named in auto_map, is what bertserve computes
    with pytest.raises(ModelError, match=re.escape(said)):
        _read({**raw, **change}, tmp_path)


def test_a_bert_that_says_alibi_without_jinaberts_code_is_refused(tmp_path: Path) -> None:
    raw = _variant("jina_bert")
    del raw["auto_map"]
    raw["architectures"] = ["BertModel"]
    with pytest.raises(ModelError, match="position_embedding_type 'alibi'"):
        _read(raw, tmp_path)


def test_alibis_slopes_for_a_head_count_that_is_not_a_power_of_two() -> None:
    from bertserve.server.model.bert_variants import alibi_slopes

    twelve = [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    np.testing.assert_allclose(alibi_slopes(12), twelve)
    np.testing.assert_allclose(alibi_slopes(2), [2.0**-4, 2.0**-8])
