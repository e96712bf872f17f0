"""A client of a server of several models: the ``model`` its requests name, checked before
anything is sent, the configuration of each model its options are checked against, and
:class:`UnknownModelError` for a name the server does not serve, on every client.

The clients talk to :class:`ModelResponder`, the protocol stand-in of ``tests/unit/client/test_client.py``
serving two models, which records every request it reads. Its "vectors" are as wide as the
model that computed them, and their last column is that model's number, so an answer tells
which model it came from.
"""

from __future__ import annotations

import asyncio
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bertserve.client import (
    AsyncBertClient,
    BertClient,
    ConcurrentBertClient,
    ServerError,
    UnknownModelError,
    protocol as p,
)
from unit.client.test_client import Responder, run_cli

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("no_leaked_contexts")]  # and close every socket

MODELS = {
    "fast": {"output_dim": 4, "prompts": {"query": "query: "}, "max_seq_len": 16},
    "big": {"output_dim": 8, "prompts": {"passage": "passage: "}, "max_seq_len": 64},
}
DEFAULT = "fast"


class ModelResponder(Responder):
    """The protocol stand-in, serving the models of ``models`` (the first is the default)
    as a server of several models answers: each model's CONFIG, ENCODE replies that say which
    model computed them, and an error of kind ``model`` for a name it does not serve."""

    def __init__(self, models: dict[str, dict[str, Any]]) -> None:
        self.models = {name: dict(config) for name, config in models.items()}
        self.default = next(iter(models))
        super().__init__()

    def _answer(self, request: p.Request) -> tuple[float, list[Any] | None]:
        cid, rid = request.client_id, request.request_id
        if request.command not in (p.ENCODE, p.CONFIG, p.RELOAD):
            return super()._answer(request)
        name = request.header.get("model", self.default)
        if name not in self.models:
            served = ", ".join(repr(model) for model in self.models)
            return 0, p.error_reply(cid, rid, f"this server serves no model {name!r}; it serves {served}", "model")
        if request.command == p.CONFIG:
            listed = [
                {"name": model, "output_dim": config["output_dim"], "prompts": sorted(config["prompts"]), "ready": True}
                for model, config in self.models.items()
            ]
            config = {**self.config, **self.models[name], "model_name": name, "default_model": self.default}
            return 0, p.encode_reply(cid, rid, True, {**config, "models": listed})
        if request.command == p.RELOAD:
            return 0, p.encode_reply(cid, rid, True, {"reload": 1, "model": name})
        number = list(self.models).index(name) + 1
        vectors = np.full((len(request.texts), self.models[name]["output_dim"]), number, np.float32)
        vectors[:, 0] = np.arange(len(request.texts))
        return 0, p.encode_reply(cid, rid, True, {**p.array_header(vectors), "model": name}, vectors.tobytes())

    def headers(self, command: bytes) -> list[dict[str, Any]]:
        return [request.header for request in self.commands(command)]

    def kwargs(self, **options: Any) -> dict[str, Any]:
        return {"host": "127.0.0.1", "port": self.port, "port_out": self.port_out, "timeout": 5000, **options}


@pytest.fixture
def server() -> Iterator[ModelResponder]:
    responder = ModelResponder(MODELS)
    yield responder
    responder.stop()


def _came_from(vectors: Any) -> tuple[int, str]:
    """The width of ``vectors`` and the model that computed them."""
    array = np.asarray(vectors)
    return array.shape[1], list(MODELS)[int(array[0, -1]) - 1]


# -- the name, on the wire -----------------------------------------------------------------


def test_a_request_names_a_model_only_when_asked_to(server: ModelResponder) -> None:
    with server.client() as bc:
        assert bc.model is None
        assert _came_from(bc.encode(["plain"])) == (4, "fast") and bc.last_info["model"] == "fast"
        assert _came_from(bc.encode(["elsewhere"], model="big")) == (8, "big")
    handshake, *_ = server.headers(p.CONFIG)
    plain, elsewhere = server.headers(p.ENCODE)
    assert "model" not in handshake and "model" not in plain  # the server's default decides
    assert elsewhere["model"] == "big"


