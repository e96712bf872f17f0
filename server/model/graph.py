"""The encoder's forward pass in plain TensorFlow ops, frozen, pruned, quantized and cached.

``build_graph`` builds the encoder as a graph with its weights as constants and prunes
every node the requested output does not need (the layers above the deepest pooled
layer, the pooler unless ``CLS_POOLED`` is asked for). With ``dtype`` fp16 or bf16 the
weight matrices are stored in that type and the matrix products run in it, while
embeddings sums, softmax, layer norm, residuals and pooling are accumulated in fp32. The
serialized graph is cached on disk under a key made from the model files' content and every
option that changes the graph.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import struct
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..config.model import PoolingStrategy
from ..errors import ModelError
from ..memory import weights_frozen
from . import bert, decoder, modernbert, norm, outside, task_heads
from .model_dir import ModelFiles
from .outside import GRAPH_BYTES, appended, names_outside
from .weights import read_weights

logger = logging.getLogger("bertserve.graph")

INPUT_NAMES = ("input_ids", "input_mask", "segment_ids")
OUTPUT_NAME = "output"
_MAGIC = b"BERTSERVE-GRAPH\x00"
_FORMAT = 10  # bump when the graph (or its LiteRT form) built for the same options changes


@dataclass(frozen=True)
class GraphSpec:
    """The resolved options that decide what the graph computes."""

    pooling_strategy: PoolingStrategy
    pooling_layer: tuple[int, ...]  # absolute encoder layer indexes, 0-based
    mask_cls_sep: bool
    normalize: bool
    dtype: str  # fp32, fp16, bf16, int8 (an fp32 graph whose LiteRT form has int8 weights)
    output_dtype: str  # float32, float16
    task: str = "embed"  # the head on the last layer in place of pooling (.tasks): rerank, classify, sparse
    # NONE pooling: zeros at the positions past a row's length; False computes them as any other
    # (a ColBERT query's [MASK] expansion, attended to by none and kept: .late)
    zero_padding: bool = True


def serving_graph(spec: GraphSpec) -> GraphSpec:
    """The graph the encoder runs for ``spec``: without its closing L2 normalization, which
    the encoder (:meth:`~.encoder.Encoder.encode`) and the server's sink (per request) apply
    to its vectors, so that a request may have the vectors before the model's Normalize
    module (TEI's ``normalize: false``). An exported graph keeps it (:mod:`.export`), and so
    does a graph of token vectors (pooling NONE), each normalized in it."""
    if spec.pooling_strategy is PoolingStrategy.NONE:
        return spec
    return dataclasses.replace(spec, normalize=False)


@dataclass(frozen=True)
class GraphMeta:
    """What travels with a cached graph: enough to use it without the model's weights."""

    key: str
    output_dim: int
    token_level: bool  # NONE pooling: one vector per token
    layers_run: int  # encoder layers left in the graph after pruning
    output_node: str
    digest: str  # sha256 of the serialized GraphDef (and of the weights after it)
    family: str = "bert"  # the encoder's family (.families), which sets the products int8 keeps in fp32
    # a graph past GRAPH_BYTES (.outside): its GraphDef's length, then each weight after it
    graph_length: int = 0
    outside: list = dataclasses.field(default_factory=list)


def cache_key(model: ModelFiles, spec: GraphSpec) -> str:
    """The cache's name for the graph of ``model`` with ``spec``; needs no TensorFlow."""
    digest = hashlib.sha256()
    digest.update(
        json.dumps(
            {
                "format": _FORMAT,
                "tensorflow": tensorflow_version(),
                "config": asdict(model.config),
                "spec": asdict(spec),
            },
            sort_keys=True,
        ).encode()
    )
    for path in model.files:
        digest.update(os.path.basename(path).encode() + b"\x00")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:32]


