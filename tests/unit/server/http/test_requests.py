"""The HTTP side of a request's options and its end, in process: the options checked against
the model (``server/http/options.py``), token ids refused unless taken, the gateway's ENCODE
header and its withdrawal (``CANCEL``) when its wait ends without an answer, and a caller's
disconnect cancelling the wait (``server/http/disconnects.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from bertserve.client import protocol as p
from bertserve.server.http.disconnects import ClientGone, disconnected, unless_disconnected
from bertserve.server.http.gateway import Gateway, GatewayError
from bertserve.server.http.options import Asked, asked, checked_dimensions, checked_prompt_name, prompt_text
from bertserve.server.http.schemas import EmbeddingRequest, EmbedRequest, HTTPError, openai_input
from bertserve.server.testing.launcher import free_ports

INFO = {"output_dim": 32, "prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}


# -- options -------------------------------------------------------------------------------------


def test_dimensions_outside_1_to_the_models_name_its_dimension() -> None:
    assert checked_dimensions(None, INFO) is None
    assert checked_dimensions(1, INFO) == 1 and checked_dimensions(32, INFO) == 32
    for k in (0, 33, -1):
        with pytest.raises(HTTPError) as raised:
            checked_dimensions(k, INFO)
        assert raised.value.status == 422 and raised.value.param == "dimensions"
        assert f"dimensions={k}" in raised.value.message and "32 dimensions" in raised.value.message


def test_an_unknown_prompt_lists_the_known_ones() -> None:
    assert checked_prompt_name("query", INFO) == "query" and checked_prompt_name(None, INFO) is None
    with pytest.raises(HTTPError, match="'passage', 'query'"):
        checked_prompt_name("search", INFO)
    with pytest.raises(HTTPError, match="--prompt NAME=TEXT"):
        checked_prompt_name("query", {"output_dim": 32})


def test_the_prompt_text_is_the_named_ones_else_the_defaults() -> None:
    assert prompt_text("passage", INFO) == "passage: "
    assert prompt_text(None, INFO) == ""
    assert prompt_text(None, {**INFO, "default_prompt_name": "query"}) == "query: "
    assert prompt_text(None, {**INFO, "default_prompt_name": "gone"}) == ""


def test_the_header_carries_the_deadline_and_only_the_options_asked_for() -> None:
    assert Asked().header(600.0) == {"timeout_ms": 600_000}
    body = EmbedRequest.model_validate({"inputs": "x", "dimensions": 8, "truncation_direction": "Left"})
    assert asked(body, INFO).header(0.25) == {"timeout_ms": 250, "dimensions": 8, "truncation_direction": "left"}
    openai_body = EmbeddingRequest.model_validate({"input": "x", "prompt_name": "query", "long_inputs": "chunk"})
    assert asked(openai_body, INFO).header(1.0) == {"timeout_ms": 1000, "long_inputs": "chunk", "prompt_name": "query"}


class _Vocabulary:
    def tokens_of(self, ids: list[int]) -> list[str]:
        return [f"t{i}" for i in ids]


@pytest.mark.parametrize("value", [[[15339, 1917]], [15339, 1917]])
def test_token_ids_are_refused_unless_taken(value: list) -> None:
    with pytest.raises(HTTPError) as raised:
        openai_input(value, _Vocabulary(), token_ids=False)
    assert raised.value.status == 422 and raised.value.param == "input"
    assert "check_embedding_ctx_length=False" in raised.value.message and "--token-id-input" in raised.value.message
    texts, is_tokenized = openai_input(value, _Vocabulary(), token_ids=True)
    assert texts == [["t15339", "t1917"]] and is_tokenized
    assert openai_input(["hello"], _Vocabulary(), token_ids=False) == (["hello"], False)
    with pytest.raises(HTTPError, match=r"input\[1\] is a str"):
        openai_input([[1, 2], "x"], _Vocabulary(), token_ids=False)


# -- the gateway's withdrawal --------------------------------------------------------------------


@pytest.fixture
def ventilator() -> Iterator[tuple[zmq.Socket, int, int]]:
    """A PULL socket where the ventilator would be, and a reply port nobody answers on."""
    port, port_out = free_ports(2)
    context = zmq.Context()
    pull, pub = context.socket(zmq.PULL), context.socket(zmq.PUB)
    pull.bind(f"tcp://127.0.0.1:{port}")
    pub.bind(f"tcp://127.0.0.1:{port_out}")
    try:
        yield pull, port, port_out
    finally:
        pull.close(linger=0)
        pub.close(linger=0)
        context.term()


def _next(pull: zmq.Socket) -> p.Request:
    assert pull.poll(5000), "nothing came"
    return p.decode_request(pull.recv_multipart())


def test_an_encode_whose_wait_runs_out_is_withdrawn(ventilator: tuple[zmq.Socket, int, int]) -> None:
    pull, port, port_out = ventilator

    async def run() -> None:
        gateway = Gateway("127.0.0.1", port, port_out)
        try:
            client = gateway.client_id("address:127.0.0.1")
            options = {"timeout_ms": 200, "dimensions": 8, "prompt_name": "query"}
            with pytest.raises(GatewayError, match="no answer"):
                await gateway.request(client, p.ENCODE, ["hello"], options=options, timeout_s=0.3)
            with pytest.raises(GatewayError):
                await gateway.request(client, p.STATUS, timeout_s=0.1)
        finally:
            await gateway.close()

    asyncio.run(run())
    encode = _next(pull)
    assert encode.command == p.ENCODE and encode.texts == ["hello"]
    assert {k: encode.header[k] for k in ("timeout_ms", "dimensions", "prompt_name")} == {
        "timeout_ms": 200,
        "dimensions": 8,
        "prompt_name": "query",
    }
    cancel = _next(pull)
    assert (cancel.command, cancel.client_id, cancel.request_id) == (p.CANCEL, encode.client_id, encode.request_id)
    assert _next(pull).command == p.STATUS
    assert not pull.poll(200), "a STATUS is never withdrawn"


def test_an_encode_whose_caller_left_is_withdrawn(ventilator: tuple[zmq.Socket, int, int]) -> None:
    pull, port, port_out = ventilator

    async def run() -> tuple[p.Request, p.Request]:
        gateway = Gateway("127.0.0.1", port, port_out)
        try:
            waiting = asyncio.ensure_future(
                gateway.request(gateway.client_id("key:alice"), p.ENCODE, ["a", "b"], timeout_s=30)
            )
            while not pull.poll(0):  # sent, and waiting for its answer
                await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            return _next(pull), _next(pull)
        finally:
            await gateway.close()

    encode, cancel = asyncio.run(run())
    assert encode.command == p.ENCODE and cancel.command == p.CANCEL
    assert (cancel.client_id, cancel.request_id) == (encode.client_id, encode.request_id)


# -- a caller's disconnect -------------------------------------------------------------------------


def test_a_disconnect_cancels_the_wait() -> None:
    async def run() -> None:
        gone = asyncio.Event()
        stopped: list[str] = []

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def work() -> str:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                stopped.append("cancelled")
                raise
            return "late"

        waiting = asyncio.ensure_future(unless_disconnected(work(), disconnected(receive)))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        gone.set()
        with pytest.raises(ClientGone):
            await asyncio.wait_for(waiting, 5)
        assert stopped == ["cancelled"]

    asyncio.run(run())


def test_work_that_ends_first_is_answered_and_the_watch_stops() -> None:
    async def run() -> None:
        watched: list[str] = []

        async def receive() -> dict[str, Any]:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                watched.append("stopped")
                raise
            return {"type": "http.disconnect"}

        async def work() -> str:
            await asyncio.sleep(0.01)
            return "vectors"

        assert await unless_disconnected(work(), disconnected(receive)) == "vectors"
        await asyncio.sleep(0)
        assert watched == ["stopped"]

        async def failing() -> str:
            raise GatewayError("no answer")

        with pytest.raises(GatewayError):
            await unless_disconnected(failing(), disconnected(receive))

    asyncio.run(run())
