"""Qwen3 as an embedder (Qwen3-Embedding), beyond what every family is held to (test_families):
its query instruction, the left padding its tokenizer asks for, and the configs it refuses.

``tests/data/families/qwen3`` is a tiny random Qwen3 (grouped-query attention, 4 query heads
over 2 key and value heads each 12 wide against a hidden size of 32, RMSNorm on each query and
key head, rotary positions, causal attention, SwiGLU), saved by sentence-transformers with
last-token pooling and Normalize, its tokenizer appending ``<|endoftext|>`` and padding on
the left, as Qwen3-Embedding's does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bertserve.server import Encoder, ModelConfig
from bertserve.server.errors import ModelError, ModelShapeError
from bertserve.server.model.families import EncoderConfig
from bertserve.server.model.options import resolve_options

DATA = Path(__file__).resolve().parents[3] / "data" / "families"
MODEL = DATA / "qwen3"

pytestmark = pytest.mark.skipif(not MODEL.is_dir(), reason="no Qwen3 reference model")


def _reference() -> dict[str, Any]:
    with np.load(DATA / "qwen3.npz") as data:
        return {key: data[key] for key in data.files}


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def test_the_query_instruction_is_read_and_gives_sentence_transformers_query_vectors(tmp_path: Path) -> None:
    ref = _reference()
    info, _ = resolve_options(ModelConfig.of(model_dir=str(MODEL)))
    prompts = json.loads((MODEL / "config_sentence_transformers.json").read_text(encoding="utf-8"))["prompts"]
    assert info["pooling_strategy"] == "SEP_TOKEN" and info["normalize"] is True  # LAST_TOKEN, as bertserve spells it
    encoder = Encoder(str(MODEL), dtype="fp32", graph_dir=str(tmp_path))
    queries = encoder.encode([prompts["query"] + str(s) for s in ref["sentences"]])
    assert _min_cosine(queries, ref["st_query"]) >= 0.99999
    assert _min_cosine(queries, ref["st_default"]) < 0.99  # the instruction changes the vectors


def test_right_padding_gives_what_left_padding_gives() -> None:
    """sentence-transformers runs the model left-padded (its tokenizer says so); bertserve pads
    on the right, which leaves every vector as it is (the reference records both)."""
    meta = json.loads(str(_reference()["meta"]))
    assert meta.get("padded_right_min_cosine", 0.0) >= 0.99999, meta


def _config(tmp_path: Path, **changes: Any) -> EncoderConfig:
    raw = {**json.loads((MODEL / "config.json").read_text(encoding="utf-8")), **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return EncoderConfig.from_json(str(path))


def test_its_config_is_read_whole(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert (config.family, config.num_key_value_heads, config.head_dim) == ("qwen3", 2, 12)
    assert config.rope_theta_global == 100.0 and config.causal and config.layer_windows == (0, 0, 0)
    assert config.max_tokens == 128 and not config.has_pooler and config.layer_norm_eps == 1e-6
    # transformers 5 writes the rotary base in rope_parameters, and the attention of each layer
    modern = _config(
        tmp_path,
        rope_theta=None,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        layer_types=["full_attention"] * 3,
    )
    assert modern.rope_theta_global == 1_000_000.0


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"use_sliding_window": True}, "use_sliding_window is true"),
        ({"layer_types": ["full_attention", "sliding_attention", "full_attention"]}, "full attention only"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn' is not supported"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
        ({"head_dim": 11}, "head_dim 11 is odd"),
        ({"hidden_act": "gelu"}, "activation 'gelu' is not supported"),
        ({"lora_rank": 8}, "lora_rank"),
        ({"auto_map": {"AutoModel": "org/code--modeling.Qwen3Bidirectional"}}, "auto_map names model code"),
    ],
)
def test_what_it_would_compute_wrong_is_refused_by_name(tmp_path: Path, changes: dict[str, Any], said: str) -> None:
    with pytest.raises((ModelError, ModelShapeError), match=said):
        _config(tmp_path, **changes)


def test_a_causal_lm_checkpoint_of_it_is_read_as_the_same_encoder(tmp_path: Path) -> None:
    """Qwen3ForCausalLM's files name the layers under ``model.`` and add ``lm_head``, which an
    embedder leaves unread."""
    from safetensors.numpy import load_file, save_file

    model = tmp_path / "causal"
    shutil.copytree(MODEL, model)
    weights = load_file(str(model / "model.safetensors"))
    renamed = {f"model.{name}": value for name, value in weights.items()}
    renamed["lm_head.weight"] = weights["embed_tokens.weight"]
    save_file(renamed, str(model / "model.safetensors"))
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    (model / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen3ForCausalLM"]}), encoding="utf-8")
    ref = _reference()
    vectors = Encoder(str(model), dtype="fp32", graph_dir=str(tmp_path / "graphs")).encode(
        [str(s) for s in ref["sentences"][:16]]
    )
    assert _min_cosine(vectors, ref["st_default"][:16]) >= 0.99999


def test_cls_pooled_is_refused_since_it_has_no_pooler(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="Qwen3 has none; use LAST_TOKEN"):
        Encoder(str(MODEL), pooling_strategy="CLS_POOLED", dtype="fp32", graph_dir=str(tmp_path)).encode(["x"])


def test_weights_past_what_a_graph_holds_go_beside_it_in_fp32_and_are_refused_in_bf16() -> None:
    """Qwen3-Embedding-0.6B's 2.4 GB of fp32 weights are past the 2 GiB a frozen graph is: in
    fp32 its large weights are kept beside the graph (.outside); in bf16, whose weights stay
    constants, a clear refusal rather than protobuf's "Wire format was corrupt"."""
    from bertserve.server.config.model import PoolingStrategy
    from bertserve.server.model.graph import GRAPH_BYTES, GraphSpec, _check_graph_bytes
    from bertserve.server.model.outside import names_outside

    spec = GraphSpec(PoolingStrategy.SEP_TOKEN, (2,), False, True, "bf16", "float32")
    big = {"embeddings": np.broadcast_to(np.zeros(1, np.float32), (600_000_000,))}  # 2.4 GB, none of it allocated
    with pytest.raises(ModelError, match=r"take 2\.24 GiB, past the 1\.94 GiB .*serve it in fp32 \(--dtype fp32\)"):
        _check_graph_bytes(big, spec)
    small = {"norm": np.zeros(8, np.float32)}
    assert names_outside({**big, **small}, "fp32", for_lite=False) == {"embeddings"}
    assert names_outside({**big, **small}, "fp32", for_lite=True) == set()  # LiteRT's model: refused as bf16's
    assert names_outside({**big, **small}, "bf16", for_lite=False) == set()
    assert names_outside(small, "fp32", for_lite=False) == set()  # a graph that holds its weights keeps them
    _check_graph_bytes({"embeddings": np.broadcast_to(np.zeros(1, np.uint8), (GRAPH_BYTES,))}, spec)
