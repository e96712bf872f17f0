"""Attack: the HTTP front end's edges, in bytes and in time.

One server with two API keys, and short deadlines so the attacks end quickly: a caller without
a key holds sockets that declare large bodies on open paths and keyed ones, or send half their
headers; a key holder trickles its bodies; a connection streams header lines; requests ask the
HTTP process to tokenize texts as large as the limits allow, one at a time and 32 at once; and
errors are provoked with megabyte-long values. The HTTP process's resident memory is sampled
while each attack runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from faulty_model import pythonpath_env

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-fedcba9876543210"
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 6.0
MIN_RATE = 65_536
CONNECTIONS = 64
MIB = 2**20


@dataclass
class Front:
    running: RunningServer
    port: int
    pid: int  # the HTTP process

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_mib(self) -> float:
        return psutil.Process(self.pid).memory_info().rss / MIB


def http_process(running: RunningServer, port: int) -> int:
    """The pid of the server's child that listens on the HTTP port."""
    for process in running.family():
        try:
            if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in process.net_connections("tcp")):
                return process.pid
        except psutil.Error:
            continue
    raise AssertionError(f"no process of the server listens on {port}")


@pytest.fixture(scope="module")
def front(tiny_google: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    key_file: Path = tmp_path_factory.mktemp("keys") / "api-keys"
    key_file.write_text(f"alice {ALICE}\nbob   {BOB}\n")
    key_file.chmod(0o600)
    port = free_port()
    running = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        "faulty_model:FaultyModel",
        "--http-port",
        str(port),
        "--api-keys",
        str(key_file),
        "--http-header-timeout-s",
        str(HEADER_TIMEOUT_S),
        "--http-body-timeout-s",
        str(BODY_TIMEOUT_S),
        "--http-body-min-rate",
        str(MIN_RATE),
        "--max-http-connections",
        str(CONNECTIONS),
        env=pythonpath_env(),
    )
    try:
        yield Front(running, port, http_process(running, port))
    finally:
        running.stop()