def load_or_build(model: ModelFiles, spec: GraphSpec, graph_dir: str) -> tuple[bytes | memoryview, GraphMeta, bool]:
    """The serialized graph for ``spec``: from the cache when it holds a sound copy, else
    built (and cached). Returns ``(graph_def_bytes, meta, built)``."""
    key = cache_key(model, spec)
    path = os.path.join(graph_dir, f"{key}.graph")
    cached = read_cache(path, key)
    if cached is not None:
        logger.info("loaded the optimized graph from %s", path)
        return cached[0], cached[1], False
    graph_bytes, meta = build_graph(model, spec, key, for_lite=spec.dtype == "int8")  # int8 runs on LiteRT only
    try:
        write_cache(path, graph_bytes, meta)
        logger.info("cached the optimized graph at %s", path)
    except OSError as exc:
        logger.warning("could not cache the graph in %s: %s", graph_dir, exc)
    return graph_bytes, meta, True


def read_cache(path: str, key: str) -> tuple[bytes | memoryview, GraphMeta] | None:
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("cannot read the cached graph %s (%s); rebuilding it", path, exc)
        return None
    try:
        if not blob.startswith(_MAGIC):
            raise ValueError("bad magic")
        (header_len,) = struct.unpack_from("<I", blob, len(_MAGIC))
        start = len(_MAGIC) + 4
        meta = GraphMeta(**json.loads(blob[start : start + header_len]))
        graph_bytes = memoryview(blob)[start + header_len :]  # not a copy of a graph's weights
        if meta.key != key or hashlib.sha256(graph_bytes).hexdigest() != meta.digest:
            raise ValueError("checksum mismatch")
    except (ValueError, TypeError, struct.error, UnicodeDecodeError) as exc:
        logger.warning("the cached graph %s is damaged (%s); rebuilding it", path, exc)
        return None
    return graph_bytes, meta


def write_cache(path: str, graph_bytes: bytes, meta: GraphMeta) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    header = json.dumps(asdict(meta)).encode()
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".graph")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + struct.pack("<I", len(header)) + header)
            f.write(graph_bytes)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@functools.cache
def tensorflow_version() -> str:
    """The installed TensorFlow's version, read from its package's metadata so that the
    server process can name cached graphs without loading TensorFlow."""
    for distribution in ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos", "tf-nightly"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    import tensorflow as tf

    return str(tf.__version__)


# -- building ----------------------------------------------------------------------------


def build_graph(
    model: ModelFiles, spec: GraphSpec, key: str = "", *, for_lite: bool = False
) -> tuple[bytes, GraphMeta]:
    """Build the encoder as a graph whose weights are constants, prune it; return the
    serialized GraphDef and its meta. ``for_lite``: the graph is to be converted to LiteRT,
    and spells its layer norms as LiteRT's converter takes them (see :mod:`.norm`).

    The graph is built directly, not traced with variables and frozen: freezing copies every
    weight through several forms of the function, so a build peaked at ~1,100 MiB above
    TensorFlow's own footprint for all-MiniLM-L6-v2, against ~350 MiB this way. Each weight
    becomes a ``Const`` that feeds its consumers directly, with no ``Identity`` read between:
    oneDNN's matrix product keeps its reordered copy of a weight only when the weight comes
    from a ``Const`` (behind an ``Identity`` it reorders every weight on every run).
    """
    import tensorflow as tf

    family = {"modernbert": modernbert, "qwen3": decoder, "gemma3": decoder}.get(model.config.family, bert)
    weights = read_weights(model)
    prepared = family.prepare_weights(weights, model.config, spec)
    if spec.task != "embed":
        prepared.update(task_heads.prepare(weights, model.config, model.head))
    del weights
    kept_out = names_outside(prepared, spec.dtype, for_lite)
    _check_graph_bytes({name: value for name, value in prepared.items() if name not in kept_out}, spec)
    constants = _Constants(prepared, kept_out)
    graph = tf.Graph()
    with graph.as_default(), norm.building_for_lite(for_lite):
        inputs = [tf.compat.v1.placeholder(tf.int32, [None, None], name=name) for name in INPUT_NAMES]
        head = model.head if spec.task != "embed" else None
        output = tf.identity(
            family.forward(constants, model.config, spec, model.defaults.dense, *inputs, head=head), name=OUTPUT_NAME
        )
    output_dim = int(output.shape[-1])
    placed = constants.placed
    del constants, output
    graph_def = graph.as_graph_def()
    del graph
    # Every layer was built, and the pooler if asked for; keep only what the output needs.
    # The inputs are kept even where unused (a family without token types), so every graph
    # takes the same three.
    pruned = tf.compat.v1.graph_util.extract_sub_graph(graph_def, [OUTPUT_NAME, *INPUT_NAMES])
    del graph_def
    graph_bytes = pruned.SerializeToString()
    entries: list[list[Any]]
    graph_length, entries = (len(graph_bytes), []) if placed else (0, [])
    if placed:
        graph_bytes, entries = appended(graph_bytes, pruned, placed)
    meta = GraphMeta(
        key=key,
        output_dim=output_dim,
        token_level=spec.pooling_strategy is PoolingStrategy.NONE,
        layers_run=len(encoder_layers_in(pruned)),
        output_node=OUTPUT_NAME,
        digest=hashlib.sha256(graph_bytes).hexdigest(),
        family=model.config.family,
        graph_length=graph_length,
        outside=entries,
    )
    return graph_bytes, meta