def test_every_request_of_a_client_goes_to_its_model_unless_a_call_says_otherwise(server: ModelResponder) -> None:
    server.config["max_batch_size"] = 2  # show_progress: chunks of 8 texts
    with server.client(model="big") as bc:
        assert bc.model == "big"
        assert server.headers(p.CONFIG)[0]["model"] == "big"  # the handshake asks for the client's model
        assert _came_from(bc.encode(["one"])) == (8, "big") and bc.last_info["model"] == "big"
        assert _came_from(bc.encode(["two"], model="fast")) == (4, "fast") and bc.last_info["model"] == "fast"
        bc.encode(["three"], blocking=False, model="fast")
        bc.encode(["four"], blocking=False)
        assert [_came_from(vectors) for vectors in bc.fetch_all()] == [(4, "fast"), (8, "big")]
        assert [_came_from(v) for v in bc.encode_async([["five"], ["six"]], model="fast")] == [(4, "fast")] * 2
        assert _came_from(bc.encode([f"text {i}" for i in range(20)], show_progress=True, model="fast")) == (4, "fast")
        assert "requests" in bc.server_status
    named = [header["model"] for header in server.headers(p.ENCODE)]
    assert named == ["big", "fast", "fast", "big", "fast", "fast", "fast", "fast", "fast"]
    assert "model" not in server.headers(p.STATUS)[0]  # the status covers every model


def test_reload_names_the_clients_model_or_the_one_given(server: ModelResponder) -> None:
    with server.client() as bc:
        assert bc.reload() == {"reload": 1, "model": "fast"}
    with server.client(model="big") as bc:
        assert bc.reload(3)["model"] == "big"
        assert bc.reload(model="fast")["model"] == "fast"
    unnamed, big, fast = server.headers(p.RELOAD)
    assert "model" not in unnamed and unnamed["version"] == "latest"
    assert (big["model"], big["version"], fast["model"]) == ("big", "3", "fast")


# -- names checked at the edge -----------------------------------------------------------

BAD_NAMES = [
    (3, TypeError, "model must be a string or None, not int"),
    (b"big", TypeError, "model must be a string or None, not bytes"),
    ("", ValueError, "model '' is not a model name"),
    ("-big", ValueError, "starting with a letter or digit"),
    ("two words", ValueError, "model 'two words' is not a model name"),
    ("x" * 129, ValueError, "at most 128 characters"),
    ("bïg", ValueError, re.escape(p.MODEL_NAME_PATTERN)),  # the message gives the pattern
]


