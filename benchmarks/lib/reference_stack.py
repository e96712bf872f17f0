"""What the two scripts that build references with the reference stack (transformers and
sentence-transformers, on torch) share: ``make_family_references.py``, which writes
``tests/data/families/``, and ``make_task_references.py``, which writes ``tests/data/tasks/``
with the families' tokenizers and sizes.

- the inputs: ``SENTENCES`` (``tests/data/sentences.json``) and the pairs made of them
  (``PAIR_ROWS``); ``FAMILIES_DIR``, where the families are written;
- the families: ``Family`` and ``FAMILIES``, each tiny random model's transformers config
  (``SMALL`` the sizes most share) and how sentence-transformers wraps it;
- helpers: ``rewrite_json`` (a saved file rewritten as another version saved it), ``patched``
  and ``overwritten`` (one detail of a model made wrong for a while), ``tokenizer_meta`` (a
  saved tokenizer described for a reference's meta).

It imports torch: only these two scripts import it, never ``lib`` itself nor another benchmark.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = ROOT / "tests" / "data" / "sentences.json"
FAMILIES_DIR = ROOT / "tests" / "data" / "families"

PAIR_ROWS = ((73, 129), (22, 28), (120, 37), (21, 0), (0, 1), (100, 7))  # short pairs, then truncated ones
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
ROBERTA_IDS = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, max_position_embeddings=130)


@dataclass(frozen=True)
class Family:
    name: str
    config: dict[str, Any]
    pooling: str = "mean"
    dense: int | None = None
    normalize: bool = True
    st6: bool = False
    scale: tuple[tuple[str, float], ...] = ()  # (weight, factor): to make a detail matter more


FAMILIES = (
    Family(
        "distilbert",
        dict(model_type="distilbert", dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=128),
        dense=24,
    ),
    Family("roberta", dict(model_type="roberta", **SMALL, **ROBERTA_IDS, type_vocab_size=1)),
    Family(
        "xlm_roberta", dict(model_type="xlm-roberta", **{**SMALL, "hidden_size": 48}, **ROBERTA_IDS, type_vocab_size=1)
    ),
    Family(
        "mpnet",
        dict(model_type="mpnet", **SMALL, **ROBERTA_IDS, relative_attention_num_buckets=32),
        scale=(("encoder.relative_attention_bias.weight", 5.0),),
    ),
    Family(
        "modernbert",
        dict(
            model_type="modernbert",
            **{**SMALL, "num_hidden_layers": 4, "intermediate_size": 48},
            max_position_embeddings=128,
            global_attn_every_n_layers=3,
            local_attention=8,
            global_rope_theta=160000.0,
            local_rope_theta=100.0,
        ),
        pooling="cls",
    ),
    Family(
        "bert_st6",
        dict(model_type="bert", **SMALL, max_position_embeddings=128, type_vocab_size=2),
        pooling="weightedmean",
        normalize=False,
        st6=True,
    ),
)


def rewrite_json(path: Path, change: Callable[[dict], dict]) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text())), indent=2, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def patched(obj: Any, attr: str, value: Any) -> Iterator[None]:
    old = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, old)


@contextlib.contextmanager
def overwritten(tensor: torch.Tensor, value: torch.Tensor | float) -> Iterator[None]:
    old = tensor.detach().clone()
    with torch.no_grad():
        tensor.copy_(value if isinstance(value, torch.Tensor) else torch.full_like(tensor, value))
    try:
        yield
    finally:
        with torch.no_grad():
            tensor.copy_(old)


def tokenizer_meta(out: Path, tokenizer: Any) -> dict[str, Any]:
    """The tokenizer saved in ``out`` (its tokenizer.json) and loaded as ``tokenizer``: its
    model, normalizer, pre-tokenizer and post-processor, specials and input names."""
    saved = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    names = ("cls_token", "sep_token", "pad_token", "unk_token", "mask_token", "bos_token", "eos_token")
    specials = {n: [str(getattr(tokenizer, n)), getattr(tokenizer, f"{n}_id")] for n in names if getattr(tokenizer, n)}
    parts = {part: (saved[part] or {}).get("type") for part in ("normalizer", "pre_tokenizer")}
    return {
        "class": type(tokenizer).__name__,
        "model": saved["model"]["type"],
        **parts,
        "post_processor": saved["post_processor"],
        "special_tokens": specials,
        "model_input_names": list(tokenizer.model_input_names),
        "vocab_size": len(tokenizer),
        "model_max_length": tokenizer.model_max_length,
    }
