"""No model served wrong in silence: what a ``config.json`` may carry that changes an encoder's
maths beyond what bertserve reads for its family, and the refusal that names it.

A config that says ``bert`` or ``xlm-roberta`` and carries rotary or ALiBi keys, LoRA adapters
or model code of its own is another model (jina-embeddings-v3 is an XLM-RoBERTa with rotary
positions and LoRA adapters): its weights would load into the family's forward pass and give
wrong vectors.
"""

from __future__ import annotations

from typing import Any

from ..errors import ModelError
from .bert_variants import CODE

ROTARY_FAMILIES = ("modernbert", "qwen3", "gemma3", "gte", "nomic_bert", "jina_v3")  # rotary keys read, not refused
_OWN_POSITIONS = {"gte": "rope", "jina_bert": "alibi", "jina_v3": "rotary"}  # position_embedding_type as read

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
    if family not in ROTARY_FAMILIES and position not in ("absolute", None, _OWN_POSITIONS.get(family)):
        raise ModelError(
            f"{path}: position_embedding_type {position!r}: bertserve runs {family} with absolute positions only, "
            f"and would compute this model wrong; {ELSEWHERE}"
        )
    rotary = [] if family in ROTARY_FAMILIES else [key for key in _ROTARY_KEYS if _given(raw, key)]
    alibi = [] if family == "jina_bert" else [key for key in _ALIBI_KEYS if _given(raw, key)]
    for keys, what in ((rotary, "rotary positions"), (alibi, "ALiBi attention")):
        if keys:
            raise ModelError(
                f"{path}: {keys[0]} says {what}, which bertserve's {family} does not compute; "
                f"it would serve this model wrong; {ELSEWHERE}"
            )
    lora = [] if family == "jina_v3" else [key for key in _LORA_KEYS if _given(raw, key)]
    if lora:
        raise ModelError(
            f"{path}: {lora[0]} says the model carries LoRA adapters, which bertserve does not apply; "
            f"merge the adapter you want into the weights (PEFT's merge_and_unload) and serve that, or: {ELSEWHERE}"
        )
    auto_map = raw.get("auto_map")
    code = {k: v for k, v in auto_map.items() if str(k).startswith("AutoModel")} if isinstance(auto_map, dict) else {}
    if family in CODE:  # the family's own published code is what bertserve computes
        code = {k: v for k, v in code.items() if not str(v).startswith(CODE[family] + "--")}
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
