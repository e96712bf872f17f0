"""The HTTP front end's bounds, in process: bodies that GETs and open paths may not have,
the body's pace and its principal's share, the pieces long texts are tokenized in, and the
options that reach uvicorn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from bertserve.server.config.server import ServerConfig
from bertserve.server.errors import ConfigError
from bertserve.server.http.bodies import BodyBudget, BodyPace
from bertserve.server.http.front import Front
from bertserve.server.http.lengths import count_up_to, first_over_long, pieces, tokens_answered
from bertserve.server.http.principals import Principal, Principals
from bertserve.server.http.process import _edge_options
from bertserve.server.http.schemas import HTTPError, quoted
from bertserve.server.model.tokenization import WordPieceTokenizer
from bertserve.server.testing.config import server_config
from bertserve.server.testing.tiny_bert import tiny_vocab
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

KEYS = Principals([Principal.of("alice", "alice-key-0123"), Principal.of("bob", "bob-key-01234")])


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"bytes": len(await request.body())})


def _front(budget: BodyBudget, pace: BodyPace | None = None) -> Front:
    inner = Starlette(
        routes=[Route("/v1/embeddings", _echo, methods=["POST"]), Route("/health", _echo), Route("/status", _echo)]
    )
    return Front(inner, KEYS, 64 * 1024, budget, pace=pace, max_headers=20)


def _client(front: Front, key: str | None = "alice-key-0123") -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://test", headers=headers)


def test_gets_and_open_paths_take_no_body_and_hold_nothing() -> None:
    async def run() -> None:
        budget = BodyBudget(100 * 1024)
        async with _client(_front(budget), key=None) as anyone, _client(_front(budget)) as alice:
            assert (await anyone.request("GET", "/health", content=b"x" * 1000)).status_code == 413
            assert (await anyone.post("/health", content=b"x" * 1000)).status_code == 413
            assert (await alice.request("GET", "/status", content=b"x")).status_code == 413
            assert (await anyone.get("/health")).status_code == 200
            many = {f"x-{i}": "1" for i in range(21)}
            assert (await alice.get("/status", headers=many)).status_code == 431
        assert budget.in_use == 0

    asyncio.run(run())


def test_a_slow_body_is_cut_off_with_408_and_gives_its_share_back() -> None:
    async def run() -> None:
        budget = BodyBudget(100 * 1024)
        stalled = asyncio.Event()

        async def trickle() -> AsyncIterator[bytes]:
            yield b'{"input": "' + b"a" * 1000
            await stalled.wait()
            yield b'"}'

        async with _client(_front(budget, BodyPace(timeout_s=5, min_rate=10_000, grace_s=0.1))) as http:
            reply = await http.post("/v1/embeddings", content=trickle())
        stalled.set()
        assert reply.status_code == 408 and "not whole in time" in reply.text
        assert reply.headers["connection"] == "close" and budget.in_use == 0

    asyncio.run(run())


def test_one_principal_holds_at_most_its_share() -> None:
    budget = BodyBudget(1000, per_principal=500)
    assert budget.take(500, "alice") and not budget.take(1, "alice")
    assert budget.take(400, "bob") and not budget.take(101, "bob") and budget.in_use == 900
    budget.give(500, "alice")
    assert budget.held_by("alice") == 0 and budget.take(100, "bob")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> WordPieceTokenizer:
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(tiny_vocab()) + "\n")
    return WordPieceTokenizer(vocab_path=str(vocab), tokenizer_json=None, do_lower_case=True, max_len=16)


def test_long_texts_are_counted_in_pieces_cut_after_spaces() -> None:
    text = "word " * 3000
    spans = list(pieces(text, 100))
    assert "".join(text[a:b] for a, b in spans) == text
    assert all(b - a <= 100 and text[b - 1] == " " for a, b in spans[:-1])
    assert [b - a for a, b in pieces("." * 250, 100)] == [100, 100, 50]


def test_over_long_texts_are_found_as_the_whole_text_would_say(tokenizer: WordPieceTokenizer) -> None:
    texts = ["the quick brown fox", "the " * 14, "the " * 15, "the " * 5000 + "|||", "." * 100_000, "fox ||| dog"]
    expected = [bool(cut) for cut in tokenizer.truncated(texts[:3])]
    assert expected == [False, False, True]
    assert first_over_long(tokenizer, texts[:2]) is None and first_over_long(tokenizer, texts) == 2
    assert first_over_long(tokenizer, [texts[0], texts[4]]) == 1
    assert count_up_to(tokenizer, ["." * 100_000], 16) <= 16 + 4096  # stopped within a piece past the length
    with pytest.raises(HTTPError, match="more than 100 tokens"):
        tokens_answered(tokenizer, ["the " * 200], add_special_tokens=True, truncate=False, most=100)
    tokens_answered(tokenizer, ["the " * 200] * 6, add_special_tokens=True, truncate=True, most=100)


def test_errors_quote_a_bounded_prefix() -> None:
    assert len(quoted("x" * 1_000_000)) < 150
    assert len(HTTPError(422, "y" * 1_000_000, param="z" * 10_000).message) < 2100


def test_forwarded_headers_are_believed_only_from_the_proxies_listed(tmp_path: Path) -> None:
    config = server_config(str(tmp_path))
    options = _edge_options(config)
    assert options["proxy_headers"] is False and options["forwarded_allow_ips"] == []
    assert options["h11_max_incomplete_event_size"] == 16 * 1024
    behind = server_config(str(tmp_path), forwarded_allow_ips=("10.0.0.1, 10.1.0.0/16",))
    assert behind.http.forwarded_allow_ips == ("10.0.0.1", "10.1.0.0/16") and _edge_options(behind)["proxy_headers"]
    with pytest.raises(ConfigError, match="forwarded-allow-ips"):
        server_config(str(tmp_path), forwarded_allow_ips=("proxy.example",))


def test_cors_origins_are_origins_or_a_star(tmp_path: Path) -> None:
    def config(*origins: str) -> ServerConfig:
        return server_config(str(tmp_path), cors_allow_origin=origins)

    given = config("https://app.example.com, http://localhost:3000", "https://app.example.com", "*")
    assert given.http.cors_allow_origin == ("https://app.example.com", "http://localhost:3000", "*")
    for bad in (
        "app.example.com",
        "https://app.example.com/",
        "https://app.example.com/path",
        "ftp://x.org",
        "https://x.org:99999",
        "https://",
        "https://x.org?q=1",
    ):
        with pytest.raises(ConfigError, match="--cors-allow-origin takes an origin"):
            config(bad)
