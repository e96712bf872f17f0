"""What model code written for transformers 4 calls and transformers 5 no longer has, given back
with transformers 4's maths, so that a model's own published code (``auto_map``) runs unchanged
in the reference stack (``make_variant_references.py``). Importing this module installs them."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import torch
import transformers
import transformers.models.xlm_roberta.modeling_xlm_roberta as _xlm_roberta
import transformers.pytorch_utils
from transformers import PreTrainedModel


def _extended_attention_mask(self: Any, mask: torch.Tensor, input_shape: Any, device: Any = None, dtype: Any = None):
    """The mask as an additive bias [batch, 1, 1 or query, key]: 0 to attend, the dtype's
    lowest where masked (an encoder's; a decoder's causal one is never asked for here)."""
    dtype = dtype or self.dtype
    if mask.dim() not in (2, 3):
        raise ValueError(f"an attention mask of shape {tuple(mask.shape)}")
    expanded = (mask[:, None, None, :] if mask.dim() == 2 else mask[:, None]).to(dtype)
    return (1.0 - expanded) * torch.finfo(dtype).min


def _head_mask(self: Any, head_mask: Any, layers: int, is_attention_chunked: bool = False) -> list[None]:
    if head_mask is not None:
        raise ValueError("head masks are not used by the references")
    return [None] * layers


def _pruneable_heads(heads: Any, n_heads: int, head_size: int, already_pruned: set) -> tuple[set, torch.Tensor]:
    keep = torch.ones(n_heads, head_size)
    heads = set(heads) - already_pruned
    for head in heads:
        keep[head - sum(1 for pruned in already_pruned if pruned < head)] = 0
    kept = keep.view(-1).eq(1)
    return heads, torch.arange(len(kept))[kept].long()


for _name, _helper in (("get_extended_attention_mask", _extended_attention_mask), ("get_head_mask", _head_mask)):
    if not hasattr(PreTrainedModel, _name):
        setattr(PreTrainedModel, _name, _helper)
if not hasattr(transformers.pytorch_utils, "find_pruneable_heads_and_indices"):
    transformers.pytorch_utils.find_pruneable_heads_and_indices = _pruneable_heads  # type: ignore[attr-defined]
if "transformers.onnx" not in sys.modules:  # JinaBERT's config imports OnnxConfig, for an export it never does here
    _onnx = types.ModuleType("transformers.onnx")
    _onnx.OnnxConfig = type("OnnxConfig", (), {})  # type: ignore[attr-defined]
    sys.modules["transformers.onnx"] = _onnx


def _built_on_the_cpu(from_pretrained: Any) -> Any:
    """``from_pretrained`` for model code of transformers 4's time: transformers 5 builds a model on
    the meta device and loads the checkpoint into it, which leaves the buffers the checkpoint does
    not hold (position ids, rotary tables, ALiBi's biases) uninitialized, and some such code cannot
    be built there at all (JinaBERT computes its ALiBi table in its constructor). Such a model is
    built on the CPU, as transformers 4 did, and its checkpoint loaded into it, every tensor of it
    used."""

    def load(cls: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        if not cls.__module__.startswith("transformers_modules"):
            return from_pretrained.__func__(cls, path, *args, **kwargs)
        from safetensors.torch import load_file

        config = kwargs.get("config") or transformers.AutoConfig.from_pretrained(path, trust_remote_code=True)
        model = cls._from_config(config)
        state = load_file(str(Path(path) / "model.safetensors"))
        unread = sorted(set(state) - set(model.state_dict()))
        missing = sorted(set(model.state_dict()) - set(state))
        if unread or missing:
            raise ValueError(f"{path}: the checkpoint does not fit {cls.__name__}: {unread=}, {missing=}")
        model.load_state_dict(state)
        return model.eval()

    return classmethod(load)


PreTrainedModel.from_pretrained = _built_on_the_cpu(PreTrainedModel.from_pretrained)  # type: ignore[method-assign]


def _position_ids(input_ids: torch.Tensor, padding_idx: int, past_key_values_length: int = 0) -> torch.Tensor:
    """RoBERTa's absolute positions (imported, never used, by jina-embeddings-v3's rotary code)."""
    real = input_ids.ne(padding_idx).int()
    return ((torch.cumsum(real, dim=1).type_as(real) + past_key_values_length) * real).long() + padding_idx


if not hasattr(_xlm_roberta, "create_position_ids_from_input_ids"):
    _xlm_roberta.create_position_ids_from_input_ids = _position_ids  # type: ignore[attr-defined]
