"""Small model runs on LiteRT: the same frozen graph, converted once and cached.

TensorFlow's oneDNN kernels are built for throughput: on a 2-core CPU one fp32 run of one
16-token sentence takes 15-19 ms in them, where the matrix products need 2-3 ms. LiteRT's
XNNPACK kernels run the same graph, converted by TensorFlow's own converter, in 3-7 ms,
and lose to oneDNN from about a hundred padded tokens on. So the ``Encoder`` gives a run
of at most ``lite_max_tokens`` padded tokens to LiteRT and every bigger run to TensorFlow.

Only fp32 graphs on the CPU take this path: LiteRT has no bf16 matrix products, and a GPU
is better left with whole batches. With ``dtype`` int8 every run takes it, on a model whose
matrix weights are int8 (see :mod:`.int8`). The converted model is cached beside the graph,
under the same key, and checked the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
from typing import Any

import numpy as np

from ..errors import ModelError
from ..logs import held_native_output
from . import int8
from .graph import INPUT_NAMES, GraphMeta, GraphSpec, build_graph, cache_key, read_cache, write_cache
from .model_dir import ModelFiles

logger = logging.getLogger("bertserve.lite")

LENGTH_STEP = 8  # lengths are padded to a multiple of this, so shapes (and set-ups) repeat
# Threads of the small runs' interpreter. A run of a few dozen tokens has little work in each op
# to share, and after a pause between requests the second thread sleeps, so every op waits for it
# to wake. Measured with all-MiniLM-L6-v2 on a 2-core AMD EPYC, a corpus sentence in process:
# after a 50 ms pause 8.8 ms on one thread against 10.3 on two; back to back 6.6 against 4.5.
# Queries come paced, so one thread.
SMALL_RUN_THREADS = 1


def available() -> bool:
    try:
        import ai_edge_litert.interpreter  # noqa: F401
    except ImportError:
        return False
    return True


def check_int8(device: str, *, xla: bool) -> None:
    """A clear error where int8 cannot run: on ``device``, with XLA, or without LiteRT."""
    if "CPU" not in device.upper():
        raise ModelError(f"dtype int8 runs on the CPU only, not on {device}; use fp16 on a GPU")
    if xla:
        raise ModelError("dtype int8 runs on LiteRT, which XLA does not compile: leave xla off")
    if not available():
        raise ModelError("dtype int8 runs on LiteRT, which is not installed: pip install ai-edge-litert")


def load_or_convert(model: ModelFiles, spec: GraphSpec, graph_dir: str, key: str | None = None) -> bytes | None:
    """The LiteRT flatbuffer of the graph of ``spec``, with int8 weights for int8: from the
    cache when sound, else converted (and cached) under its TensorFlow graph's key (``key``,
    where the caller has it: computing it reads every model file). None, with a warning, when
    the graph does not convert."""
    quantized = spec.dtype == "int8"
    key = key or cache_key(model, spec)
    path = os.path.join(graph_dir, f"{key}.lite")
    cached = read_cache(path, key)
    if cached is not None:
        return bytes(cached[0])
    outcome = "int8 cannot run" if quantized else "small runs stay on TensorFlow"
    try:
        graph, meta = _graph_to_convert(model, spec, key, graph_dir)
        flatbuffer = int8.convert(graph, meta, task=spec.task) if quantized else convert(graph, meta)
    except Exception as exc:  # the converter raises its own error types, and plain ones
        logger.warning("%s: the graph does not convert to LiteRT (%s)", outcome, exc)
        return None
    try:
        write_cache(path, flatbuffer, dataclasses.replace(meta, digest=hashlib.sha256(flatbuffer).hexdigest()))
    except OSError as exc:
        logger.warning("could not cache the LiteRT model in %s: %s", graph_dir, exc)
    return flatbuffer


def _graph_to_convert(model: ModelFiles, spec: GraphSpec, key: str, graph_dir: str) -> tuple[Any, GraphMeta]:
    """The graph of ``spec`` in the form LiteRT's converter takes (see :mod:`.norm`), and its
    meta: int8's cached graph, built in that form since only LiteRT runs it; any other built
    again, as a TensorFlow graph has fused layer norms."""
    import tensorflow as tf

    if spec.dtype == "int8":
        found = read_graph_def(graph_dir, key)
        if found is not None:
            return found
    graph_bytes, meta = build_graph(model, spec, key, for_lite=True)
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(graph_bytes)
    return graph_def, meta


def read_graph_def(graph_dir: str, key: str) -> tuple[Any, GraphMeta] | None:
    """The cached graph of ``key`` as a GraphDef (its serialized bytes let go of) and its
    meta, or None."""
    import tensorflow as tf

    cached = read_cache(os.path.join(graph_dir, f"{key}.graph"), key)
    if cached is None:
        return None
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(cached[0])
    return graph_def, cached[1]


def convert(graph_def: Any, meta: GraphMeta) -> bytes:
    """The frozen ``graph_def`` converted by TensorFlow's LiteRT converter, its inputs
    ``[batch, length]`` of any size. The GraphDef goes to the converter as it is, by input
    and output names: making a function or a graph of it first would add copies of every
    weight to the conversion's peak (for all-MiniLM-L6-v2 the process converting peaked at
    ~1,570-1,610 MiB, against ~1,740 MiB through an imported graph)."""
    import tensorflow as tf

    converter = tf.compat.v1.lite.TFLiteConverter(
        graph_def,
        None,
        None,
        input_arrays_with_shape=[(name, [-1, -1]) for name in INPUT_NAMES],  # -1: any batch, any length
        output_arrays=[meta.output_node],
    )
    with held_native_output():  # the converter logs its passes natively
        return bytes(converter.convert())


class LiteRunner:
    """LiteRT over the converted graph, called like the TensorFlow one: an interpreter of
    ``threads`` threads, and where ``one_thread_tokens`` is given (int8, whose every run is on
    LiteRT), a second of one thread for the runs of at most that many padded tokens, which
    gain nothing from a second thread (:data:`SMALL_RUN_THREADS`). Measured with
    all-MiniLM-L6-v2 in int8 on a 2-core AMD EPYC, one sentence after a 50 ms pause: 3.7 ms on
    one thread against 5.6 on two; bulk on two threads 746 sentences/s, and 750 on two
    interpreters of one thread side by side, so bulk keeps its one interpreter."""

    def __init__(self, flatbuffer: bytes, threads: int, *, one_thread_tokens: int = 0) -> None:
        self._many = _Interpreter(flatbuffer, threads)
        self._one = _Interpreter(flatbuffer, 1) if one_thread_tokens and threads > 1 else None
        self.one_thread_tokens = one_thread_tokens

    def __call__(self, input_ids: np.ndarray, input_mask: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
        small = self._one is not None and input_ids.size <= self.one_thread_tokens
        runner = self._one if small and self._one is not None else self._many  # (mypy: small says _one is set)
        return runner(input_ids, input_mask, segment_ids)


class _Interpreter:
    """One LiteRT interpreter. It is not thread-safe and is set up for one input shape at a
    time, so calls are serialized, and a call with a new shape resizes the inputs first."""

    def __init__(self, flatbuffer: bytes, threads: int) -> None:
        from ai_edge_litert.interpreter import Interpreter

        # The first allocation applies XNNPACK, which LiteRT announces on stderr, once a process.
        with held_native_output():
            self._interpreter = Interpreter(model_content=flatbuffer, num_threads=max(1, threads))
            self._interpreter.allocate_tensors()
        by_name = {d["name"]: d["index"] for d in self._interpreter.get_input_details()}
        self._inputs = [next(i for n, i in by_name.items() if name in n) for name in INPUT_NAMES]
        self._output = self._interpreter.get_output_details()[0]["index"]
        self._shape: tuple[int, ...] | None = None
        self._lock = threading.Lock()

    def __call__(self, input_ids: np.ndarray, input_mask: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
        interpreter = self._interpreter
        arrays = [np.ascontiguousarray(a, dtype=np.int32) for a in (input_ids, input_mask, segment_ids)]
        with self._lock:
            if arrays[0].shape != self._shape:
                for index in self._inputs:
                    interpreter.resize_tensor_input(index, arrays[0].shape)
                interpreter.allocate_tensors()
                self._shape = arrays[0].shape
            for index, array in zip(self._inputs, arrays, strict=True):
                interpreter.set_tensor(index, array)
            interpreter.invoke()
            return interpreter.get_tensor(self._output).copy()