def _auth(key: str = ALICE) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextmanager
def peak_growth(front: Front) -> Iterator[Callable[[], float]]:
    """While the block runs, sample the HTTP process's RSS; the callable gives its growth in
    MiB, at its peak, over what it was on entry."""
    idle = front.rss_mib()
    peak = idle
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.01):
            peak = max(peak, front.rss_mib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield lambda: peak - idle
    finally:
        done.set()
        sampler.join(5)


async def _open(front: Front, head: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
    writer.write(head)
    await writer.drain()
    return reader, writer


async def _status(reader: asyncio.StreamReader, timeout: float) -> int | None:
    """The status of the answer on a raw connection, or None if it closed without one."""
    try:
        line = await asyncio.wait_for(reader.readline(), timeout)
    except ConnectionError:
        return None
    return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else None


def _head(method: str, path: str, *, key: str | None = None, length: int | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test", "Content-Type: application/json"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.timeout(60)
def test_a_keyless_caller_holding_sockets_does_not_delay_a_keyed_request(front: Front) -> None:
    async def attack() -> None:
        held = []
        for _ in range(16):  # open paths and GETs take no body: refused at once, nothing held
            held.append(await _open(front, _head("GET", "/health", length=16 * MIB)))
            held.append(await _open(front, _head("POST", "/ready", length=16 * MIB)))
        for _ in range(16):  # keyed paths: 401 before a byte of the body is read
            held.append(await _open(front, _head("POST", "/v1/embeddings", length=16 * MIB)))
        for _ in range(8):  # half a request's headers
            held.append(await _open(front, b"POST /v1/embeddings HTTP/1.1\r\nContent-Length: 16777216\r\n"))
        try:
            async with httpx.AsyncClient(base_url=front.url, headers=_auth(BOB), timeout=10) as http:
                started = time.perf_counter()
                reply = await http.post("/v1/embeddings", json={"input": ["past the sockets", "held open"]})
                took = time.perf_counter() - started
            assert reply.status_code == 200, reply.text
            assert took < 1.0, f"a keyed request took {took:.2f} s beside the keyless sockets"
            statuses = [await _status(reader, 5) for reader, _ in held[:48]]
            assert statuses == [413, 413] * 16 + [401] * 16, statuses
        finally:
            for _, writer in held:
                writer.close()

    asyncio.run(attack())
    metrics = httpx.get(front.url + "/metrics", headers=_auth(), timeout=10).text
    assert "bertserve_http_body_bytes 0.0" in metrics


@pytest.mark.timeout(60)
def test_a_key_holder_trickling_bodies_holds_at_most_its_share_and_is_cut_off(front: Front) -> None:
    async def attack() -> None:
        trickles = []
        for _ in range(3):  # alice declares 8 MiB three times, sends 6 MiB of each and stalls
            reader, writer = await _open(front, _head("POST", "/v1/embeddings", key=ALICE, length=8 * MIB))
            try:
                writer.write(b'{"input": "' + b"a" * (6 * MIB))
                await writer.drain()
            except ConnectionError:
                pass  # refused: alice's bodies would hold more than her half of the budget
            trickles.append((reader, writer))
        slow_reader, slow_writer = await _open(front, _head("POST", "/embed", key=ALICE, length=MIB))
        slow_writer.write(b'{"inputs": "' + b"a" * 1000)  # then nothing: below the minimum rate
        started = time.perf_counter()
        try:
            async with httpx.AsyncClient(base_url=front.url, headers=_auth(BOB), timeout=10) as http:
                asked = time.perf_counter()
                reply = await http.post("/embed", json={"inputs": "bob's turn"})
                assert reply.status_code == 200, reply.text
                assert time.perf_counter() - asked < 1.0
            assert await _status(slow_reader, 2 + HEADER_TIMEOUT_S) == 408
            assert time.perf_counter() - started < 2.0 + 1.5  # the grace, and 1000 bytes at the minimum rate
            statuses = [await _status(reader, BODY_TIMEOUT_S + 3) for reader, _ in trickles]
            assert sorted(statuses) == [408, 408, 429], statuses  # 18 MiB did not fit alice's share, 16 MiB
            assert time.perf_counter() - started < BODY_TIMEOUT_S + 2
        finally:
            for _, writer in [*trickles, (slow_reader, slow_writer)]:
                writer.close()

    asyncio.run(attack())


@pytest.mark.timeout(60)
def test_a_header_flood_is_cut_off_in_bytes_and_in_time(front: Front) -> None:
    async def stream_headers() -> int:
        """Header lines as fast as the server takes them, until it closes (at most 64 MiB)."""
        reader, writer = await _open(front, b"POST /v1/embeddings HTTP/1.1\r\n")
        line = b"X-Flood: " + b"a" * 1000 + b"\r\n"
        sent = 0
        try:
            while sent < 64 * MIB:
                writer.write(line * 64)
                await asyncio.wait_for(writer.drain(), 5)
                sent += 64 * len(line)
        except (ConnectionError, asyncio.TimeoutError):
            pass
        assert await _status(reader, 5) in (400, None)
        writer.close()
        return sent

    async def partial_headers(count: int) -> float:
        """``count`` connections that each send half their headers; seconds until all are closed."""
        held = [await _open(front, _head("POST", "/v1/embeddings", key=ALICE)[:40]) for _ in range(count)]
        started = time.perf_counter()
        statuses = await asyncio.gather(*(_status(reader, HEADER_TIMEOUT_S + 5) for reader, _ in held))
        took = time.perf_counter() - started
        assert set(statuses) == {408}, statuses
        rests = [await asyncio.wait_for(reader.read(), 5) for reader, _ in held]
        assert all(rest.endswith(b"not whole in time\n") for rest in rests)  # then closed: read() ended
        for _, writer in held:
            writer.close()
        return took

    with peak_growth(front) as growth:
        sent = asyncio.run(stream_headers())
    # What the flood wrote before the close includes both ends' kernel buffers (up to about 10 MiB
    # on loopback); before the bound, the server read all 64 MiB.
    assert sent < 16 * MIB, f"the server read {sent / MIB:.0f} MiB of headers"
    assert growth() < 16, f"a header flood grew the HTTP process by {growth():.0f} MiB"
    with peak_growth(front) as growth:
        took = asyncio.run(partial_headers(CONNECTIONS - 8))
    assert took < HEADER_TIMEOUT_S + 1.5, f"partial headers were held {took:.1f} s"
    assert growth() < 16


def _tokenize(http: httpx.Client, texts: list[str], **options: object) -> httpx.Response:
    return http.post("/tokenize", json={"inputs": texts, **options})


@pytest.mark.timeout(60)
def test_one_request_as_large_as_the_limits_grows_the_http_process_by_at_most_64_mib(front: Front) -> None:
    dots = "." * 100_000  # --max-text-chars: each character a token
    shapes: list[tuple[str, dict[str, object], set[int]]] = [
        ("/tokenize", {"inputs": dots}, {413}),  # the whole of it would be 100,002 tokens
        ("/tokenize", {"inputs": dots, "truncate": True}, {200}),
        ("/tokenize", {"inputs": [dots] * 125, "truncate": True}, {200}),  # a 12.5 MB body, just under the limit
        ("/tokenize", {"inputs": [dots] * 125, "truncate": True, "truncation_direction": "left"}, {200}),
        ("/tokenize", {"inputs": ["a " * 50_000] * 125}, {413}),
        ("/embed", {"inputs": [dots] * 125}, {413}),  # over-long, found at once
        ("/embed", {"inputs": "word " * 760_000}, {413}),  # 3.8 MB: over --max-text-chars
        ("/v1/embeddings", {"input": [dots] * 125}, {413}),  # over-long, found at once
        ("/v1/embeddings", {"input": [dots] * 125, "truncate": True}, {200}),  # each counted to the model's length
    ]
    with httpx.Client(base_url=front.url, headers=_auth(), timeout=30) as http:
        for path in ("/tokenize", "/embed"):  # a served process: its threads and pools made once
            assert http.post(path, json={"inputs": ["warm up"] * 8}).status_code == 200
        for path, body, expected in shapes:
            with peak_growth(front) as growth:
                started = time.perf_counter()
                reply = http.post(path, json=body)
                took = time.perf_counter() - started
            what = f"{path} {str(body)[:60]}"
            assert reply.status_code in expected, (what, reply.text[:300])
            assert growth() < 64, f"{what} grew the HTTP process by {growth():.0f} MiB"
            assert took < 10, f"{what} took {took:.1f} s"
            print(f"{what}: {reply.status_code} in {took:.2f} s, {len(reply.content)} bytes, +{growth():.0f} MiB")


@pytest.mark.timeout(60)
def test_32_such_requests_at_once_grow_it_by_at_most_300_mib(front: Front) -> None:
    dots = "." * 100_000
    bodies = [{"inputs": [dots] * 4, "truncate": True}, {"inputs": dots}, {"inputs": [dots] * 4}]

    async def flood() -> list[int]:
        async with httpx.AsyncClient(base_url=front.url, timeout=30, limits=httpx.Limits(max_connections=32)) as http:
            replies = await asyncio.gather(
                *(
                    http.post(path, json=bodies[i % 3], headers=_auth((ALICE, BOB)[i % 2]))
                    for i, path in enumerate(["/tokenize", "/embed"] * 16)
                )
            )
        return [reply.status_code for reply in replies]

    with peak_growth(front) as growth:
        statuses = asyncio.run(flood())
    assert set(statuses) <= {200, 413, 429} and 200 in statuses, statuses
    assert growth() < 300, f"32 requests at once grew the HTTP process by {growth():.0f} MiB"
    print(f"32 at once: {sorted(statuses)}, +{growth():.0f} MiB")


@pytest.mark.timeout(60)
def test_errors_quote_at_most_a_bounded_prefix_of_what_they_received(front: Front) -> None:
    long = "\x00" * 1_000_000  # repr makes each character four
    bodies = [
        ("/v1/embeddings", {"input": "x", "prompt_name": long}),
        ("/v1/embeddings", {"input": "x", "model": long}),
        ("/v1/embeddings", {"input": "x", "encoding_format": long}),
        ("/embed", {"inputs": "x", "prompt_name": long}),
        ("/tokenize", {"inputs": "x", "prompt_name": long}),
        ("/encode", {"texts": ["x"], "model": long}),
        ("/encode", {"texts": [["x", long]], "is_tokenized": True, "prompt_name": long}),
        ("/encode", {"texts": [f"{long} |||  "]}),
        ("/v1/embeddings", {"input": "x", "dimensions": long}),
    ]
    with httpx.Client(base_url=front.url, headers=_auth(), timeout=30) as http:
        for path, body in bodies:
            reply = http.post(path, json=body)
            assert 400 <= reply.status_code < 500, reply.text[:200]
            assert len(reply.content) < 4096, f"{path} answered {len(reply.content)} bytes to {str(body)[:80]}"
        garbage = http.post("/v1/embeddings", content=b'{"input": ' + b"x" * 1_000_000 + b"}")
        assert garbage.status_code == 422 and len(garbage.content) < 4096


@pytest.mark.timeout(60)
def test_metrics_name_no_principal_unless_asked(front: Front) -> None:
    with httpx.Client(base_url=front.url, timeout=30) as http:
        assert http.post("/v1/embeddings", json={"input": "x"}, headers=_auth(BOB)).status_code == 200
        metrics = http.get("/metrics", headers=_auth()).text
    assert "bertserve_http_requests_total" in metrics
    assert 'principal="' not in metrics, "a principal is named in /metrics"
