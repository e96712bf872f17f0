"""Attack: many large HTTP bodies at once must not run the head out of memory.

Each test sends 32 bodies of 60 MB at once, from generators of one shared chunk (so this
process never holds them), samples the head's resident memory (the server process and its
children, the workers left out) while they travel, and checks that every body was answered
or refused with 413 or 429 and that the head never grew by more than 300 MiB.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import pytest
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from faulty_model import pythonpath_env

KEY = "bodies-test-key-0123456789"
BODIES = 32
BODY_BYTES = 60_000_000
HEADROOM_MIB = 300
MIB = 2**20


@dataclass
class Front:
    running: RunningServer
    url: str

    def worker_pids(self) -> set[int]:
        status = httpx.get(self.url + "/status", headers=_auth(), timeout=30).raise_for_status().json()
        return {int(worker["pid"]) for worker in status["workers"]}

    def head_rss_mib(self, workers: set[int]) -> float:
        return self.running.family_rss_mib(workers)


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def serve(tiny_google: str, *args: str) -> Front:
    port = free_port()
    running = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        "faulty_model:FaultyModel",
        "--http-port",
        str(port),
        *args,
        env=pythonpath_env(BERTSERVE_API_KEY=KEY),
    )
    return Front(running, f"http://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def default_front(tiny_google: str) -> Iterator[Front]:
    """A head with the default body limits."""
    front = serve(tiny_google)
    yield front
    front.running.stop()


def body_chunks(size: int, inputs: int) -> AsyncIterator[bytes]:
    """A JSON ``/v1/embeddings`` body of ``inputs`` texts, ``size`` bytes long, as an async
    iterator that yields one shared piece again and again."""
    head, tail = b'{"input": [', b"]}"
    item_bytes = (size - len(head) - len(tail) + 1) // inputs  # each item with its comma
    item = b'"' + b"a" * (item_bytes - 3) + b'",'
    last = b'"' + b"a" * (size - len(head) - len(tail) - (inputs - 1) * item_bytes - 2) + b'"'
    assert len(head) + (inputs - 1) * len(item) + len(last) + len(tail) == size

    per_block = max(1, 2**16 // len(item))
    block = item * per_block  # about 64 KiB of whole items

    async def chunks() -> AsyncIterator[bytes]:
        yield head
        for _ in range((inputs - 1) // per_block):
            yield block
        yield item * ((inputs - 1) % per_block) + last + tail

    return chunks()


def flood(
    front: Front, *, inputs: int, content_length: bool, size: int = BODY_BYTES
) -> tuple[list[int | str], float, float]:
    """Send ``BODIES`` bodies at once; their status codes (or the transport error), and the
    head's resident memory when idle and at its peak, in MiB."""
    workers = front.worker_pids()
    assert httpx.post(front.url + "/v1/embeddings", json={"input": "warm"}, headers=_auth()).status_code == 200
    idle = front.head_rss_mib(workers)
    peak = idle
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.02):
            peak = max(peak, front.head_rss_mib(workers))

    async def one(http: httpx.AsyncClient) -> int | str:
        headers = {**_auth(), "content-type": "application/json"}
        if content_length:
            headers["content-length"] = str(size)
        try:
            reply = await http.post("/v1/embeddings", content=body_chunks(size, inputs), headers=headers)
        except httpx.TransportError as exc:
            return type(exc).__name__
        return reply.status_code

    async def run() -> list[int | str]:
        limits = httpx.Limits(max_connections=BODIES)
        async with httpx.AsyncClient(base_url=front.url, timeout=90, limits=limits) as http:
            return await asyncio.gather(*(one(http) for _ in range(BODIES)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        statuses = asyncio.run(run())
    finally:
        done.set()
        sampler.join(5)
    return statuses, idle, peak


@pytest.mark.timeout(120)
def test_32_bodies_of_60_mb_with_a_content_length_are_refused_unread(default_front: Front) -> None:
    statuses, idle, peak = flood(default_front, inputs=2000, content_length=True)
    assert statuses == [413] * BODIES, statuses  # each over the 12 MiB default, refused by its Content-Length
    assert peak - idle < HEADROOM_MIB, f"the head grew from {idle:.0f} MiB to {peak:.0f} MiB"
    print(f"Content-Length bodies: head idle {idle:.0f} MiB, peak {peak:.0f} MiB")


@pytest.mark.timeout(120)
def test_32_chunked_bodies_of_60_mb_are_cut_off(default_front: Front) -> None:
    statuses, idle, peak = flood(default_front, inputs=2000, content_length=False)
    assert set(statuses) <= {413, 429} and 413 in statuses, statuses
    assert peak - idle < HEADROOM_MIB, f"the head grew from {idle:.0f} MiB to {peak:.0f} MiB"
    print(
        f"chunked bodies: {statuses.count(413)} x 413, {statuses.count(429)} x 429; "
        f"head idle {idle:.0f} MiB, peak {peak:.0f} MiB"
    )
    with httpx.Client(base_url=default_front.url, headers=_auth(), timeout=30) as http:
        assert http.post("/v1/embeddings", json={"input": "still served"}).status_code == 200
        metrics = http.get("/metrics").text
    assert "bertserve_http_body_bytes 0.0" in metrics  # every body gave its share back


@pytest.mark.timeout(120)
def test_32_bodies_of_12_mb_are_encoded_as_the_budget_allows(default_front: Front) -> None:
    """Bodies just under the 12 MiB default limit, each 2000 texts the server encodes: the
    32 MiB budget (16 MiB for one caller) lets a few at a time through to the ventilator, the
    rest get 429 unread."""
    statuses, idle, peak = flood(default_front, size=12_000_000, inputs=2000, content_length=True)
    assert set(statuses) <= {200, 429} and 200 in statuses and 429 in statuses, statuses
    assert peak - idle < HEADROOM_MIB, f"the head grew from {idle:.0f} MiB to {peak:.0f} MiB"
    print(
        f"bodies encoded: {statuses.count(200)} x 200, {statuses.count(429)} x 429; "
        f"head idle {idle:.0f} MiB, peak {peak:.0f} MiB"
    )


@pytest.mark.timeout(120)
def test_bodies_the_limit_allows_are_read_one_budget_at_a_time(tiny_google: str) -> None:
    """With the body limit and the budget raised to 64 MiB each body may be read, but one at a
    time: the rest get 429 by their Content-Length, before they are read."""
    front = serve(
        tiny_google,
        "--max-http-body-bytes",
        str(64 * MIB),
        "--max-http-body-bytes-total",
        str(64 * MIB),
        "--max-message-bytes",
        str(64 * MIB),
        "--max-request-size",
        "1000",
    )
    try:
        statuses, idle, peak = flood(front, inputs=2000, content_length=True)
    finally:
        front.running.stop()
    # read whole, parsed, and refused for its 2000 inputs (at most 1000); or refused unread
    assert set(statuses) <= {413, 429} and 413 in statuses and 429 in statuses, statuses
    assert peak - idle < HEADROOM_MIB, f"the head grew from {idle:.0f} MiB to {peak:.0f} MiB"
    print(
        f"bodies within the limit: {statuses.count(413)} x 413, {statuses.count(429)} x 429; "
        f"head idle {idle:.0f} MiB, peak {peak:.0f} MiB"
    )
