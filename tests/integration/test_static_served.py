"""A real server of two static models (model2vec, tests/data/static), asked over ZeroMQ
(``BertClient``) and HTTP (``/v1/embeddings`` with the ``openai`` package): each vector is
what model2vec 0.10's ``StaticModel.encode`` computes, a request's ``normalize`` is honoured,
bad input is a 4xx or an error naming the field, and no process of the server loads TensorFlow."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from bertserve.server.testing.launcher import free_port, start_server
from served import Served

pytestmark = pytest.mark.timeout(300)

STATIC = Path(__file__).resolve().parent.parent / "data" / "static"
KEY = "static-key-0123456789"
MODELS = ("static_norm", "static_weighted")


def reference(name: str) -> tuple[list[str], dict[str, np.ndarray]]:
    texts = json.loads((STATIC / f"{name}.json").read_text(encoding="utf-8"))["texts"]
    with np.load(STATIC / f"{name}.npz") as data:
        return texts, {key: data[key] for key in data.files}


def servable(texts: list[str]) -> list[int]:
    """The rows of ``texts`` a client may send: not empty (every client refuses an empty text)."""
    return [i for i, text in enumerate(texts) if text.strip()]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    port = free_port()
    models = [arg for name in MODELS for arg in ("--model", f"{name}={STATIC / name}")]
    running = start_server("--http-port", str(port), "--api-key", KEY, "--num-worker", "1", *models)
    served = Served(running, port, KEY)
    yield served
    served.stop()


@pytest.mark.filterwarnings("ignore:texts")  # the text of 130 sentences is longer than the model's length
@pytest.mark.parametrize("name", MODELS)
def test_zeromq_vectors_are_model2vec_s(served: Served, name: str) -> None:
    texts, ref = reference(name)
    rows = servable(texts)
    with served.client(name) as client:
        vectors = client.encode([texts[i] for i in rows])
        raw = client.encode([texts[i] for i in rows[:5]], normalize=False)
    assert vectors.shape == (len(rows), 32) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, ref["vectors"][rows], atol=1e-5)
    np.testing.assert_allclose(raw, ref["raw"][rows[:5]], atol=1e-4)


@pytest.mark.parametrize("name", MODELS)
def test_openai_vectors_are_model2vec_s(served: Served, name: str) -> None:
    texts, ref = reference(name)
    rows = servable(texts)
    inputs = [texts[i] for i in rows]
    answer = served.openai().embeddings.create(model=name, input=inputs, extra_body={"truncate": True})
    vectors = np.asarray([item.embedding for item in answer.data], np.float32)
    assert vectors.shape == (len(rows), 32)
    np.testing.assert_allclose(vectors, ref["vectors"][rows], atol=1e-5)
    assert answer.usage.prompt_tokens > len(rows)


def test_bad_input_names_the_field(served: Served) -> None:
    with served.http() as http:
        for bad in ([], [{"text": 1}], [1.5, 2.5], None, [""]):
            answer = http.post("/v1/embeddings", json={"model": MODELS[0], "input": bad})
            assert 400 <= answer.status_code < 500, answer.text
            assert "input" in answer.text
    with served.client(MODELS[0]) as client:
        assert client.encode([]).shape == (0, 32)  # the ZeroMQ protocol's answer to no text: no vector
        with pytest.raises(ValueError, match=r"texts\[1\]"):
            client.encode(["fine", 3])  # type: ignore[list-item]


def test_no_process_loads_tensorflow(served: Served) -> None:
    processes = served.running.family()
    assert len(processes) >= 3  # the supervisor, its head or sink, and a worker of each model
    for process in processes:
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        assert "tensorflow" not in maps, f"{process.name()} ({process.pid}) loaded TensorFlow"
