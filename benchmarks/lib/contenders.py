"""The in-process contenders: bertserve's ``Encoder`` and sentence-transformers, each built
(and its build timed) in the benchmark's own process. Neither TensorFlow nor PyTorch is
imported before a contender is built."""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ST_NAME = "sentence-transformers"
TORCH_THREADS = 2
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
    dtype: str = "fp32"  # the precision of its matrix products, for the roofline


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

    return Contender(f"Encoder {dtype}", encode, setup, note, batch_size=used_batch_size, dtype=dtype)


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
