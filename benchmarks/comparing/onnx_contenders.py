"""ONNX Runtime as in-process contenders: the sentence-transformers model's transformer
exported to ONNX once (``torch.onnx.export``, batch and length dynamic), run by an
``onnxruntime.InferenceSession`` on the CPU with ``ORT_THREADS`` threads, in fp32 and with
its weights quantized to int8 (``quantize_dynamic``: int8 weights per output channel,
activations quantized per tensor at run time). Mean pooling over the real tokens and L2
normalisation are done in numpy, as embedding servers built on ONNX Runtime do.

The exported models are cached in ``benchmarks/results/onnx/`` (git-ignored), keyed by the
model directory and its weights' size and time, so only the first run exports. Needs
``onnxruntime`` and ``onnx`` (``pip install -r requirements-bench.txt``) and, for the export,
torch with transformers (which sentence-transformers brings); the TorchScript exporter
(``dynamo=False``) takes dynamic axes as they are and needs no ``onnxscript``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from lib.contenders import Contender
from lib.inputs import BENCHMARKS_DIR, model_tokenizer

ONNX_FP32, ONNX_INT8 = "ONNX Runtime fp32", "ONNX Runtime int8"
ORT_THREADS = 2
ONNX_CACHE = BENCHMARKS_DIR / "results" / "onnx"
OPSET = 17
NO_ORT_HINT = "onnxruntime is not installed: pip install -r requirements-bench.txt"
INT8_HOW = "quantize_dynamic, QInt8 weights per channel, activations dynamic per tensor"


def onnx_missing() -> str | None:
    """Why the ONNX contenders cannot run here, or None when they can."""
    for module in ("onnxruntime", "onnx", "torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            return NO_ORT_HINT if module in ("onnxruntime", "onnx") else f"{module} is not installed: {NO_ORT_HINT}"
    return None


def _cache_dir(model_dir: Path) -> Path:
    stamp = [str(model_dir.resolve())]
    for path in sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin")):
        info = path.stat()
        stamp.append(f"{path.name}:{info.st_size}:{int(info.st_mtime)}")
    digest = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:12]
    return ONNX_CACHE / f"{model_dir.resolve().parent.name}-{digest}"


def _export(model_dir: Path, path: Path) -> None:
    """The transformer alone (token vectors out), batch and length dynamic."""
    import torch
    from transformers import AutoModel

    class TokenVectors(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    model = TokenVectors(AutoModel.from_pretrained(str(model_dir))).eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    sample = tuple(torch.ones((2, 8), dtype=torch.int64) for _ in names)
    axes = {name: {0: "batch", 1: "length"} for name in [*names, "last_hidden_state"]}
    partial = path.with_suffix(".partial")
    with torch.inference_mode():
        torch.onnx.export(
            model,
            sample,
            str(partial),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    partial.rename(path)


def _quantize(fp32: Path, int8: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    partial = int8.with_suffix(".partial")
    quantize_dynamic(str(fp32), str(partial), weight_type=QuantType.QInt8, per_channel=True)
    partial.rename(int8)


def onnx_models(model_dir: Path) -> tuple[Path, Path, float]:
    """The fp32 and int8 ONNX files of ``model_dir`` (exported now if not cached), and the
    seconds spent exporting (0 when cached)."""
    directory = _cache_dir(model_dir)
    fp32, int8 = directory / "model.onnx", directory / "model-int8.onnx"
    started = time.perf_counter()
    if not (fp32.is_file() and int8.is_file()):
        directory.mkdir(parents=True, exist_ok=True)
        if not fp32.is_file():
            _export(model_dir, fp32)
        if not int8.is_file():
            _quantize(fp32, int8)
        return fp32, int8, time.perf_counter() - started
    return fp32, int8, 0.0


def onnx_contender(
    model_dir: Path, *, max_seq_len: int, batch_size: int, int8: bool = False, export_seconds: float = 0.0
) -> Contender:
    """An ONNX Runtime session on the exported model (``int8``: the quantized one), sorting the
    sentences by length and running them in batches of ``batch_size``, each padded to its
    longest; its build (session creation, plus ``export_seconds``) timed as setup."""
    import onnxruntime as ort

    fp32_path, int8_path, exported = onnx_models(model_dir)
    started = time.perf_counter()
    options = ort.SessionOptions()
    options.intra_op_num_threads = ORT_THREADS
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(int8_path if int8 else fp32_path), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    tokenizer = model_tokenizer(model_dir, max_seq_len)
    setup = time.perf_counter() - started + exported + export_seconds

    def run(ids: list[list[int]]) -> np.ndarray:
        width = max(len(row) for row in ids)
        input_ids = np.zeros((len(ids), width), dtype=np.int64)
        mask = np.zeros_like(input_ids)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        feeds = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
        (hidden,) = session.run(["last_hidden_state"], {k: v for k, v in feeds.items() if k in wanted})
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def encode(texts: list[str]) -> np.ndarray:
        ids = [e.ids for e in tokenizer.encode_batch(texts)]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: np.ndarray | None = None
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            vectors = run([ids[i] for i in chunk])
            if out is None:
                out = np.empty((len(ids), vectors.shape[1]), dtype=np.float32)
            out[chunk] = vectors
        return out if out is not None else np.empty((0, 0), dtype=np.float32)

    name = ONNX_INT8 if int8 else ONNX_FP32
    how = INT8_HOW if int8 else "fp32"
    note = f"onnxruntime {ort.__version__}, {ORT_THREADS} threads, batch size {batch_size}, {how}"
    return Contender(name, encode, setup, note, batch_size=batch_size, dtype="int8" if int8 else "fp32")


def onnx_contenders(model_dir: Path, *, max_seq_len: int, batch_size: int) -> tuple[list[Contender], str | None]:
    """ONNX Runtime fp32 and int8, or none and why."""
    missing = onnx_missing()
    if missing is not None:
        return [], missing
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        return [
            onnx_contender(model_dir, max_seq_len=max_seq_len, batch_size=batch_size, int8=int8)
            for int8 in (False, True)
        ], None
    except Exception as exc:  # a model transformers cannot load, an export that fails
        return [], f"ONNX Runtime left out: the export failed: {type(exc).__name__}: {str(exc)[:300]}"
