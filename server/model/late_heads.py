"""The heads of a late-interaction model (:mod:`.late`), read from its directory: BGE-M3's
``colbert_linear.pt`` and ``sparse_linear.pt`` (tensors only, read without running code:
:mod:`.torch_files`), or a ColBERT model's Dense projection and the settings of
``config_sentence_transformers.json`` in PyLate's format."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ModelError, ModelFileError
from .json_file import read_json
from .model_dir import ModelFiles
from .tokenizer_files import unk_id
from .torch_files import read_torch_tensors
from .weights import read_dense


@dataclass(frozen=True)
class Heads:
    """The numbers of a late-interaction model's heads, and how it reads its inputs."""

    kind: str  # "bge-m3" or "colbert"
    kernel: np.ndarray  # the token vectors' projection, hidden -> dim
    bias: np.ndarray | None
    sparse: tuple[np.ndarray, float] | None = None  # BGE-M3's sparse_linear: weight (hidden,), bias
    dropped: frozenset[int] = frozenset()  # ids whose weights a sparse vector leaves out
    query_prefix: int | None = None  # ColBERT's prefix token ids, put after [CLS]
    document_prefix: int | None = None
    query_length: int = 0  # ColBERT: a query's positions, its prefix and expansion included
    document_length: int = 0
    expansion: int | None = None  # the [MASK] id a query is padded with (None: no expansion)
    attend_expansion: bool = False
    skipped: frozenset[int] = frozenset()  # a document's ids that get no vector (ColBERT's skiplist)

    @property
    def dim(self) -> int:
        return int(self.kernel.shape[1])


def read_heads(files: ModelFiles, model_dir: str, kind: str) -> Heads:
    """The heads of the model in ``model_dir`` (``files``), of ``kind`` (``bge-m3`` or ``colbert``)."""
    from tokenizers import Tokenizer

    hidden = files.config.hidden_size
    if files.tokenizer_json is None:
        raise ModelFileError(f"{model_dir}: {named(kind)} needs its tokenizer.json")
    tokenizer = Tokenizer.from_file(files.tokenizer_json)
    if kind == "colbert":
        return _colbert_heads(files, model_dir, tokenizer)
    kernel, bias = _linear(os.path.join(model_dir, "colbert_linear.pt"), hidden, None)
    path = os.path.join(model_dir, "sparse_linear.pt")
    sparse = None
    if os.path.isfile(path):
        weight, sparse_bias = _linear(path, hidden, 1)
        sparse = (weight[:, 0].copy(), float(sparse_bias[0]) if sparse_bias is not None else 0.0)
    # FlagEmbedding leaves the tokenizer's cls, eos, pad and unk tokens out of a sparse vector
    specials = ("<s>", "</s>", "<pad>", "<unk>", "[CLS]", "[SEP]", "[PAD]", "[UNK]")
    dropped = frozenset(i for token in specials if (i := tokenizer.token_to_id(token)) is not None)
    return Heads("bge-m3", kernel, bias, sparse, dropped)


def _colbert_heads(files: ModelFiles, model_dir: str, tokenizer: Any) -> Heads:
    hidden = files.config.hidden_size
    path = os.path.join(model_dir, "config_sentence_transformers.json")
    raw = read_json(path)

    def token(name: str) -> int:
        text = raw.get(name)
        found = tokenizer.token_to_id(text) if isinstance(text, str) else None
        if found is None and isinstance(text, str):
            found = tokenizer.token_to_id(text.strip())
        if found is None:
            raise ModelFileError(f"{path}: {name} {text!r} is not a token of the model's tokenizer")
        return int(found)

    lengths = [raw.get(name) for name in ("query_length", "document_length")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 2 for n in lengths):
        raise ModelFileError(f"{path}: query_length and document_length should be integers above 2, not {lengths}")
    query_length, document_length = (int(n) for n in lengths if isinstance(n, int))
    if len(files.defaults.dense) != 1:
        raise ModelError(f"{model_dir}: a ColBERT model has one Dense module, not {len(files.defaults.dense)}")
    (layer,) = files.defaults.dense
    if layer.activation != "identity" or layer.in_features != hidden:
        raise ModelError(f"{layer.path}: ColBERT's projection should take {hidden} values and have no activation")
    dense = read_dense(files)
    expand = raw.get("do_query_expansion", True)
    skiplist = raw.get("skiplist_words") or []
    if not isinstance(skiplist, list) or not all(isinstance(word, str) for word in skiplist):
        raise ModelFileError(f"{path}: skiplist_words should be a list of words")
    # as PyLate's convert_tokens_to_ids: a word not in the vocabulary is the unknown token, which goes too
    unknown = unk_id(tokenizer)
    skipped = frozenset(i for word in skiplist if (i := tokenizer.token_to_id(word) or unknown) is not None)
    mask = next((i for t in ("[MASK]", "<mask>") if (i := tokenizer.token_to_id(t)) is not None), None)
    if expand and mask is None:
        raise ModelFileError(f"{path}: query expansion needs a [MASK] token, and the tokenizer has none")
    return Heads(
        "colbert",
        dense["head/dense_0/kernel"],
        dense.get("head/dense_0/bias"),
        query_prefix=token("query_prefix"),
        document_prefix=token("document_prefix"),
        query_length=query_length,
        document_length=document_length,
        expansion=mask if expand else None,
        attend_expansion=bool(raw.get("attend_to_expansion_tokens", False)),
        skipped=skipped,
    )


def _linear(path: str, inputs: int, outputs: int | None) -> tuple[np.ndarray, np.ndarray | None]:
    """A ``torch.nn.Linear`` state dict as ``(kernel (in, out), bias)``, its shape checked."""
    tensors = read_torch_tensors(path)
    weight, bias = tensors.get("weight"), tensors.get("bias")
    if weight is None or weight.ndim != 2 or weight.shape[1] != inputs or (outputs and weight.shape[0] != outputs):
        shape = None if weight is None else weight.shape
        raise ModelFileError(f"{path}: 'weight' should be ({outputs or 'N'}, {inputs}), not {shape}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ModelFileError(f"{path}: 'bias' should be ({weight.shape[0]},), not {bias.shape}")
    return np.ascontiguousarray(weight.T, np.float32), None if bias is None else bias.astype(np.float32)


def named(kind: str) -> str:
    return "BGE-M3" if kind == "bge-m3" else "a ColBERT model"