def _check_graph_bytes(prepared: dict[str, np.ndarray], spec: GraphSpec) -> None:
    """Refuse, saying what fits, a model whose weights in ``spec.dtype`` a graph cannot hold."""
    total = sum(value.nbytes for value in prepared.values())
    if total > GRAPH_BYTES:  # fp32 keeps its large weights outside the graph (.outside): not here
        raise ModelError(
            f"the model's weights in {spec.dtype} take {total / 2**30:.2f} GiB, past the "
            f"{GRAPH_BYTES / 2**30:.2f} GiB a frozen graph (or a LiteRT model) holds in {spec.dtype}; "
            "serve it in fp32 (--dtype fp32), whose weights are kept beside the graph"
        )


class _Constants(dict):
    """The weights as graph constants, each made at its first use (so a weight the output
    does not need never enters the graph) and its array let go of once it is in the graph;
    those named in ``outside`` as placeholders, their arrays kept in ``placed`` (.outside)."""

    def __init__(self, weights: dict[str, np.ndarray], outside: set[str] | None = None) -> None:
        super().__init__()
        self._weights = weights
        self._outside = outside or set()
        self.placed: dict[str, np.ndarray] = {}  # by node name

    def __missing__(self, name: str) -> Any:
        import tensorflow as tf

        value = self._weights.pop(name)
        if name in self._outside:
            tensor = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape, name=_var_name(name))
            self.placed[tensor.op.name] = value
        else:
            tensor = tf.constant(value, name=_var_name(name))
        self[name] = tensor
        return tensor


def encoder_layers_in(graph_def) -> set[int]:
    """The encoder layers that have nodes in ``graph_def``."""
    found = (re.match(r"(?:.*/)?layer_(\d+)/", node.name) for node in graph_def.node)
    return {int(m.group(1)) for m in found if m}


def _var_name(name: str) -> str:
    return name.replace("/", "__")


# -- loading -----------------------------------------------------------------------------


