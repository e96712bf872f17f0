"""How exactly bertserve computes each encoder family: min and mean cosine to what
sentence-transformers computes, in every dtype, and whether the token ids are the model's own.

The models: the tiny random model of each family in ``tests/data/families/`` (made by
``benchmarks/make_family_references.py``), and the real weights the package index ships
(``tests/real_models.py``: all-MiniLM-L6-v2, all-mpnet-base-v2, ...), each against its
reference in ``tests/data/``. Needs no PyTorch::

    python benchmarks/families.py --markdown benchmarks/report/families.md --json benchmarks/report/families.json
    python benchmarks/families.py --no-real          # the tiny models only: seconds
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from lib.report import environment, write_report

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ROOT / "tests" / "data" / "families"
REAL = ROOT / "tests" / "data" / "real"
DTYPES = ("fp32", "bf16", "int8")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return (a * b).sum(-1)


def measure(
    name: str, family: str, directory: str, sentences: list[str], expected: np.ndarray, ids_equal: bool, **options
) -> dict:
    from bertserve.server import Encoder

    row: dict = {"model": name, "family": family, "ids_identical": ids_equal}
    with tempfile.TemporaryDirectory() as graphs:
        for dtype in DTYPES:
            started = time.perf_counter()
            vectors = Encoder(directory, dtype=dtype, graph_dir=graphs, **options).encode(sentences)
            found = cosines(vectors, expected)
            row[dtype] = {
                "min": float(found.min()),
                "mean": float(found.mean()),
                "seconds": time.perf_counter() - started,
            }
    print(json.dumps(row), file=sys.stderr)
    return row


def tiny_rows() -> list[dict]:
    from bertserve.server import ModelConfig
    from bertserve.server.model.options import resolve_options

    rows = []
    for path in sorted(FAMILIES.glob("*.npz")):
        with np.load(path) as data:
            ref = {key: data[key] for key in data.files}
        directory = str(FAMILIES / path.stem)
        sentences = [str(s) for s in ref["sentences"]]
        info, tokenizer = resolve_options(ModelConfig.of(model_dir=directory))
        batch = tokenizer.tokenize(sentences)
        same = bool(
            np.array_equal(batch.lengths, ref["lengths"])
            and np.array_equal(batch.input_ids, ref["ids"][:, : batch.input_ids.shape[1]])
        )
        rows.append(measure(f"tiny {path.stem}", info["family"], directory, sentences, ref["st_default"], same))
    return rows


def real_rows() -> list[dict]:
    sys.path.insert(0, str(ROOT / "tests"))
    from bertserve.server import ModelConfig
    from bertserve.server.model.options import resolve_options
    from real_models import REAL_MODELS

    sentences = json.loads((ROOT / "tests" / "data" / "sentences.json").read_text(encoding="utf-8"))
    rows = []
    for model in REAL_MODELS:
        directory = model.find()
        reference = REAL / f"{model.name}.npz"
        if directory is None or not reference.is_file():
            print(f"skipped {model.name}: {model.missing}", file=sys.stderr)
            continue
        with np.load(reference) as data:
            ref = {key: data[key] for key in data.files}
        _, tokenizer = resolve_options(ModelConfig.of(model_dir=directory, max_seq_len=128))
        batch = tokenizer.tokenize(sentences)
        same = bool(np.array_equal(batch.lengths, ref["hf_lengths_right128"])) and all(
            np.array_equal(batch.input_ids[i, :n], ref["hf_ids_right128"][i, :n]) for i, n in enumerate(batch.lengths)
        )
        rows.append(measure(model.name, model.family, directory, sentences, ref["st_plain"], same, max_seq_len=128))
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "# Each encoder family against sentence-transformers",
        "",
        "Min / mean cosine of bertserve's `Encoder` to `SentenceTransformer.encode` over the 130 sentences of "
        "`tests/data/sentences.json` (the real models at `max_seq_length` 128), and whether every token id is "
        "the model's tokenizer's. Targets: fp32 min >= 0.99999, bf16 min >= 0.999.",
        "",
        "Command: `python benchmarks/families.py --markdown benchmarks/report/families.md "
        "--json benchmarks/report/families.json`.",
        "",
        "| model | family | fp32 min / mean | bf16 min / mean | int8 min / mean | token ids |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        cells = [f"{row[d]['min']:.6f} / {row[d]['mean']:.6f}" for d in DTYPES]
        same = "identical" if row["ids_identical"] else "**differ**"
        lines.append(f"| {row['model']} | {row['family']} | " + " | ".join(cells) + f" | {same} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-real", action="store_true", help="the tiny models only")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = tiny_rows() + ([] if args.no_real else real_rows())
    write_report({"environment": environment(), "rows": rows}, markdown(rows), args.json, args.markdown)


if __name__ == "__main__":
    main()
