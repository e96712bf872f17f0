"""The request options on the real all-MiniLM-L6-v2, through a real server: the vectors of
``dimensions``, ``prompt_name`` and ``truncation_direction`` equal what sentence-transformers
computes (``tests/data/st_options_reference.npz``, written by
``benchmarks/make_st_reference.py``), to a cosine of 0.99999 in fp32."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from bertserve.client import AsyncBertClient, BertClient
from bertserve.server.testing.launcher import RunningServer, start_server

pytestmark = pytest.mark.minilm

DATA = Path(__file__).resolve().parents[1] / "data" / "st_options_reference.npz"
COSINE = 0.99999


@pytest.fixture(scope="module")
def st() -> dict[str, np.ndarray]:
    with np.load(DATA) as data:
        return {name: data[name] for name in data.files}


@pytest.fixture(scope="module")
def server(minilm: str, session_graph_dir: str, st: dict[str, np.ndarray]) -> Iterator[RunningServer]:
    prompts = json.loads(str(st["meta"]))["prompts"]
    flags = [f"--prompt={name}={text}" for name, text in prompts.items()]
    running = start_server(
        "--model-dir",
        minilm,
        "--max-seq-len",
        "128",
        "--dtype",
        "fp32",
        "--graph-dir",
        session_graph_dir,
        *flags,
    )
    yield running
    running.stop()


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))


def test_prompts_dimensions_and_the_left_side_equal_sentence_transformers(
    server: RunningServer, st: dict[str, np.ndarray]
) -> None:
    texts = [str(s) for s in st["sentences"]]
    long_texts = [texts[i] for i in st["long_rows"]]
    with BertClient(port=server.port, port_out=server.port_out, timeout=120_000, check_length=False) as client:
        assert client.server_config["prompts"] == {"query": "query: ", "passage": "passage: "}
        assert cosines(client.encode(texts), st["st_plain"]).min() >= COSINE
        for name in ("query", "passage"):
            got = client.encode(texts, prompt_name=name)
            assert cosines(got, st[f"st_prompt_{name}"]).min() >= COSINE, name
            assert cosines(got, st["st_plain"]).min() < 0.999  # the prompt changed the vectors
        left = client.encode(long_texts, truncation_direction="left")
        assert cosines(left, st["st_left_long"]).min() >= COSINE
        assert cosines(client.encode(long_texts), st["st_left_long"]).max() < 0.999  # right is the default
        for k in st["dimensions"].tolist():
            got = client.encode(texts, dimensions=k)
            assert got.shape == (len(texts), k)
            np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)  # renormalized
            assert cosines(got, st[f"st_dim{k}"]).min() >= COSINE
        with pytest.raises(ValueError, match="384"):
            client.encode(texts[:1], dimensions=385)
        with pytest.raises(ValueError, match="query"):
            client.encode(texts[:1], prompt_name="search")
        client.encode(texts[:1])
        plain = client.last_info["token_count"]
        client.encode(texts[:1], prompt_name="query")
        assert client.last_info["token_count"] == plain + 2  # "query" and ":" count toward usage


def test_the_async_client_gives_the_same_vectors_with_every_option(
    server: RunningServer, st: dict[str, np.ndarray]
) -> None:
    texts = [str(s) for s in st["sentences"]]
    long_texts = [texts[i] for i in st["long_rows"]]

    async def main() -> list[np.ndarray]:
        options = {"port": server.port, "port_out": server.port_out, "timeout": 120_000, "check_length": False}
        async with AsyncBertClient(**options) as client:
            return await asyncio.gather(
                client.encode(texts, prompt_name="query"),
                client.encode(long_texts, truncation_direction="left"),
                client.encode(texts, dimensions=64),
            )

    query, left, dim64 = asyncio.run(main())
    assert cosines(query, st["st_prompt_query"]).min() >= COSINE
    assert cosines(left, st["st_left_long"]).min() >= COSINE
    assert cosines(dim64, st["st_dim64"]).min() >= COSINE
