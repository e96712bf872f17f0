"""Weights kept outside the GraphDef, for a model past what one protobuf message holds.

A GraphDef is one protobuf message, at most 2 GiB: Qwen3-Embedding-0.6B's weights take 2.4 GB
in fp32. Such a model's graph is built with each large weight (1 MiB and up) as a placeholder
of its name, and the weights' raw bytes follow the serialized GraphDef in the same cached
file (one checksum over both), listed in its meta in order: node name, dtype, shape. A
worker reads them as views of the file and captures each as a tensor fed to its placeholder,
as it already does for fp32 weights taken out of a graph (:func:`.graph.load_function`).

Only fp32 graphs run this way: LiteRT's flatbuffer has the same bound (int8, and small runs
on LiteRT, are for models under it), and bf16 or fp16 weights stay constants (their blocked
reorders are kept between runs only for a ``Const``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: What one serialized graph may hold: protobuf's 2 GiB, less room for the graph's nodes.
GRAPH_BYTES = (1 << 31) - (64 << 20)
MIN_BYTES = 1 << 20  # a weight this large goes outside a graph past GRAPH_BYTES


def names_outside(weights: dict[str, np.ndarray], dtype: str, for_lite: bool) -> set[str]:
    """The weights to keep outside the graph: none while they fit; in fp32 (not for LiteRT)
    each large one."""
    if dtype != "fp32" or for_lite or sum(value.nbytes for value in weights.values()) <= GRAPH_BYTES:
        return set()
    return {name for name, value in weights.items() if value.nbytes >= MIN_BYTES}


def appended(graph_bytes: bytes, graph_def: Any, arrays: dict[str, np.ndarray]) -> tuple[bytes, list[list[Any]]]:
    """The serialized graph with the raw bytes of each of ``arrays`` (by node name) the pruned
    ``graph_def`` still reads after it, and their entries for the meta."""
    kept = {node.name for node in graph_def.node}
    entries, parts = [], [graph_bytes]
    for node, value in arrays.items():
        if node in kept:
            value = np.ascontiguousarray(value)
            entries.append([node, value.dtype.str, list(value.shape)])
            parts.append(value.tobytes())
    return b"".join(parts), entries


def read(blob: Any, graph_length: int, entries: list[list[Any]]) -> dict[str, np.ndarray]:
    """The weights after the graph in ``blob``, by node name: views of it, not copies."""
    view, offset, out = memoryview(blob), graph_length, {}
    for node, dtype, shape in entries:
        kind = np.dtype(str(dtype))
        count = math.prod(int(size) for size in shape)
        if kind.kind != "f" or offset + count * kind.itemsize > len(view):
            raise ValueError(f"the weight {node} does not fit the cached graph")
        out[str(node)] = np.frombuffer(view, kind, count, offset).reshape([int(size) for size in shape])
        offset += count * kind.itemsize
    if offset != len(view):
        raise ValueError("the cached graph holds more than its weights")
    return out
