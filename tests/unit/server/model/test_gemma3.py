"""Gemma3's text model as an embedder (EmbeddingGemma), beyond what every family is held to
(test_families): its prompts, its config as transformers reads it, and what it refuses.

``tests/data/families/gemma3`` is a tiny random ``Gemma3TextModel`` with bidirectional
attention (3 window layers, then one whole; a window of 8, which transformers reads as
``|i - j| <= 4``), 4 query heads over 2 key and value heads each 12 wide, scores scaled by
``query_pre_attn_scalar`` 16, rotary bases 100 (whole) and 10 (window), saved by
sentence-transformers with mean pooling, two Dense layers and Normalize, as EmbeddingGemma is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bertserve.server import Encoder, ModelConfig
from bertserve.server.errors import ModelError, ModelShapeError
from bertserve.server.model.families import EncoderConfig
from bertserve.server.model.options import resolve_options

DATA = Path(__file__).resolve().parents[3] / "data" / "families"
MODEL = DATA / "gemma3"

pytestmark = pytest.mark.skipif(not MODEL.is_dir(), reason="no Gemma3 reference model")


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def test_the_query_prompt_gives_sentence_transformers_query_vectors(tmp_path: Path) -> None:
    with np.load(DATA / "gemma3.npz") as data:
        sentences, st_query, st_default = [str(s) for s in data["sentences"]], data["st_query"], data["st_default"]
    info, _ = resolve_options(ModelConfig.of(model_dir=str(MODEL)))
    assert info["pooling_strategy"] == "REDUCE_MEAN" and info["normalize"] is True
    prompts = json.loads((MODEL / "config_sentence_transformers.json").read_text(encoding="utf-8"))["prompts"]
    encoder = Encoder(str(MODEL), dtype="fp32", graph_dir=str(tmp_path))
    queries = encoder.encode([prompts["query"] + s for s in sentences])
    assert _min_cosine(queries, st_query) >= 0.99999
    assert _min_cosine(queries, st_default) < 0.99


def _config(tmp_path: Path, **changes: Any) -> EncoderConfig:
    raw = {**json.loads((MODEL / "config.json").read_text(encoding="utf-8")), **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return EncoderConfig.from_json(str(path))


def test_its_config_is_read_as_transformers_reads_it(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert config.family == "gemma3" and not config.causal and config.post_norms and config.norm_offset == 1.0
    assert config.layer_windows == (4, 4, 4, 0)  # sliding_window 8, bidirectional: |i - j| <= 4
    assert (config.rope_theta_global, config.rope_theta_local) == (100.0, 10.0)
    assert config.attention_scale == 16**-0.5 and config.embedding_scale == 32**0.5
    causal = _config(tmp_path, use_bidirectional_attention=False)
    assert causal.causal and causal.layer_windows == (7, 7, 7, 0)  # the 7 tokens before, and itself
    patterned = _config(tmp_path, layer_types=None, sliding_window_pattern=2)
    assert patterned.layer_windows == (4, 0, 4, 0)
    modern = _config(
        tmp_path,
        rope_theta=None,
        rope_local_base_freq=None,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    )
    assert (modern.rope_theta_global, modern.rope_theta_local) == (1_000_000.0, 10_000.0)


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping 50.0 is not supported"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "rope_type 'linear' is not supported"),
        ({"sliding_window": 1}, "sliding_window 1 is outside 2"),
        ({"layer_types": ["sliding_attention"] * 3}, "layer_types should list 4"),
        ({"hidden_activation": "silu"}, "activation 'silu' is not supported"),
        ({"lora_rank": 8}, "lora_rank"),
    ],
)
def test_what_it_would_compute_wrong_is_refused_by_name(tmp_path: Path, changes: dict[str, Any], said: str) -> None:
    with pytest.raises((ModelError, ModelShapeError), match=said):
        _config(tmp_path, **changes)
