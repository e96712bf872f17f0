"""What every HTTP request passes first (``server/http/front.py``'s ``Front``), in process:
the API key and its principal, the body limit, and the budget of bodies held at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from bertserve.server.http.bodies import COMMA_COST, OBJECT_COST, BodyBudget
from bertserve.server.http.front import Front, caller
from bertserve.server.http.principals import Principal, Principals
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

LIMIT = 64 * 1024
TOTAL = 100 * 1024
KEYS = Principals([Principal.of("alice", "alice-key-0123"), Principal.of("bob", "bob-key-01234")])


async def _echo(request: Request) -> JSONResponse:
    body = await request.body()
    user = json.loads(body).get("user") if body.startswith(b"{") else None
    return JSONResponse({"caller": caller(request), "bytes": len(body), "user": user})


def _front(principals: Principals = KEYS) -> tuple[Front, BodyBudget]:
    budget = BodyBudget(TOTAL)
    inner = Starlette(routes=[Route("/v1/embeddings", _echo, methods=["POST"]), Route("/health", _echo)])
    return Front(inner, principals, LIMIT, budget), budget


def _client(front: Front, key: str | None = "alice-key-0123") -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://test", headers=headers)


def test_the_caller_is_the_keys_principal_whatever_the_user_field_says() -> None:
    async def run() -> None:
        front, _ = _front()
        async with _client(front) as alice, _client(front, "bob-key-01234") as bob:
            for user in (None, "bob", "someone"):
                reply = await alice.post("/v1/embeddings", json={"input": "x", "user": user})
                assert reply.json()["caller"] == "key:alice", reply.text
            assert (await bob.post("/v1/embeddings", json={"user": "alice"})).json()["caller"] == "key:bob"
        for key in (None, "alice-key-012", "alice-key-01234", "Bob-key-01234", "alice"):
            async with _client(front, key) as stranger:
                reply = await stranger.post("/v1/embeddings", json={"input": "x"})
                assert (reply.status_code, reply.headers.get("www-authenticate")) == (401, "Bearer"), key
                assert (await stranger.get("/health")).status_code == 200  # probes need no key
        open_front, _ = _front(Principals())
        async with _client(open_front, None) as anyone:
            reply = await anyone.post("/v1/embeddings", json={"input": "x", "user": "alice"})
            assert reply.json()["caller"] == "address:127.0.0.1"

    asyncio.run(run())


def test_a_body_over_the_limit_is_413_by_its_length_or_as_it_streams() -> None:
    async def chunks(count: int, size: int = 8192) -> AsyncIterator[bytes]:
        for _ in range(count):
            yield b"a" * size

    async def run() -> None:
        front, budget = _front()
        async with _client(front) as http:
            big = await http.post("/v1/embeddings", content=b"a" * (LIMIT + 1))
            assert big.status_code == 413 and "limit of 65536 bytes" in big.json()["error"]["message"]
            streamed = await http.post("/v1/embeddings", content=chunks(LIMIT // 8192 + 1))
            assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "limit"
            fits = await http.post("/v1/embeddings", content=json.dumps({"input": "a" * (LIMIT - 20)}))
            assert fits.status_code == 200 and fits.json()["bytes"] > LIMIT - 20
        assert budget.in_use == 0

    asyncio.run(run())


def test_bodies_that_do_not_fit_the_budget_are_429_and_commas_count() -> None:
    async def run() -> None:
        front, budget = _front()
        release = asyncio.Event()

        async def slow_body() -> AsyncIterator[bytes]:
            yield b'{"input": "' + b"a" * 60_000
            await release.wait()
            yield b'"}'

        async with _client(front) as http:
            held = asyncio.create_task(
                http.post("/v1/embeddings", content=slow_body(), headers={"content-length": str(60_013)})
            )
            for _ in range(100):
                if budget.in_use:
                    break
                await asyncio.sleep(0.01)
            # the bytes arrived (never the Content-Length declared), and the cost of its one object
            assert budget.in_use == 60_011 + OBJECT_COST
            # 60,243 of 102,400 held: 50,000 bytes do not fit by their Content-Length, nor as they stream
            busy = await http.post("/v1/embeddings", content=b"a" * 50_000)
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1", busy.text
            assert busy.json()["error"]["type"] == "rate_limit_error" and "retry later" in busy.text

            async def streamed() -> AsyncIterator[bytes]:
                for _ in range(10):
                    yield b"a" * 5000

            assert (await http.post("/v1/embeddings", content=streamed())).status_code == 429
            small = await http.post("/v1/embeddings", json={"input": "fits beside it"})
            assert small.status_code == 200
            release.set()
            assert (await held).status_code == 200
            # alone, but its commas make it cost more than the whole budget: 413, never worth a retry
            commas = b"[" + b",".join([b'"ab"'] * (TOTAL // COMMA_COST)) + b"]"
            assert len(commas) < LIMIT
            over = await http.post("/v1/embeddings", content=commas)
            assert over.status_code == 413 and "send fewer inputs" in over.json()["error"]["message"]
            assert (await http.post("/v1/embeddings", content=b"a" * 50_000)).status_code == 200
        assert budget.in_use == 0

    asyncio.run(run())


@pytest.mark.parametrize("path", ["/embed", "/encode"])
def test_each_api_answers_a_refusal_in_its_own_format(path: str) -> None:
    async def run() -> httpx.Response:
        front, _ = _front()
        async with _client(front) as http:
            return await http.post(path, content=b"a" * (LIMIT + 1))

    reply = asyncio.run(run())
    assert reply.status_code == 413
    body = reply.json()
    assert (body["error_type"] if path == "/embed" else body["kind"]) == "limit"
