"""The request options of ``encode`` (``dimensions``, ``prompt_name``, ``truncation_direction``,
``long_inputs``) and the deadline every ENCODE carries: checked at the edge, before anything is
sent, and written into the ENCODE header only when given, on every client.

The clients talk to the protocol stand-in of ``tests/unit/client/test_client.py``, which records
every request it reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from bertserve.client import AsyncBertClient, ConcurrentBertClient, protocol as p
from bertserve.client.core.options import EncodeOptions
from unit.client.test_client import Responder

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("no_leaked_contexts")]  # and close every socket

PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture
def responder() -> Iterator[Responder]:
    r = Responder(config={"output_dim": 4, "prompts": PROMPTS, "default_prompt_name": None})
    yield r
    r.stop()


# -- EncodeOptions on its own ------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"dimensions": True}, TypeError, "dimensions must be an int, not bool"),
        ({"dimensions": 2.0}, TypeError, "dimensions must be an int, not float"),
        ({"dimensions": "8"}, TypeError, "dimensions must be an int, not str"),
        ({"dimensions": 0}, ValueError, "dimensions must be at least 1, not 0"),
        ({"dimensions": -3}, ValueError, "at least 1"),
        ({"prompt_name": 3}, TypeError, "prompt_name must be a string, not int"),
        ({"prompt_name": ""}, ValueError, "prompt_name must not be empty"),
        ({"prompt_name": "query", "is_tokenized": True}, ValueError, "prompt_name needs text inputs"),
        ({"truncation_direction": "up"}, ValueError, "truncation_direction must be 'right' or 'left', not 'up'"),
        ({"truncation_direction": 1}, TypeError, "truncation_direction must be a string, not int"),
        ({"long_inputs": "window"}, ValueError, "long_inputs must be None, 'truncate' or 'chunk'"),
        ({"is_tokenized": 1}, TypeError, "is_tokenized must be True or False"),
        ({"show_tokens": "yes"}, TypeError, "show_tokens must be True or False"),
    ],
)
def test_bad_options_are_named(options: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        EncodeOptions(**options)


def test_options_are_checked_against_what_the_server_says() -> None:
    config = {"output_dim": 32, "prompts": PROMPTS}
    EncodeOptions(dimensions=32, prompt_name="query").check_server(config)
    with pytest.raises(ValueError, match="dimensions=33 is more than the model's 32 dimensions: ask for 1 to 32"):
        EncodeOptions(dimensions=33).check_server(config)
    with pytest.raises(ValueError, match="unknown prompt_name 'doc': the server's prompts are 'passage', 'query'"):
        EncodeOptions(prompt_name="doc").check_server(config)
    with pytest.raises(ValueError, match="the server has no prompts"):
        EncodeOptions(prompt_name="doc").check_server({"prompts": {}})
    EncodeOptions(dimensions=10_000, prompt_name="doc").check_server({})  # a server that does not say decides


def test_the_header_carries_the_deadline_and_only_the_options_given() -> None:
    assert EncodeOptions().header(1500.2) == {"is_tokenized": False, "show_tokens": False, "timeout_ms": 1501}
    assert EncodeOptions().header(0.0)["timeout_ms"] == 1  # the server takes a number > 0
    full = EncodeOptions(
        is_tokenized=False,
        show_tokens=True,
        long_inputs="chunk",
        dimensions=8,
        prompt_name="query",
        truncation_direction="left",
        task="multivector",
        normalize=False,
        is_query=True,
    ).header(60_000)
    outputs = EncodeOptions(outputs=("embed", "sparse")).header(1)["outputs"]
    assert full == {
        "is_tokenized": False,
        "show_tokens": True,
        "timeout_ms": 60_000,
        "long_inputs": "chunk",
        "dimensions": 8,
        "prompt_name": "query",
        "truncation_direction": "left",
        "task": "multivector",
        "normalize": False,
        "is_query": True,
    }
    assert set(full) - {"is_tokenized", "show_tokens"} | {"outputs"} == set(p.ENCODE_OPTIONS)  # the protocol's names
    assert outputs == ("embed", "sparse")  # a request asks a task or outputs, not both


# -- through the clients -----------------------------------------------------------------


def _encode_headers(r: Responder) -> list[dict[str, Any]]:
    return [request.header for request in r.commands(p.ENCODE)]


def test_bert_client_sends_the_options_and_its_deadline(responder: Responder) -> None:
    with responder.client(timeout=4000) as bc:
        bc.encode(["plain"])
        bc.encode(["options"], dimensions=2, prompt_name="query", truncation_direction="left", long_inputs="chunk")
        bc.encode(["later"], blocking=False, dimensions=3)
        list(bc.fetch())
        assert list(bc.encode_async([["one"], ["two"]], dimensions=1, truncation_direction="right"))
    plain, options, later, *batches = _encode_headers(responder)
    assert not {"dimensions", "prompt_name", "truncation_direction", "long_inputs"} & set(plain)
    assert 3900 <= plain["timeout_ms"] <= 4000  # what was left of the client's wait when it was sent
    assert (options["dimensions"], options["prompt_name"], options["truncation_direction"]) == (2, "query", "left")
    assert options["long_inputs"] == "chunk" and later["dimensions"] == 3
    assert [(b["dimensions"], b["truncation_direction"]) for b in batches] == [(1, "right"), (1, "right")]


def test_every_chunk_of_a_progress_request_carries_the_options(responder: Responder) -> None:
    responder.config["max_batch_size"] = 2  # chunks of 8 texts
    with responder.client() as bc:
        vectors = bc.encode([f"text {i}" for i in range(20)], show_progress=True, dimensions=4, prompt_name="passage")
    assert vectors.shape == (20, 4)
    headers = _encode_headers(responder)
    assert len(headers) == 3 and all(h["dimensions"] == 4 and h["prompt_name"] == "passage" for h in headers)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"dimensions": 5}, ValueError, "more than the model's 4 dimensions"),
        ({"dimensions": True}, TypeError, "dimensions must be an int"),
        ({"prompt_name": "doc"}, ValueError, "the server's prompts are 'passage', 'query'"),
        ({"truncation_direction": "middle"}, ValueError, "truncation_direction"),
        ({"normalise": True}, TypeError, r"encode(_async)?\(\) got an unexpected keyword argument 'normalise'"),
    ],
)
def test_bad_options_fail_before_anything_is_sent(
    responder: Responder, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with responder.client() as bc:
        with pytest.raises(error, match=message):
            bc.encode(["hello"], **options)
        with pytest.raises(error, match=message):
            bc.encode(["hello"], blocking=False, **options)
        with pytest.raises(error, match=message):
            next(bc.encode_async([["hello"]], **options))
    kwargs = {"host": "127.0.0.1", "port": responder.port, "port_out": responder.port_out}
    with ConcurrentBertClient(max_concurrency=1, **kwargs) as pool, pytest.raises(error, match=message):
        pool.encode(["hello"], **options)

    async def main() -> None:
        async with AsyncBertClient("127.0.0.1", responder.port, responder.port_out, timeout=5000) as client:
            with pytest.raises(error, match=message):
                await client.encode(["hello"], **options)

    asyncio.run(main())
    assert not responder.commands(p.ENCODE)


@pytest.mark.parametrize(
    ("method", "args", "unknown"),
    [
        ("encode", (["hello"],), "normalise"),
        ("rerank", ("query", ["doc"]), "raw_score"),
        ("predict", (["hello"],), "top_k"),
        ("encode_sparse", (["hello"],), "pairs"),
    ],
)
def test_an_unknown_keyword_is_a_type_error_naming_it(
    responder: Responder, method: str, args: tuple[Any, ...], unknown: str
) -> None:
    said = rf"BertClient\.{method}\(\) got an unexpected keyword argument '{unknown}'$"
    with responder.client() as bc, pytest.raises(TypeError, match=f"^{said}"):
        getattr(bc, method)(*args, **{unknown: True})

    async def main() -> None:
        async with AsyncBertClient("127.0.0.1", responder.port, responder.port_out, timeout=5000) as client:
            with pytest.raises(TypeError, match=f"^Async{said}"):
                await getattr(client, method)(*args, **{unknown: True})

    asyncio.run(main())
    assert not responder.commands(p.ENCODE)


def test_the_pool_and_the_async_client_send_the_options(responder: Responder) -> None:
    kwargs = {"host": "127.0.0.1", "port": responder.port, "port_out": responder.port_out, "timeout": 3000}
    with ConcurrentBertClient(max_concurrency=1, **kwargs) as pool:
        pool.encode(["pooled"], dimensions=2, prompt_name="query")

    async def main() -> None:
        async with AsyncBertClient("127.0.0.1", responder.port, responder.port_out, timeout=3000) as client:
            await client.encode(["async"], dimensions=3, truncation_direction="left")
            await client.encode(["plain"])

    asyncio.run(main())
    pooled, from_async, plain = _encode_headers(responder)
    assert (pooled["dimensions"], pooled["prompt_name"]) == (2, "query")
    assert (from_async["dimensions"], from_async["truncation_direction"]) == (3, "left")
    assert "dimensions" not in plain and 2900 <= plain["timeout_ms"] <= 3000


def test_an_empty_input_is_answered_at_the_width_asked_for(responder: Responder) -> None:
    with responder.client() as bc:
        assert bc.encode([], dimensions=2).shape == (0, 2)
        assert bc.encode([]).shape == (0, 4)
    assert not responder.commands(p.ENCODE)
