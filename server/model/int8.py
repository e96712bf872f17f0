"""int8 on the CPU: the frozen fp32 graph converted to LiteRT with int8 matrix weights.

TensorFlow's converter quantizes each fully connected weight to int8 per output channel
(dynamic-range quantization), and LiteRT's kernels quantize the activations feeding it at
run time, row by row, so no calibration is needed and no fixed range clips a long or odd
sentence. Everything else stays fp32: the embedding tables (which the converter would store
in int8 too, and which are written back), attention's own products (both operands are
activations), softmax, layer norm, the residual stream, pooling and normalisation.

A product whose rounding costs the most accuracy can be kept in fp32
(:data:`KEEP_FLOAT`): after conversion its weight is written back as fp32, so the runtime
picks its fp32 kernel for it. The choice came from measuring each product's error alone
(``benchmarks/int8_layers.py``; the figures are beside :data:`KEEP_FLOAT`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..errors import ModelError
from ..logs import held_native_output
from .graph import INPUT_NAMES, GraphMeta

#: The products kept in fp32, as ``layer/role`` patterns (roles: qkv, attn_out, ffn_in,
#: ffn_out, pooler). Measured on all-MiniLM-L6-v2 (``benchmarks/int8_layers.py``, 1,130
#: sentences, min / mean cosine to the fp32 graph): every product in int8 0.9935 / 0.99902;
#: one kind in int8 and the rest fp32: qkv 0.9971, ffn_out 0.9973, ffn_in 0.9988, attn_out
#: 0.9999. The fused query, key and value product loses the most (its rows' scales are set by
#: the layer norm's few outlier channels), but kept in fp32 it is a quarter of the products'
#: work on fp32 kernels, which on a CPU with int8 matrix units (VNNI, AMX-int8) then take most
#: of the run: on a 2-core Xeon with AMX, the benchmark corpus (2,500 sentences), every product
#: int8 ran 2,200 sentences/s at 0.9947 / 0.99897, qkv kept 1,220 at 0.9977 / 0.99945 (bf16:
#: 1,790), and one layer's qkv kept about 1,900. So every product is int8, within the
#: 0.99 / 0.998 bound int8 is held to.
KEEP_FLOAT: tuple[str, ...] = ()
#: Families whose int8 needs more kept in fp32. all-mpnet-base-v2 (the same 130 sentences, max_seq_len
#: 128, min / mean cosine to sentence-transformers): the query, key and value product kept, 0.9608 /
#: 0.99854, its worst a word repeated 300 times; the first and last two layers' ffn_out kept too, 0.9633;
#: every ffn_out kept too, 0.9963 / 0.99962.
KEEP_FLOAT_BY_FAMILY: dict[str, tuple[str, ...]] = {"mpnet": ("*/qkv", "*/ffn_out")}
#: What a task's head (rerank, classify, sparse) keeps in fp32, unless its family keeps more: a
#: score or a logit has no normalization to absorb the query, key and value product's error
#: (a tiny XLM-RoBERTa reranker's scores moved by 0.22 of their spread with it in int8).
KEEP_FLOAT_FOR_TASKS: tuple[str, ...] = ("*/qkv",)


def kept_float(family: str, task: str) -> tuple[str, ...]:
    """The products a model of ``family`` computing ``task`` keeps in fp32 by default."""
    if family in KEEP_FLOAT_BY_FAMILY:
        return KEEP_FLOAT_BY_FAMILY[family]
    return KEEP_FLOAT if task == "embed" else KEEP_FLOAT_FOR_TASKS


_LAYER = re.compile(r"layer_(\d+)/MatMul")  # a fused name lists the ops folded in; the product comes last
_PRODUCT = re.compile(r"layer_\d+/MatMul(?:_(\d+))?(?![\w])")  # a layer's products in order: MatMul, MatMul_1, ...
#: The converter would fold the layer norm's scale into the next product's weight, giving
#: each input channel its own range, which one scale per output channel then rounds badly:
#: every product in int8 gave a min cosine of 0.989 folded and 0.993 not.
FUSE_DISABLED = True
_FLOAT32, _INT8 = 0, 9  # TensorType values in LiteRT's schema
_KERNEL = re.compile(r"(?:.*/)?layer_(\d+)__(qkv|attn_out|ffn_in|ffn_out)__kernel")  # the graph's constants


def convert(graph_def: Any, meta: GraphMeta, keep_float: Iterable[str] | None = None, task: str = "embed") -> bytes:
    """The frozen fp32 ``graph_def`` as a LiteRT model with int8 matrix weights, the
    products named in ``keep_float`` (``"layer_3/ffn_out"``, ``"*/ffn_out"``, ``"layer_5/*"``)
    left in fp32: by default those the model's family and ``task`` need (:func:`kept_float`)."""
    import tensorflow as tf

    if keep_float is None:
        keep_float = kept_float(meta.family, task)

    converter = tf.compat.v1.lite.TFLiteConverter(
        graph_def,
        None,
        None,
        input_arrays_with_shape=[(name, [-1, -1]) for name in INPUT_NAMES],
        output_arrays=[meta.output_node],
    )
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter._experimental_disable_fuse_mul_and_fc = FUSE_DISABLED
    with held_native_output():
        flatbuffer = bytes(converter.convert())
    kept = tuple(keep_float)

    def keep(name: str) -> bool:
        return any(matches(name, pattern) for pattern in kept)

    return restore_float(flatbuffer, keep, exact=exact_weights(graph_def, keep))


