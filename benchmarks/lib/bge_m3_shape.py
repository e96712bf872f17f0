"""A random-weight model of BGE-M3's exact shape, in FlagEmbedding's layout, for timing.

No real BGE-M3 weights can be fetched here, and its speed does not depend on them: this is
XLM-RoBERTa-large as BAAI/bge-m3 has it (hidden 1024, 24 layers, 16 heads, intermediate 4096,
8194 positions), randomly initialized by transformers' ``XLMRobertaModel`` and saved with
``save_pretrained`` (safetensors), beside the two heads as FlagEmbedding saves them
(``torch.save`` of an ``nn.Linear`` state dict: ``sparse_linear.pt`` hidden -> 1,
``colbert_linear.pt`` hidden -> hidden) and sentence-transformers' modules (CLS pooling,
Normalize), as BAAI/bge-m3 has them.

One difference: the vocabulary is the 701-token tokenizer of tests/data/families/xlm_roberta,
not BGE-M3's 250,002 tokens. The vocabulary's size changes only the embedding table's rows,
one lookup a token whatever its size; a small vocabulary does cut text into more tokens, so
the benchmark picks its inputs by their token counts under this tokenizer.

Made once (PyTorch and transformers needed then) into a cache folder; not committed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = ROOT / "tests" / "data" / "families" / "xlm_roberta"
SHAPE = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "max_position_embeddings": 8194,
}
MAX_LENGTH = 8192  # BGE-M3's
VERSION = "v1"  # bump when what is made changes, so that an old cache is not reused


def cache_dir() -> Path:
    """Where the model is kept: ``$XDG_CACHE_HOME`` (else ``~/.cache``)/bertserve/bench/."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "bertserve" / "bench" / f"bge-m3-shape-{VERSION}"


def describe() -> str:
    layers, hidden = SHAPE["num_hidden_layers"], SHAPE["hidden_size"]
    return (
        f"random weights of BGE-M3's shape (XLM-RoBERTa-large: {layers} layers, hidden {hidden}, "
        f"{SHAPE['num_attention_heads']} heads, intermediate {SHAPE['intermediate_size']}, "
        f"{SHAPE['max_position_embeddings']} positions; colbert_linear {hidden}x{hidden}, sparse_linear {hidden}x1), "
        f"vocabulary the 701-token tokenizer of tests/data/families/xlm_roberta"
    )


def bge_m3_shaped(directory: Path | None = None) -> Path:
    """The model's directory, made first if it is not there yet (written aside, then renamed,
    so that a run stopped halfway leaves no half model)."""
    target = directory or cache_dir()
    if (target / "colbert_linear.pt").is_file():
        return target
    import torch
    from tokenizers import Tokenizer
    from transformers import XLMRobertaConfig, XLMRobertaModel

    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    vocab = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json")).get_vocab_size()
    config = XLMRobertaConfig(
        vocab_size=vocab,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **SHAPE,
    )
    torch.manual_seed(0)
    XLMRobertaModel(config).eval().save_pretrained(partial, safe_serialization=True)
    hidden = SHAPE["hidden_size"]
    torch.save(torch.nn.Linear(hidden, 1).state_dict(), partial / "sparse_linear.pt")
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), partial / "colbert_linear.pt")
    shutil.copy(TOKENIZER_DIR / "tokenizer.json", partial / "tokenizer.json")
    tokenizer_config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    _write(partial / "tokenizer_config.json", tokenizer_config | {"model_max_length": MAX_LENGTH})
    _write_modules(partial, hidden)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def _write_modules(directory: Path, hidden: int) -> None:
    """sentence-transformers' files as BAAI/bge-m3 has them: Transformer, CLS Pooling, Normalize."""
    kinds = ("Transformer", "Pooling", "Normalize")
    paths = ("", "1_Pooling", "2_Normalize")
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(zip(paths, kinds, strict=True))
    ]
    _write(directory / "modules.json", modules)
    _write(directory / "sentence_bert_config.json", {"max_seq_length": MAX_LENGTH, "do_lower_case": False})
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
    pooling = {"word_embedding_dimension": hidden} | {f"pooling_mode_{mode}": mode == "cls_token" for mode in modes}
    _write(directory / "1_Pooling" / "config.json", pooling | {"include_prompt": True})
    _write(directory / "2_Normalize" / "config.json", {})


def _write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
