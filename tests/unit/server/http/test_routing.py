"""Several models behind one HTTP API, in process (``server/http/catalog.py`` and the routes of
``server/http/app.py``): the application is served with a stand-in for the head behind its
gateway, which serves two models with different dimensions, prompts and tokenizers and
records every request it gets. Real servers: tests/integration/test_http_models.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bertserve.client import protocol as p
from bertserve.server.config.http import Http
from bertserve.server.config.limits import Limits
from bertserve.server.http.app import Settings, create_app
from bertserve.server.http.catalog import Catalog, ModelSettings
from bertserve.server.http.principals import Principals
from bertserve.server.http.schemas import STATUS_OF_KIND
from bertserve.server.model.tokenization import WordPieceTokenizer
from bertserve.server.testing.tiny_bert import tiny_vocab
from starlette.testclient import TestClient

MODELS: dict[str, dict[str, Any]] = {
    "a": {"output_dim": 32, "dtype": "float32", "model_version": None, "fill": 1.0, "prompts": {"query": "what is: "}},
    "b": {"output_dim": 16, "dtype": "int8", "model_version": 3, "fill": 2.0, "prompts": {}},
}
NINE_WORDS = "the quick brown fox jumps over the lazy dog"  # 11 tokens with [CLS] and [SEP]


class FakeHead:
    """The head as the HTTP process's gateway reaches it: it serves :data:`MODELS` (its
    default ``default``), answers CONFIG for the model a request names, ENCODE with rows of
    the model's ``fill`` value, and refuses a model it does not serve (or is told to refuse)
    with kind ``model``. Every request's command and header is kept in :attr:`sent`."""

    def __init__(self, default: str = "a", *, refuse: Sequence[str] = (), ready: bool = True) -> None:
        self.default, self.refuse, self.ready = default, set(refuse), ready
        self.sent: list[tuple[bytes, dict[str, Any]]] = []
        self.config = self._config(default)  # what the gateway's first CONFIG, naming no model, got

    def client_id(self, caller: str) -> bytes:
        return b"http." + caller.encode()

    async def request(
        self,
        client_id: bytes,
        command: bytes,
        texts: Sequence[Any] = (),
        *,
        is_tokenized: bool = False,
        options: dict[str, Any] | None = None,
        model: str | None = None,
        timeout_s: float,
    ) -> p.Reply:
        header = {**(options or {}), **({"model": model} if model is not None else {})}
        self.sent.append((command, header))
        name = model or self.default
        if name not in MODELS or name in self.refuse:
            served = ", ".join(repr(known) for known in MODELS if known not in self.refuse)
            error = {"error": f"this server serves no model {name!r}; it serves {served}", "kind": p.UNKNOWN_MODEL}
            return p.Reply(client_id, 1, False, error)
        if command == p.CONFIG:
            return p.Reply(client_id, 1, True, self._config(name))
        rows = np.full(
            (len(texts), (options or {}).get("dimensions") or MODELS[name]["output_dim"]),
            MODELS[name]["fill"],
            np.float32,
        )
        about = {**p.array_header(rows), "token_count": 3 * len(texts), "model": name}
        if MODELS[name]["model_version"] is not None:
            about["model_version"] = MODELS[name]["model_version"]
        return p.Reply(client_id, 1, True, about, rows.tobytes())

    async def status(self) -> dict[str, Any]:
        return {"ready": True}

    async def close(self) -> None:
        pass

    def encodes(self) -> list[dict[str, Any]]:
        return [header for command, header in self.sent if command == p.ENCODE]

    def _config(self, name: str) -> dict[str, Any]:
        model = MODELS[name]
        listed = [
            {
                "name": known,
                "output_dim": about["output_dim"] if self.ready else None,
                "max_seq_len": 8,
                "dtype": about["dtype"] if self.ready else None,
                "pooling_strategy": "REDUCE_MEAN",
                "model_version": about["model_version"],
                "workers": int(self.ready),
                "prompts": sorted(about["prompts"]),
                "ready": self.ready,
            }
            for known, about in MODELS.items()
        ]
        answer = {
            "model_name": name,
            "default_model": self.default,
            "models": listed,
            "normalize": False,
            "prompts": model["prompts"],
            "default_prompt_name": None,
        }
        if self.ready:
            answer.update(output_dim=model["output_dim"], dtype=model["dtype"])
        return answer


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = Path(tmp_path_factory.mktemp("vocab")) / "vocab.txt"
    path.write_text("\n".join(tiny_vocab()) + "\n", encoding="utf-8")
    return str(path)