def exact_weights(graph_def: Any, keep: Callable[[str], bool]) -> dict[str, np.ndarray]:
    """The fp32 values, from the graph's constants, of the embedding tables (by constant
    name) and of the products ``keep`` names (by product, laid out ``[out, in]`` as LiteRT's
    fully connected weights are)."""
    import tensorflow as tf

    exact = {}
    for node in graph_def.node:
        if node.op != "Const":
            continue
        product = _KERNEL.fullmatch(node.name)
        if product and keep(f"layer_{product[1]}/{product[2]}"):
            exact[f"layer_{product[1]}/{product[2]}"] = tf.make_ndarray(node.attr["value"].tensor).T
        elif node.name.startswith("embeddings__") and node.name.endswith("_embeddings"):
            exact[node.name] = tf.make_ndarray(node.attr["value"].tensor)
    return exact


def matches(product: str, pattern: str) -> bool:
    """Whether ``product`` (``layer_3/qkv``) is one ``pattern`` (``*/qkv``) names."""
    layer, _, role = product.partition("/")
    want_layer, _, want_role = pattern.partition("/")
    return want_layer in ("*", layer) and want_role in ("*", role)


def products(flatbuffer: bytes) -> list[str]:
    """The names of the int8 products in ``flatbuffer``, in graph order."""
    model = _read(flatbuffer)
    return [name for name, _ in _int8_products(model)]


def restore_float(flatbuffer: bytes, keep: Callable[[str], bool], exact: dict[str, np.ndarray] | None = None) -> bytes:
    """``flatbuffer`` with the weight of each product ``keep`` names written back as fp32, so
    that product runs in fp32, and every embedding table fp32 again (:func:`_restore_tables`).
    A weight or table found in ``exact`` takes those values; any other, its int8 values times
    their scales."""
    from ai_edge_litert.tools import flatbuffer_utils

    exact = exact or {}
    model = _read(flatbuffer)
    for name, (tensor, buffer) in _int8_products(model):
        if keep(name):
            _dequantize(tensor, buffer, exact.get(name))
    _restore_tables(model, exact)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _dequantize(tensor: Any, buffer: Any, values: np.ndarray | None = None) -> None:
    """Make an int8 constant fp32: ``values`` where they fit its shape, else its int8 values
    times their scales."""
    if values is None or list(values.shape) != list(tensor.shape):
        scales = np.asarray(tensor.quantization.scale, dtype=np.float32)
        zero_points = np.asarray(tensor.quantization.zeroPoint, dtype=np.float32)
        axis = tensor.quantization.quantizedDimension if scales.size > 1 else 0
        shape = [1] * len(tensor.shape)
        shape[axis] = -1
        stored = np.frombuffer(bytes(buffer.data), dtype=np.int8).reshape(tensor.shape).astype(np.float32)
        values = (stored - zero_points.reshape(shape)) * scales.reshape(shape)
    buffer.data = np.frombuffer(np.ascontiguousarray(values, dtype=np.float32).tobytes(), dtype=np.uint8)
    tensor.type = _FLOAT32
    tensor.quantization = None


