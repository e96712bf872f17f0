"""A graph past what one protobuf message holds (2 GiB: Qwen3-Embedding-0.6B in fp32) keeps its
large weights beside the GraphDef, in the same cached file (:mod:`bertserve.server.model.outside`).
The bound is lowered here so that the tiny models of ``tests/data/families`` take that path:
their vectors stay sentence-transformers', from the build and from the cache; a damaged
weight is caught by the cache's checksum and rebuilt; bf16 and int8 are refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bertserve.server import Encoder
from bertserve.server.errors import ModelError
from bertserve.server.model import graph, outside

DATA = Path(__file__).resolve().parents[3] / "data" / "families"


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outside, "GRAPH_BYTES", 16 << 10)
    monkeypatch.setattr(graph, "GRAPH_BYTES", 16 << 10)
    monkeypatch.setattr(outside, "MIN_BYTES", 4 << 10)


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (a, b))
    return float((a * b).sum(1).min())


@pytest.mark.parametrize("name", ["qwen3", "gte"])
def test_weights_beside_the_graph_give_the_same_vectors_built_and_cached(
    small_bound: None, tmp_path: Path, name: str
) -> None:
    with np.load(DATA / f"{name}.npz") as ref:
        sentences, expected = [str(s) for s in ref["sentences"]], ref["st_default"]
    built = Encoder(str(DATA / name), dtype="fp32", graph_dir=str(tmp_path))
    assert built.graph_built and built.meta.graph_length > 0 and len(built.meta.outside) > 3
    assert not built.uses_lite  # LiteRT's model has the graph's bound: small runs stay on TensorFlow
    assert _min_cosine(built.encode(sentences), expected) >= 0.99999
    cached = Encoder(str(DATA / name), dtype="fp32", graph_dir=str(tmp_path))
    assert not cached.graph_built
    np.testing.assert_array_equal(cached.encode(sentences[:16]), built.encode(sentences[:16]))


def test_a_damaged_weight_beside_the_graph_is_caught_and_rebuilt(small_bound: None, tmp_path: Path) -> None:
    first = Encoder(str(DATA / "qwen3"), dtype="fp32", graph_dir=str(tmp_path))
    (path,) = tmp_path.glob("*.graph")
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 0xFF  # in the last weight, after the GraphDef
    path.write_bytes(bytes(blob))
    again = Encoder(str(DATA / "qwen3"), dtype="fp32", graph_dir=str(tmp_path))
    assert again.graph_built  # the checksum covers the weights too
    np.testing.assert_array_equal(again.encode(["a sentence"]), first.encode(["a sentence"]))


def test_the_weights_entries_are_checked_against_the_file() -> None:
    blob = np.arange(6, dtype=np.float32).tobytes()
    assert outside.read(blob, 0, [["w", "<f4", [2, 3]]])["w"].shape == (2, 3)
    for entries in ([["w", "<f4", [2, 4]]], [["w", "<i4", [2, 3]]], [["w", "<f4", [2, 2]]], [["w", "|O", [1]]]):
        with pytest.raises((ValueError, TypeError)):
            outside.read(blob, 0, entries)


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_bf16_and_int8_past_the_bound_are_refused_saying_what_serves_it(
    small_bound: None, tmp_path: Path, dtype: str
) -> None:
    with pytest.raises(ModelError, match=r"serve it in fp32 \(--dtype fp32\)"):
        Encoder(str(DATA / "qwen3"), dtype=dtype, graph_dir=str(tmp_path))
