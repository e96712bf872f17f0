"""Build ``tests/data/static/``: tiny random static models (model2vec), made and saved by
model2vec itself, with what ``StaticModel.encode`` computes for them, for the tests to compare
bertserve's :class:`~bertserve.server.model.static.StaticEncoder` and a server on them with.

Needs model2vec 0.10 (``pip install -r requirements-bench.txt``); no network. Run from the
repository's root::

    python benchmarks/make_static_references.py

Each model takes BERT's WordPiece tokenizer of ``tests/data/families/bert_st6/`` (700 tokens,
lower-cased) and a seeded random table of 32 dimensions (standard normal), and is saved by
``StaticModel.save_pretrained`` (the model card left out):

    static_norm      normalize true; config.json says ``"model_type": "model2vec"``; max_length
                     512 (model2vec's default)
    static_raw       normalize false; max_length 16; config.json without model_type (found by the
                     ``modules.json`` that model2vec writes: one StaticEmbedding in ``.``)
    static_weighted  normalize true; max_length 24; 48 rows, a ``mapping`` of token to row and a
                     ``weights`` per token, as vocabulary quantization leaves them

``static/<name>.json`` holds the texts (the 130 sentences of ``tests/data/sentences.json``, then
an empty text, spaces, a text of unknown characters only (no token left once [UNK] is dropped),
punctuation, and a text of all 130 sentences joined, about 11,000 characters, past the character
cut) and the model's settings; ``static/<name>.npz`` holds ``vectors``, ``StaticModel.encode``
of those texts (float32, one row per text), and ``raw``, the same with ``normalize=False``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "static"
TOKENIZER = ROOT / "tests" / "data" / "families" / "bert_st6" / "tokenizer.json"
DIM = 32

MODELS = {
    "static_norm": {"normalize": True, "max_length": 512, "model_type": True, "rows": None, "seed": 1},
    "static_raw": {"normalize": False, "max_length": 16, "model_type": False, "rows": None, "seed": 2},
    "static_weighted": {"normalize": True, "max_length": 24, "model_type": True, "rows": 48, "seed": 3},
}


def texts() -> list[str]:
    sentences = json.loads((ROOT / "tests" / "data" / "sentences.json").read_text(encoding="utf-8"))
    return [*sentences, "", "   ", "\u0e02\u0e49\u0e2d \u2603\u2603", "?!.,", " ".join(sentences)]


def build(name: str, spec: dict, inputs: list[str]) -> None:
    from model2vec import StaticModel, __version__
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    vocab = tokenizer.get_vocab_size()
    rng = np.random.default_rng(spec["seed"])
    rows = spec["rows"] or vocab
    vectors = rng.standard_normal((rows, DIM)).astype(np.float32)
    extra = {}
    if spec["rows"]:
        extra = {
            "token_mapping": rng.integers(0, rows, vocab).astype(np.int64),
            "weights": rng.uniform(0.2, 2.0, vocab).astype(np.float32),
        }
    config = {"model_type": "model2vec", "architectures": ["StaticModel"]} if spec["model_type"] else None
    model = StaticModel(
        vectors=vectors,
        tokenizer=tokenizer,
        config=config,
        normalize=spec["normalize"],
        max_length=spec["max_length"],
        **extra,
    )
    directory = OUT / name
    model.save_pretrained(directory)
    (directory / "README.md").unlink(missing_ok=True)  # the model card: not read by anyone
    loaded = StaticModel.from_pretrained(directory)  # what a user of the saved directory gets
    encoded = loaded.encode(inputs, use_multiprocessing=False)
    raw = loaded.encode(inputs, use_multiprocessing=False, normalize=False)
    np.savez_compressed(OUT / f"{name}.npz", vectors=encoded.astype(np.float32), raw=raw.astype(np.float32))
    meta = {
        "model2vec": __version__,
        "normalize": spec["normalize"],
        "max_length": spec["max_length"],
        "median_token_length": loaded.median_token_length,
        "weighted": bool(spec["rows"]),
        "texts": inputs,
    }
    (OUT / f"{name}.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    empty = int((np.linalg.norm(raw, axis=1) == 0).sum())
    print(f"{name}: {len(inputs)} texts, {empty} with no token, dim {encoded.shape[1]}", file=sys.stderr)


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    inputs = texts()
    for name, spec in MODELS.items():
        build(name, spec, inputs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