def _restore_tables(model: Any, exact: dict[str, np.ndarray]) -> None:
    """The converter stores an embedding table in int8 too, gathering int8 rows and
    dequantizing them. The table is made fp32 again and the ``DEQUANTIZE`` after its
    ``GATHER`` dropped, its readers reading the gathered rows: the embeddings stay exact."""
    from ai_edge_litert.tools import flatbuffer_utils

    graph = model.subgraphs[0]
    producer = {out: op for op in graph.operators for out in op.outputs}
    dropped: set[int] = set()  # the DEQUANTIZE ops, by id
    for op in graph.operators:
        if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) != "DEQUANTIZE":
            continue
        gather = producer.get(op.inputs[0])
        if gather is None or flatbuffer_utils.opcode_to_name(model, gather.opcodeIndex) != "GATHER":
            continue
        table = graph.tensors[gather.inputs[0]]
        if table.type != _INT8:
            continue
        name = table.name.decode() if isinstance(table.name, bytes) else str(table.name)
        _dequantize(table, model.buffers[table.buffer], exact.get(name))
        rows = graph.tensors[gather.outputs[0]]
        rows.type, rows.quantization = _FLOAT32, None
        renamed = {op.outputs[0]: gather.outputs[0]}
        for reader in graph.operators:
            reader.inputs = [renamed.get(i, i) for i in reader.inputs]
        graph.outputs = [renamed.get(i, i) for i in graph.outputs]
        dropped.add(id(op))
    graph.operators = [op for op in graph.operators if id(op) not in dropped]


def _read(flatbuffer: bytes) -> Any:
    try:
        from ai_edge_litert.tools import flatbuffer_utils
    except ImportError as exc:
        raise ModelError(f"dtype int8 needs ai-edge-litert: pip install ai-edge-litert ({exc})") from None
    return flatbuffer_utils.read_model_from_bytearray(bytearray(flatbuffer))


def _int8_products(model: Any) -> list[tuple[str, tuple[Any, Any]]]:
    """Each fully connected op with an int8 weight: its name (``layer_N/role``) and its
    weight tensor and buffer."""
    from ai_edge_litert.tools import flatbuffer_utils

    graph = model.subgraphs[0]
    found = []
    for op in graph.operators:
        if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) != "FULLY_CONNECTED":
            continue
        tensor = graph.tensors[op.inputs[1]]
        if tensor.type != _INT8:
            continue
        name = tensor.name.decode() if isinstance(tensor.name, bytes) else str(tensor.name)
        output = graph.tensors[op.outputs[0]].name
        output = output.decode() if isinstance(output, bytes) else str(output)
        layers = _LAYER.findall(name) or _LAYER.findall(output)
        out_features, in_features = tensor.shape
        named = name if _LAYER.search(name) else output
        product = f"layer_{layers[-1] if layers else '?'}/{_role(named, out_features, in_features)}"
        found.append((product, (tensor, model.buffers[tensor.buffer])))
    return found


def _role(name: str, out_features: int, in_features: int) -> str:
    """A layer's product: the fused query, key and value product is the layer's first
    (``layer_N/MatMul``), the others are told apart by their weight's shape. (By shape alone,
    ModernBERT's GeGLU input, 2 x 1152 = 3 x 768 wide, would pass for the query, key and value.)"""
    if "pooler" in name:
        return "pooler"
    numbers = _PRODUCT.findall(name)
    if (numbers[-1] == "") if numbers else out_features == 3 * in_features:
        return "qkv"
    if out_features == in_features:
        return "attn_out"
    return "ffn_in" if out_features > in_features else "ffn_out"