def load_function(graph_bytes: bytes | memoryview, meta: GraphMeta, *, xla: bool = False) -> Callable:
    """Import a serialized frozen graph as a callable ``f(input_ids, input_mask, segment_ids)``.

    The weights are taken out of the graph and captured as tensors: a constant is copied
    into every form a function takes (the parsed GraphDef, the imported graph, the function
    library, the optimized graph's kernels), a captured tensor is held once. At first only
    the embedding tables were, as they only feed a ``Gather``: oneDNN keeps a matrix
    product's reordered weight between runs only when it comes from a ``Const``. Measured
    with all-MiniLM-L6-v2 on a 2-core AMD EPYC (TensorFlow 2.21), capturing the fp32 matrix
    weights too costs nothing: bulk 0.98-1.02x, one to sixteen sentences a call within 6%
    either way, the same vectors, and an encoder's RSS falls from ~1,140 to ~890 MiB.

    bf16 matrix weights are captured too where oneDNN is told the weights are frozen, as in a
    worker (:func:`..memory.prepare_worker_process`). As constants all-MiniLM-L6-v2's 20 MiB of
    them cost a bf16 encoder ~190 MiB (RSS once ready 1,149 against 962 MiB, on the AVX-512
    EPYC; neither grappler's constant folding nor its remapper held the difference). Captured
    without that flag, every run reorders them: 4-6 ms more a run (2x40 tokens: 22 against
    18 ms, 64x64: 690 against 660); with it, the same time as constants, the same vectors.
    fp16 weights stay constants: a GPU's reorders could not be measured here.
    """
    import tensorflow as tf

    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(memoryview(graph_bytes)[: meta.graph_length or len(graph_bytes)])
    dtypes, captured = _matrix_weight_dtypes(graph_def), {tf.float32.as_datatype_enum}
    if weights_frozen():  # a worker's (.memory): oneDNN keeps its reorder of a captured weight
        captured.add(tf.bfloat16.as_datatype_enum)
    matrices = bool(dtypes) and dtypes <= captured
    taken = _take_constants(graph_def, matrices=matrices)
    if meta.graph_length:  # the weights after a graph past GRAPH_BYTES (.outside)
        taken.update(outside.read(graph_bytes, meta.graph_length, meta.outside))
    fn = wrap_graph(graph_def, meta, {f"{name}:0": tf.constant(value) for name, value in taken.items()})
    del taken
    graph_def.Clear()  # traced: the function holds what it needs, the parsed copy can go
    if xla:
        return tf.function(fn, jit_compile=True)
    return fn


def wrap_graph(graph_def, meta: GraphMeta, captured: dict[str, Any] | None = None) -> Callable:
    """``graph_def`` as a concrete function ``f(input_ids, input_mask, segment_ids)``, the
    tensors ``captured`` (by node output name) fed in for placeholders of the same names."""
    import tensorflow as tf

    def _imported(input_ids: tf.Tensor, input_mask: tf.Tensor, segment_ids: tf.Tensor) -> tf.Tensor:
        # Feeding the inputs through input_map imports the graph once, with nothing to prune.
        inputs = dict(zip((f"{name}:0" for name in INPUT_NAMES), (input_ids, input_mask, segment_ids), strict=True))
        graph = tf.compat.v1.get_default_graph()
        inputs.update({name: graph.capture(tensor) for name, tensor in (captured or {}).items()})
        (output,) = tf.compat.v1.import_graph_def(
            graph_def, input_map=inputs, return_elements=[f"{meta.output_node}:0"], name="bert"
        )
        return output

    signature = [tf.TensorSpec([None, None], tf.int32, name=name) for name in INPUT_NAMES]
    return tf.compat.v1.wrap_function(_imported, signature)


def _matrix_weight_dtypes(graph_def) -> set[int]:
    """The dtypes of the constants the graph's ``MatMul`` ops read."""
    consts = {node.name: node for node in graph_def.node if node.op == "Const"}
    names = (name.lstrip("^").split(":")[0] for node in graph_def.node if node.op == "MatMul" for name in node.input)
    return {consts[name].attr["dtype"].type for name in names if name in consts}


def _take_constants(graph_def, *, matrices: bool, min_bytes: int = 1 << 16) -> dict[str, np.ndarray]:
    """Turn each constant that only ``Gather`` ops read, as their table, and with ``matrices``
    every other constant of at least ``min_bytes``, into a placeholder of the same type and
    shape; returns the constants' values by node name."""
    import tensorflow as tf

    readers: dict[str, list[tuple[str, int]]] = {}
    for node in graph_def.node:
        for position, name in enumerate(node.input):
            readers.setdefault(name.lstrip("^").split(":")[0], []).append((node.op, position))
    taken = {}
    for node in graph_def.node:
        uses = readers.get(node.name, [])
        if node.op != "Const" or not uses:
            continue
        table = all(use == ("GatherV2", 0) for use in uses)
        if not table and not (matrices and node.attr["value"].tensor.ByteSize() >= min_bytes):
            continue
        taken[node.name] = tf.make_ndarray(node.attr["value"].tensor)
        dtype = node.attr["dtype"].type
        node.op = "Placeholder"
        node.ClearField("attr")
        node.attr["dtype"].type = dtype
        node.attr["shape"].shape.CopyFrom(tf.TensorShape(taken[node.name].shape).as_proto())
    return taken