def tokenizer(vocab: str, max_len: int) -> WordPieceTokenizer:
    return WordPieceTokenizer(vocab_path=vocab, tokenizer_json=None, do_lower_case=True, max_len=max_len)


def two_models(vocab: str) -> tuple[ModelSettings, ...]:
    """``a`` takes 8 tokens, ``b`` 16."""
    return ModelSettings("a", (), tokenizer(vocab, 8)), ModelSettings("b", (), tokenizer(vocab, 16))


def serve(models: tuple[ModelSettings, ...], head: FakeHead) -> TestClient:
    settings = Settings(
        models=models,
        principals=Principals(),
        http=Http(max_http_body_bytes=1 << 20, max_http_body_bytes_total=1 << 22),
        limits=Limits(max_request_size=100, request_timeout_ms=5000),
    )

    async def gateway() -> Any:
        return head

    return TestClient(create_app(settings, gateway))


@pytest.fixture
def head() -> FakeHead:
    return FakeHead()


@pytest.fixture
def http(vocab: str, head: FakeHead) -> Iterator[TestClient]:
    with serve(two_models(vocab), head) as client:  # runs the lifespan: the gateway, then the catalog
        yield client


# -- routing -------------------------------------------------------------------------------------


def test_the_model_field_picks_the_model_and_every_request_names_it(http: TestClient, head: FakeHead) -> None:
    for asked, computed in ((None, "a"), ("a", "a"), ("b", "b")):
        answer = http.post("/v1/embeddings", json={"input": ["x", "y"], "model": asked, "encoding_format": "float"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == computed
        assert np.array(answer.json()["data"][0]["embedding"]).shape == (MODELS[computed]["output_dim"],)
        assert answer.json()["data"][1]["embedding"][0] == MODELS[computed]["fill"]
    assert http.post("/v1/embeddings", json={"input": "x", "model": "b"}).headers["x-model-version"] == "3"
    assert np.array(http.post("/embed", json={"inputs": ["x"], "model": "b"}).json()).shape == (1, 16)
    assert np.array(http.post("/embed", json={"inputs": ["x"]}).json()).shape == (1, 32)
    legacy = http.post("/encode", json={"id": 7, "texts": ["x"], "model": "b"}).json()
    assert legacy["id"] == 7 and np.array(legacy["result"]).shape == (1, 16)
    named = [header.get("model") for header in head.encodes()]
    assert named == ["a", "a", "b", "b", "b", "a", "b"]  # the default named too
    assert all("model" in header for command, header in head.sent if command == p.CONFIG)


def test_each_model_checks_with_its_own_dimension_prompts_and_tokenizer(http: TestClient) -> None:
    assert http.post("/v1/embeddings", json={"input": "x", "model": "a", "dimensions": 20}).status_code == 200
    over = http.post("/v1/embeddings", json={"input": "x", "model": "b", "dimensions": 20})
    assert over.status_code == 422 and "16 dimensions" in over.json()["error"]["message"]
    assert http.post("/embed", json={"inputs": "x", "model": "a", "prompt_name": "query"}).status_code == 200
    unknown = http.post("/embed", json={"inputs": "x", "model": "b", "prompt_name": "query"})
    assert unknown.status_code == 422 and "--prompt NAME=TEXT" in unknown.json()["error"]
    long = http.post("/embed", json={"inputs": NINE_WORDS, "model": "a"})
    assert long.status_code == 413 and "8 tokens the model 'a' takes" in long.json()["error"], long.text
    assert http.post("/embed", json={"inputs": NINE_WORDS, "model": "b"}).status_code == 200


def test_tokenize_uses_the_named_models_tokenizer_and_prompts(http: TestClient) -> None:
    def tokens(**body: Any) -> list[str]:
        answer = http.post("/tokenize", json={"inputs": NINE_WORDS, "truncate": True, **body})
        assert answer.status_code == 200, answer.text
        return [token["text"] for token in answer.json()[0]]

    assert len(tokens()) == len(tokens(model="a")) == 8
    assert len(tokens(model="b")) == 11
    assert tokens(model="a", prompt_name="query")[1:4] == ["what", "is", ":"]
    refused = http.post("/tokenize", json={"inputs": "x", "model": "b", "prompt_name": "query"})
    assert refused.status_code == 422 and refused.json()["error_type"] == "Validation"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"input": "x"}),
        ("/embed", {"inputs": "x"}),
        ("/tokenize", {"inputs": "x"}),
        ("/encode", {"texts": ["x"]}),
    ],
)
def test_an_unknown_model_is_404_listing_the_served_ones(
    http: TestClient, head: FakeHead, path: str, body: dict
) -> None:
    answer = http.post(path, json={**body, "model": "gpt-4"})
    assert answer.status_code == 404, answer.text
    error = answer.json()["error"]
    if path == "/v1/embeddings":
        assert {k: error[k] for k in ("type", "param", "code")} == {
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        error = error["message"]
    else:
        assert answer.json()["error_type" if path in ("/embed", "/tokenize") else "kind"] == "model_not_found"
    assert "'gpt-4'" in error and "'a', 'b'" in error
    assert not head.encodes(), "nothing is sent for a model not served"


def test_a_model_the_head_does_not_serve_is_404_too(vocab: str) -> None:
    assert STATUS_OF_KIND[p.UNKNOWN_MODEL] == 404
    head = FakeHead(refuse=["b"])
    with serve(two_models(vocab), head) as http:
        answer = http.post("/v1/embeddings", json={"input": "x", "model": "b"})
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found", answer.text
        assert "serves 'a'" in answer.json()["error"]["message"]
        assert http.post("/tokenize", json={"inputs": "x", "model": "b"}).status_code == 404


# -- /v1/models ----------------------------------------------------------------------------------


def test_v1_models_lists_every_model_the_default_first(vocab: str) -> None:
    head = FakeHead(default="b")
    with serve(two_models(vocab), head) as http:
        listed = http.get("/v1/models").json()
        assert http.post("/v1/embeddings", json={"input": "x"}).json()["model"] == "b"  # the head's default
    assert [entry["id"] for entry in listed["data"]] == ["b", "a"]
    about = {entry["id"]: entry for entry in listed["data"]}
    for name, model in MODELS.items():
        assert {key: about[name][key] for key in ("output_dim", "dtype", "model_version", "prompts")} == {
            key: model[key] for key in ("output_dim", "dtype", "model_version", "prompts")
        }
        assert about[name]["object"] == "model" and about[name]["owned_by"] == "bertserve"
        assert about[name]["default_prompt_name"] is None
    assert (about["a"]["max_seq_len"], about["b"]["max_seq_len"]) == (8, 16)


def test_one_model_keeps_its_aliases(vocab: str) -> None:
    head = FakeHead()
    with serve((ModelSettings("a", ("text-embedding-3-small",), tokenizer(vocab, 8)),), head) as http:
        listed = [entry["id"] for entry in http.get("/v1/models").json()["data"]]
        by_alias = http.post("/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"}).json()
        missing = http.post("/v1/embeddings", json={"input": "x", "model": "b"}).json()["error"]["message"]
    assert listed == ["a", "text-embedding-3-small"]
    assert by_alias["model"] == "text-embedding-3-small"  # echoed, as OpenAI echoes what it was asked
    assert head.encodes()[0]["model"] == "a"  # the head knows the model by its name
    assert "serves 'a', 'text-embedding-3-small'" in missing


# -- the catalog's answers -----------------------------------------------------------------------


def test_a_models_answer_is_asked_until_a_worker_reported_it_then_kept(vocab: str) -> None:
    async def run() -> None:
        head = FakeHead(ready=False)
        catalog = Catalog(two_models(vocab), head)  # type: ignore[arg-type]
        a, b = catalog.models
        assert catalog.last(a) is head.config and catalog.last(b) == {}
        assert (await catalog.said(b))["prompts"] == {} and len(head.sent) == 1
        assert (await catalog.said(b))["model_name"] == "b" and len(head.sent) == 1  # prompts: no worker needed
        assert "output_dim" not in await catalog.info(b) and len(head.sent) == 2
        head.ready = True
        assert (await catalog.info(b))["output_dim"] == 16 and len(head.sent) == 3
        assert (await catalog.info(b))["output_dim"] == 16 and len(head.sent) == 3
        assert [entry.get("model") for _, entry in head.sent] == ["b", "b", "b"]

    asyncio.run(run())