@pytest.mark.parametrize(("name", "error", "message"), BAD_NAMES)
def test_a_bad_name_fails_before_anything_is_sent(
    server: ModelResponder, name: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        BertClient(**server.kwargs(model=name))
    with pytest.raises(error, match=message):
        ConcurrentBertClient(**server.kwargs(model=name))
    with pytest.raises(error, match=message):
        AsyncBertClient(**server.kwargs(model=name))
    assert not server.requests  # none of them connected
    with server.client() as bc:
        with pytest.raises(error, match=message):
            bc.encode(["hello"], model=name)
        with pytest.raises(error, match=message):
            bc.encode(["hello"], blocking=False, model=name)
        with pytest.raises(error, match=message):
            next(bc.encode_async([["hello"]], model=name))
        with pytest.raises(error, match=message):
            bc.server_config_of(name)
        with pytest.raises(error, match=message):
            bc.reload(model=name)
    with ConcurrentBertClient(max_concurrency=1, **server.kwargs()) as pool:
        with pytest.raises(error, match=message):
            pool.encode(["hello"], model=name)
        with pytest.raises(error, match=message):
            pool.server_config_of(name)

    async def main() -> None:
        async with AsyncBertClient(**server.kwargs()) as client:
            with pytest.raises(error, match=message):
                await client.encode(["hello"], model=name)
            with pytest.raises(error, match=message):
                await client.server_config_of(name)
            with pytest.raises(error, match=message):
                await client.reload(model=name)

    asyncio.run(main())
    # Only the handshakes of the two clients that connected (each CONFIG resent until answered).
    assert all(request.command == p.CONFIG and "model" not in request.header for request in server.requests)


def test_names_the_pattern_allows_are_sent_as_they_are(server: ModelResponder) -> None:
    odd = "org/model-v1.2:latest" + "x" * 107  # 128 characters, every kind the pattern allows
    server.models[odd] = MODELS["big"]
    with server.client(model=odd) as bc:
        assert bc.encode(["one"]).shape == (1, 8)
    assert server.headers(p.ENCODE)[0]["model"] == odd


# -- each model's configuration ------------------------------------------------------------


def test_options_are_checked_against_the_model_the_request_goes_to(server: ModelResponder) -> None:
    with server.client() as bc:
        assert bc.encode(["doc"], dimensions=8, prompt_name="passage", model="big").shape == (1, 8)
        with pytest.raises(ValueError, match="dimensions=8 is more than the model's 4 dimensions"):
            bc.encode(["doc"], dimensions=8)
        with pytest.raises(ValueError, match="unknown prompt_name 'passage': the server's prompts are 'query'"):
            bc.encode(["doc"], prompt_name="passage")
        with pytest.raises(ValueError, match="dimensions=9 is more than the 8 dimensions of model 'big'"):
            bc.encode(["doc"], dimensions=9, model="big")
        with pytest.raises(ValueError, match="unknown prompt_name 'query': the prompts of model 'big' are 'passage'"):
            next(bc.encode_async([["doc"]], prompt_name="query", model="big"))
        assert bc.encode([], model="big").shape == (0, 8)  # an empty input takes its model's width
        assert bc.encode([]).shape == (0, 4)
    with server.client(model="big") as bc:
        bc.encode(["doc"], dimensions=8, prompt_name="passage")
        with pytest.raises(ValueError, match="the 4 dimensions of model 'fast'"):
            bc.encode(["doc"], dimensions=8, model="fast")
    assert [(h["dimensions"], h["model"]) for h in server.headers(p.ENCODE)] == [(8, "big"), (8, "big")]


def test_each_models_config_is_asked_for_once_and_kept(server: ModelResponder) -> None:
    with server.client() as bc:
        for _ in range(3):
            bc.encode(["one"], model="big")
            bc.encode(["two"])
        assert [h.get("model") for h in server.headers(p.CONFIG)].count("big") == 1
        server.models["big"]["prompts"] = {"query": "q: "}  # the server changed: asking again shows it
        config = bc.server_config_of("big")
        assert config["model_name"] == "big" and config["output_dim"] == 8 and config["default_model"] == "fast"
        bc.encode(["three"], prompt_name="query", model="big")  # checked against what was asked last
        assert [model["name"] for model in bc.server_config["models"]] == ["fast", "big"]
        assert bc.server_config["model_name"] == "fast"
    with server.client(model="big") as bc:
        assert bc.server_config["model_name"] == "big"
        assert bc.server_config_of(None)["model_name"] == "fast"  # None: the server's default


def test_a_length_warning_counts_against_the_models_max_seq_len(server: ModelResponder) -> None:
    text = " ".join(["word"] * 20)  # over fast's 16, within big's 64
    with server.client() as bc:
        with pytest.warns(UserWarning, match="max_seq_len=16"):
            bc.encode([text])
        with pytest.warns(UserWarning, match="max_seq_len=16"):
            list(bc.encode_async([[text]]))
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            bc.encode([text], model="big")
            list(bc.encode_async([[text]], model="big"))
    with server.client(model="big") as bc, warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        bc.encode([text])
        list(bc.encode_async([[text]]))


# -- a model the server does not serve --------------------------------------------------------


def test_a_model_the_server_does_not_serve_raises_unknown_model_error(server: ModelResponder) -> None:
    served = "this server serves no model 'nope'; it serves 'fast', 'big'"
    with pytest.raises(UnknownModelError, match=served) as info:
        BertClient(**server.kwargs(model="nope"))  # its own model: at once, on connecting
    assert isinstance(info.value, ServerError) and info.value.kind == "model" and info.value.message == served
    with server.client() as bc:
        with pytest.raises(UnknownModelError, match=served):
            bc.encode(["hello"], model="nope")  # its config is asked for first: no ENCODE goes out
        with pytest.raises(UnknownModelError, match=served):
            bc.server_config_of("nope")
        with pytest.raises(UnknownModelError, match=served):
            bc.reload(model="nope")
        assert not server.commands(p.ENCODE)
        bc.encode(["hello"], model="big")
        del server.models["big"]  # gone since its config was kept: the ENCODE reply says so
        with pytest.raises(UnknownModelError, match="serves no model 'big'; it serves 'fast'"):
            bc.encode(["hello"], model="big")
        assert _came_from(bc.encode(["still fine"])) == (4, "fast")


def test_the_pool_sends_its_model_and_each_calls(server: ModelResponder) -> None:
    with ConcurrentBertClient(max_concurrency=1, **server.kwargs(model="big")) as pool:
        assert pool.model == "big"
        assert _came_from(pool.encode(["one"])) == (8, "big")
        assert _came_from(pool.encode(["two"], model="fast", dimensions=4)) == (4, "fast")
        with pytest.raises(ValueError, match="the 4 dimensions of model 'fast'"):
            pool.encode(["three"], model="fast", dimensions=8)
        assert pool.server_config["model_name"] == "big"
        assert pool.server_config_of("fast")["output_dim"] == 4
        with pytest.raises(UnknownModelError, match="it serves 'fast', 'big'"):
            pool.encode(["four"], model="nope")
        assert _came_from(pool.encode(["five"])) == (8, "big")  # the pooled client was kept
    assert [h["model"] for h in server.headers(p.ENCODE)] == ["big", "fast", "big"]
    with ConcurrentBertClient(**server.kwargs(model="nope")) as pool, pytest.raises(UnknownModelError):
        pool.encode(["hello"])


def test_the_async_client_sends_its_model_and_each_calls(server: ModelResponder) -> None:
    async def main() -> None:
        async with AsyncBertClient(**server.kwargs(model="big")) as client:
            assert server.headers(p.CONFIG)[0]["model"] == "big"
            assert _came_from(await client.encode(["one"])) == (8, "big")
            assert _came_from(await client.encode(["two"], model="fast")) == (4, "fast")
            answers = await asyncio.gather(*(client.encode([f"t{i}"], model=("fast", "big")[i % 2]) for i in range(4)))
            assert [_came_from(vectors) for vectors in answers] == [(4, "fast"), (8, "big")] * 2
            assert (await client.encode(["three"], dimensions=8, prompt_name="passage")).shape == (1, 8)
            with pytest.raises(ValueError, match="the 4 dimensions of model 'fast'"):
                await client.encode(["four"], dimensions=8, model="fast")
            with pytest.raises(ValueError, match="the prompts of model 'fast' are 'query'"):
                await client.encode(["four"], prompt_name="passage", model="fast")
            assert (await client.encode([], model="fast")).shape == (0, 4)
            assert (await client.server_config())["model_name"] == "big"
            assert (await client.server_config_of("fast"))["output_dim"] == 4
            assert (await client.reload())["model"] == "big"
            assert (await client.reload(model="fast"))["model"] == "fast"
            with pytest.raises(UnknownModelError, match="it serves 'fast', 'big'") as info:
                await client.encode(["five"], model="nope")
            assert info.value.kind == "model"
            assert "requests" in await client.server_status()
            assert "model" not in server.headers(p.STATUS)[-1]
        with pytest.raises(UnknownModelError, match="serves no model 'nope'"):
            async with AsyncBertClient(**server.kwargs(model="nope")):
                pass
        async with AsyncBertClient(**server.kwargs()) as client:
            assert _came_from(await client.encode(["plain"])) == (4, "fast")

    asyncio.run(main())
    named = [h.get("model") for h in server.headers(p.ENCODE)]
    assert named == ["big", "fast", "fast", "big", "fast", "big", "big", None]
    assert [h.get("model") for h in server.headers(p.CONFIG)].count("fast") == 2  # kept, then asked afresh


def test_the_command_line_encodes_with_the_model_named(
    server: ModelResponder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "in.txt", tmp_path / "out.npy"
    source.write_text("one\ntwo words\n", encoding="utf-8")
    ports = ["--host", "127.0.0.1", "--port", str(server.port), "--port-out", str(server.port_out)]
    assert run_cli("encode", str(source), "-o", str(out), "--model", "big", *ports) == 0
    assert _came_from(np.load(out)) == (8, "big")
    assert run_cli("encode", str(source), "-o", str(out), *ports) == 0
    assert _came_from(np.load(out)) == (4, "fast")
    assert [h.get("model") for h in server.headers(p.ENCODE)] == ["big", None]
    capsys.readouterr()
    assert run_cli("encode", str(source), "-o", str(out), "--model", "nope", *ports) == 1
    assert "this server serves no model 'nope'; it serves 'fast', 'big'" in capsys.readouterr().err
    assert run_cli("encode", str(source), "-o", str(out), "--model", "no pe", *ports) == 1
    assert "is not a model name" in capsys.readouterr().err
