"""``encode(show_progress=True)`` against a real server serving ``HashingModel``: the same
answer as one request, in the same order, with a bar that moves; and the reply port that
defaults to the request port + 1, for the server, the clients and the commands.

The server is started through ``bertserve start --port P`` alone, with ``--max-batch-size 16``
so that a chunk is 64 texts and 1000 texts make 16 chunks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from bertserve.client import AsyncBertClient, BertClient, ConcurrentBertClient, ServerError, protocol as p
from bertserve.client.core.chunking import ASYNC_WINDOW
from bertserve.client.sync.connection import Connection
from bertserve.server.cli import main as cli
from bertserve.server.testing.launcher import RunningServer, start_server
from faulty_model import sentences

pytestmark = pytest.mark.timeout(120)

HASHING = "bertserve.server.model.interface:HashingModel"
CHUNK = 4 * 16  # four mini-jobs of --max-batch-size


@pytest.fixture(scope="module")
def server(tiny_google: str) -> Iterator[RunningServer]:
    running = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        HASHING,
        "--max-seq-len",
        "32",
        "--max-batch-size",
        "16",
        "--max-text-chars",
        "400",
        pass_port_out=False,
    )
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """For each ENCODE request a client sends, how many of its requests were already in flight."""
    in_flight: list[int] = []
    send = Connection.request

    def spy(self: Connection, command: bytes, *args: Any, **kwargs: Any) -> int:
        if command == p.ENCODE:
            in_flight.append(len(self.transport.pending))
        return send(self, command, *args, **kwargs)

    monkeypatch.setattr(Connection, "request", spy)
    return in_flight


def test_progress_gives_the_answer_of_one_request(
    server: RunningServer, sent: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    texts = sentences(1000)
    with BertClient(port=server.port, timeout=20_000) as bc:
        assert bc.port_out == server.port + 1
        whole, whole_tokens = bc.encode(texts, show_tokens=True)
        assert sent == [0] and capsys.readouterr().err == ""
        sent.clear()
        piped, piped_tokens = bc.encode(texts, show_tokens=True, show_progress=True)
        np.testing.assert_array_equal(piped, whole)
        assert piped.dtype == whole.dtype and piped_tokens == whole_tokens and len(piped_tokens) == 1000
        assert len(sent) == 16 and max(sent) == ASYNC_WINDOW - 1  # four in flight
        bar = capsys.readouterr().err
        assert "encoding: 100%" in bar and "1000/1000" in bar

        np.testing.assert_array_equal(bc.encode(texts[:CHUNK], show_progress=True), whole[:CHUNK])
        assert capsys.readouterr().err == ""  # one chunk: one request, no bar
        assert bc.encode(texts[: CHUNK + 1], show_progress=True).shape == (CHUNK + 1, 16)
        assert f"{CHUNK + 1}/{CHUNK + 1}" in capsys.readouterr().err

    with BertClient(port=server.port, timeout=20_000, output_fmt="list") as bc:
        assert bc.encode(texts, show_progress=True) == whole.tolist()
    with ConcurrentBertClient(port=server.port, timeout=20_000) as pool:
        np.testing.assert_array_equal(pool.encode(texts, show_progress=True), whole)
    assert "1000/1000" in capsys.readouterr().err


def test_a_failing_chunk_raises_what_one_request_raises(server: RunningServer) -> None:
    texts = sentences(600)
    texts[500] = "long " * 100  # over --max-text-chars, in the eighth chunk
    with BertClient(port=server.port, timeout=20_000, check_length=False) as bc:
        with pytest.raises(ServerError) as whole:
            bc.encode(texts)
        with pytest.raises(ServerError) as piped:
            bc.encode(texts, show_progress=True)
        assert type(piped.value) is type(whole.value) and piped.value.kind == whole.value.kind == "limit"
        assert str(piped.value) == str(whole.value) == "texts[500] has 500 characters; this server takes at most 400"
        assert not bc._connection.transport.pending  # the chunks still in flight were given up
        assert bc.encode(texts[:10], show_progress=True).shape == (10, 16)  # and the client still works


def test_the_commands_find_the_reply_port(server: RunningServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--port", str(server.port), "--host", "127.0.0.1", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["requests_received"] >= 1
    assert f"results on port {server.port + 1}" in (server.ready_line or "")


@pytest.fixture(scope="module")
def small_requests(tiny_google: str) -> Iterator[RunningServer]:
    running = start_server(
        "--model-dir", tiny_google, "--model-class", HASHING, "--max-seq-len", "32", "--max-request-size", "100"
    )
    try:
        yield running
    finally:
        running.stop()


def test_an_input_past_the_servers_request_size_is_split_in_order(
    small_requests: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past ``max_request_size`` the server refuses one request; the clients send several and
    join them in order, with a bar only when asked for, and an error names its text's place
    in the whole input."""
    texts = sentences(350)
    with BertClient(**small_requests.client_kwargs, timeout=20_000) as bc:
        ones = np.concatenate([bc.encode(texts[i : i + 100]) for i in range(0, 350, 100)])
        capsys.readouterr()
        np.testing.assert_array_equal(bc.encode(texts), ones)
        assert capsys.readouterr().err == ""  # no bar unless asked for
        np.testing.assert_array_equal(bc.encode(texts, show_progress=True), ones)
        assert "350/350" in capsys.readouterr().err
        _, tokens = bc.encode(texts, show_tokens=True)
        assert len(tokens) == 350 and tokens[349] == bc.encode(texts[349:], show_tokens=True)[1][0]
        bad = [*texts[:250], "", *texts[251:]]
        with pytest.raises(ValueError, match=r"texts\[250\] is empty"):
            bc.encode(bad)

    async def in_asyncio() -> np.ndarray:
        async with AsyncBertClient(**small_requests.client_kwargs, timeout=20_000) as client:
            return await client.encode(texts)

    np.testing.assert_array_equal(asyncio.run(in_asyncio()), ones)
