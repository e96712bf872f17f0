"""The clients against a real server of two models: ``a``, the tiny BERT (32 dimensions, mean
pooling over 32 tokens, no prompts), and ``b``, another tiny BERT (48 dimensions, its [CLS]
token over 16 tokens, a ``query`` prompt from its directory).

Every client (``BertClient``, ``ConcurrentBertClient``, ``AsyncBertClient`` and ``bertserve
encode``) gets from each model the vectors the in-process ``Encoder`` computes with that
model's options, whether the client names the model or one call does; the request options
are checked against the configuration of the model a request goes to; ``server_config``
lists both models; a name the server does not serve raises ``UnknownModelError`` naming
those it serves.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bertserve.client import AsyncBertClient, BertClient, ConcurrentBertClient, UnknownModelError
from bertserve.server import Encoder
from bertserve.server.cli import main as cli
from bertserve.server.testing.launcher import RunningServer, start_server
from bertserve.server.testing.tiny_bert import write_tiny_bert
from faulty_model import sentences

pytestmark = pytest.mark.timeout(300)

DIM = {"a": 32, "b": 48}
MAX_LEN = {"a": 32, "b": 16}
PROMPT = "query: "
TEXTS = [" ".join(text.split()[-12:]) for text in sentences(10, seed=31)]  # within both models' lengths
SERVED = "this server serves no model 'nope'; it serves 'a', 'b'"


@pytest.fixture(scope="module")
def model_b(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = write_tiny_bert(str(tmp_path_factory.mktemp("tiny_b")), "google", seed=4, hidden_size=DIM["b"])
    (Path(directory) / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": PROMPT}, "default_prompt_name": None}), encoding="utf-8"
    )
    return directory


@pytest.fixture(scope="module")
def server(tiny_google: str, model_b: str, session_graph_dir: str) -> Iterator[RunningServer]:
    running = start_server(
        "--model",
        f"a={tiny_google}",
        "--model",
        f"b={model_b},pooling_strategy=CLS_TOKEN,max_seq_len={MAX_LEN['b']}",
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        str(MAX_LEN["a"]),
        "--max-latency-ms",
        "2",
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def expected(tiny_google: str, model_b: str, session_graph_dir: str) -> dict[str, np.ndarray]:
    """Each model's vectors of :data:`TEXTS` from the in-process ``Encoder`` with its options;
    ``b+query`` those of ``b`` with its prompt before each text."""
    a = Encoder(tiny_google, graph_dir=session_graph_dir, max_seq_len=MAX_LEN["a"])
    b = Encoder(model_b, graph_dir=session_graph_dir, max_seq_len=MAX_LEN["b"], pooling_strategy="CLS_TOKEN")
    return {"a": a.encode(TEXTS), "b": b.encode(TEXTS), "b+query": b.encode([PROMPT + text for text in TEXTS])}


def assert_same(got: Any, want: np.ndarray) -> None:
    rows = np.asarray(got, dtype=np.float64)
    assert rows.shape == want.shape
    cosine = (rows * want).sum(1) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= 0.99999, cosine.min()


def test_each_model_answers_each_client_with_its_own_vectors(
    server: RunningServer, expected: dict[str, np.ndarray]
) -> None:
    assert expected["a"].shape[1] == DIM["a"] and expected["b"].shape[1] == DIM["b"]
    kwargs: dict[str, Any] = {**server.client_kwargs, "timeout": 60_000}
    with BertClient(**kwargs) as default, BertClient(**kwargs, model="b") as named:
        assert_same(default.encode(TEXTS), expected["a"])  # no name: the first --model, the default
        assert default.last_info["model"] == "a"
        assert_same(default.encode(TEXTS, model="b"), expected["b"])  # one call to the other model
        assert default.last_info["model"] == "b"
        assert_same(named.encode(TEXTS), expected["b"])
        assert_same(named.encode(TEXTS, model="a"), expected["a"])
        batches = list(named.encode_async([TEXTS[:5], TEXTS[5:]], model="a"))
        assert_same(np.concatenate(batches), expected["a"])
        named.encode(TEXTS[:4], blocking=False)
        named.encode(TEXTS[4:], blocking=False, model="a")
        first, second = named.fetch_all(sort=True)
        assert_same(first, expected["b"][:4])
        assert_same(second, expected["a"][4:])
    with ConcurrentBertClient(max_concurrency=2, **kwargs, model="b") as pool:
        assert_same(pool.encode(TEXTS), expected["b"])
        assert_same(pool.encode(TEXTS, model="a"), expected["a"])

    async def main() -> None:
        async with AsyncBertClient(**kwargs, model="b") as client:
            mine, other = await asyncio.gather(client.encode(TEXTS), client.encode(TEXTS, model="a"))
            assert_same(mine, expected["b"])
            assert_same(other, expected["a"])

    asyncio.run(main())


def test_request_options_are_checked_against_the_model_they_go_to(
    server: RunningServer, expected: dict[str, np.ndarray]
) -> None:
    with BertClient(**server.client_kwargs, timeout=60_000) as client:
        assert_same(client.encode(TEXTS, model="b", prompt_name="query"), expected["b+query"])
        assert_same(client.encode(TEXTS, model="b", dimensions=40), expected["b"][:, :40])
        with pytest.raises(ValueError, match="dimensions=40 is more than the model's 32 dimensions"):
            client.encode(TEXTS, dimensions=40)
        with pytest.raises(ValueError, match="unknown prompt_name 'query': the server has no prompts"):
            client.encode(TEXTS, prompt_name="query")
        with pytest.raises(ValueError, match="dimensions=49 is more than the 48 dimensions of model 'b'"):
            client.encode(TEXTS, model="b", dimensions=49)
        long = " ".join(["word"] * 20)  # more than b's 16 tokens, within a's 32
        with pytest.warns(UserWarning, match="max_seq_len=16"):
            client.encode([long], model="b")
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            client.encode([long])
        assert client.encode([], model="b").shape == (0, DIM["b"])

    async def main() -> None:
        async with AsyncBertClient(**server.client_kwargs, timeout=60_000, model="b") as client:
            assert_same(await client.encode(TEXTS, prompt_name="query"), expected["b+query"])
            with pytest.raises(ValueError, match="unknown prompt_name 'query': model 'a' has no prompts"):
                await client.encode(TEXTS, prompt_name="query", model="a")

    asyncio.run(main())


def test_server_config_describes_the_clients_model_and_lists_both(server: RunningServer) -> None:
    with BertClient(**server.client_kwargs, timeout=30_000, model="b") as client:
        config = client.server_config
        default = client.server_config_of(None)
        status = client.server_status
    assert (config["model_name"], config["default_model"]) == ("b", "a")
    assert (config["output_dim"], config["max_seq_len"], config["pooling_strategy"]) == (DIM["b"], 16, "CLS_TOKEN")
    assert config["prompts"] == {"query": PROMPT}
    assert (default["model_name"], default["output_dim"], default["prompts"]) == ("a", DIM["a"], {})
    listed = {model["name"]: model for model in config["models"]}
    assert list(listed) == ["a", "b"] and default["models"] == config["models"]
    for name in ("a", "b"):
        assert (listed[name]["output_dim"], listed[name]["max_seq_len"]) == (DIM[name], MAX_LEN[name])
        assert listed[name]["ready"] and listed[name]["workers"] == 1
        assert set(listed[name]) >= {"dtype", "pooling_strategy", "model_version", "prompts"}
    assert (listed["a"]["prompts"], listed["b"]["prompts"]) == ([], ["query"])  # the names
    assert status["models"]["a"]["default"] and not status["models"]["b"]["default"]

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with AsyncBertClient(**server.client_kwargs, timeout=30_000, model="b") as client:
            return await client.server_config(), await client.server_config_of("a")

    mine, other = asyncio.run(main())
    assert (mine["model_name"], mine["output_dim"]) == ("b", DIM["b"])
    assert (other["model_name"], other["output_dim"]) == ("a", DIM["a"])


def test_a_model_the_server_does_not_serve_is_refused_with_the_names_it_serves(
    server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kwargs: dict[str, Any] = {**server.client_kwargs, "timeout": 30_000}
    with pytest.raises(UnknownModelError, match=SERVED) as info:
        BertClient(**kwargs, model="nope")
    assert info.value.kind == "model"
    with BertClient(**kwargs) as client:
        with pytest.raises(UnknownModelError, match=SERVED):
            client.encode(TEXTS, model="nope")
        with pytest.raises(UnknownModelError, match=SERVED):
            client.server_config_of("nope")
        assert client.encode(TEXTS[:1]).shape == (1, DIM["a"])  # the client is still fine
    with ConcurrentBertClient(**kwargs) as pool, pytest.raises(UnknownModelError, match=SERVED):
        pool.encode(TEXTS, model="nope")

    async def main() -> None:
        with pytest.raises(UnknownModelError, match=SERVED):
            async with AsyncBertClient(**kwargs, model="nope"):
                pass
        async with AsyncBertClient(**kwargs) as client:
            with pytest.raises(UnknownModelError, match=SERVED):
                await client.encode(TEXTS, model="nope")

    asyncio.run(main())
    source, out = tmp_path / "in.txt", tmp_path / "out.npy"
    source.write_text("\n".join(TEXTS), encoding="utf-8")
    ports = ["--port", str(server.port), "--port-out", str(server.port_out)]
    assert cli.main(["encode", str(source), "-o", str(out), "--model", "nope", *ports]) == 1
    assert SERVED in capsys.readouterr().err


def test_bertserve_encode_uses_the_model_named(
    server: RunningServer, expected: dict[str, np.ndarray], tmp_path: Path
) -> None:
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS), encoding="utf-8")
    ports = ["--port", str(server.port), "--port-out", str(server.port_out)]
    for name in ("a", "b"):
        out = tmp_path / f"{name}.npy"
        assert cli.main(["encode", str(source), "-o", str(out), "--model", name, *ports]) == 0
        assert_same(np.load(out), expected[name])
    assert cli.main(["encode", str(source), "-o", str(tmp_path / "default.npy"), *ports]) == 0
    assert_same(np.load(tmp_path / "default.npy"), expected["a"])
