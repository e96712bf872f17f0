"""Attack: a caller without a key forges its principal with ``X-Forwarded-For``.

Without keys a principal is the peer address, and the per-client bound applies to it. A
local caller that fills its bound and then names another address in ``X-Forwarded-For`` (or
``Forwarded``) must still be refused as itself: forwarded headers are believed only from the
addresses ``--forwarded-allow-ips`` lists, and none are by default.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Iterator

import httpx
import pytest
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from faulty_model import pythonpath_env, sentences

REQUEST = 5  # inputs per request; each principal may have 10 queued


@pytest.fixture(scope="module")
def front(tiny_google: str) -> Iterator[tuple[RunningServer, str]]:
    port = free_port()
    running = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        "faulty_model:FaultyModel",
        "--http-port",
        str(port),
        "--heartbeat-timeout-ms",
        "60000",
        "--max-request-size",
        str(REQUEST),
        "--max-client-queued-sentences",
        str(2 * REQUEST),
        "--max-queued-sentences",
        "1000",
        env=pythonpath_env(),
    )
    try:
        yield running, f"http://127.0.0.1:{port}"
    finally:
        running.stop()


async def _until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(200):
        if await condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} did not happen in 10 s")


@pytest.mark.timeout(60)
def test_a_forged_forwarded_header_from_loopback_does_not_change_the_principal(
    front: tuple[RunningServer, str],
) -> None:
    _, url = front

    async def attack() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:

            async def post(seed: int, headers: dict[str, str] | None = None) -> httpx.Response:
                return await http.post("/v1/embeddings", json={"input": sentences(REQUEST, seed=seed)}, headers=headers)

            async def status() -> dict:
                return (await http.get("/status")).raise_for_status().json()

            assert (await post(0)).status_code == 200

            async def idle() -> bool:
                return not (await status())["jobs_in_flight"]

            # A reply can reach its client before its worker's DONE reaches the head: stopped
            # in between, the worker would keep that job and its credit.
            await _until(idle, "the head taking the first request's DONE")
            (worker,) = [w["pid"] for w in (await status())["workers"]]
            os.kill(worker, signal.SIGSTOP)
            pending = []
            try:
                pending.append(asyncio.create_task(post(1)))

                async def in_flight() -> bool:
                    return bool((await status())["jobs_in_flight"])

                await _until(in_flight, "the first request reaching the stopped worker")
                pending += [asyncio.create_task(post(seed)) for seed in (2, 3)]

                async def full() -> bool:
                    return (await status())["queued_sentences"] == 2 * REQUEST

                await _until(full, "this address's bound filling")
                for forged in (
                    {"X-Forwarded-For": "203.0.113.7"},
                    {"X-Forwarded-For": "198.51.100.1, 10.0.0.1"},
                    {"Forwarded": "for=192.0.2.60"},
                    {"X-Real-IP": "192.0.2.61"},
                ):
                    refused = await post(9, forged)
                    assert refused.status_code == 429, (forged, refused.text)
                    assert "this client already has 10 inputs queued" in refused.json()["error"]["message"]
            finally:
                os.kill(worker, signal.SIGCONT)
            assert [(await task).status_code for task in pending] == [200, 200, 200]

    asyncio.run(attack())
