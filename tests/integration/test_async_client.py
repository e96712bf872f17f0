"""``AsyncBertClient`` against real servers: its vectors are ``BertClient``'s, a thousand calls
in flight at once from one event loop come back right without stalling the loop, an abandoned
call is withdrawn from the server, and the request options and deadlines reach the server.

Three servers: the tiny BERT (normalized output, two prompts) for the vectors; the numpy
:class:`faulty_model.PacedModel` (50 ms a model run, ``SLOWME`` a second more), which starts in
seconds, for timeouts, cancellation and busy refusals; and the same under CURVE.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import statistics
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from bertserve.client import (
    AsyncBertClient,
    AuthenticationError,
    BertClient,
    ClientClosedError,
    ServerBusyError,
    ServerError,
    ServerTimeoutError,
)
from bertserve.client.security import keygen
from bertserve.server.testing.launcher import RunningServer, start_server
from faulty_model import expected, pythonpath_env, sentences

pytestmark = pytest.mark.timeout(240)

PROMPTS = {"query": "query: ", "passage": "passage: "}
STALL_BOUND_S = 0.050  # the median of the runs' largest stalls; the aim is 5 ms (see the stall test)

T = TypeVar("T")


@pytest.fixture(scope="module")
def bert_server(tiny_google: str, session_graph_dir: str) -> Iterator[RunningServer]:
    """The tiny BERT with L2-normalized output and two prompts."""
    prompts = [flag for name, text in PROMPTS.items() for flag in ("--prompt", f"{name}={text}")]
    server = start_server(
        "--model-dir",
        tiny_google,
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        "32",
        "--max-batch-size",
        "64",
        "--max-latency-ms",
        "2",
        "--normalize",
        *prompts,
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def paced_server(tiny_google: str) -> Iterator[RunningServer]:
    """50 ms a model run, 16 texts a run; a client may queue at most 100 texts."""
    server = start_server(
        "--model-dir",
        tiny_google,
        "--max-seq-len",
        "32",
        "--model-class",
        "faulty_model:PacedModel",
        "--num-worker",
        "1",
        "--max-batch-size",
        "16",
        "--max-client-queued-sentences",
        "100",
        env=pythonpath_env(),
        timeout=60,
    )
    yield server
    server.stop()


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(main())


def async_client(server: RunningServer, **options: Any) -> AsyncBertClient:
    return AsyncBertClient("127.0.0.1", server.port, server.port_out, timeout=options.pop("timeout", 30_000), **options)


# -- the vectors ---------------------------------------------------------------------------


def test_the_async_client_gets_bert_clients_vectors(bert_server: RunningServer) -> None:
    texts = sentences(40, seed=1)
    with BertClient(**bert_server.client_kwargs, timeout=30_000) as bc:
        want = bc.encode(texts)
        want_tokens = bc.encode(texts[:3], show_tokens=True)[1]
        want_chunked = bc.encode(texts, long_inputs="chunk")

    async def main() -> tuple[Any, ...]:
        async with async_client(bert_server) as client:
            config = await client.server_config()
            status = await client.server_status()
            vectors = await client.encode(texts)
            _, tokens = await client.encode(texts[:3], show_tokens=True)
            as_list = await client.encode(texts[:2], long_inputs="chunk")
            return config, status, vectors, tokens, as_list

    config, status, vectors, tokens, first_two = run(main)
    assert config["output_dim"] == 32 and config["prompts"] == PROMPTS and "requests_served" in status
    np.testing.assert_allclose(vectors, want, atol=1e-5)
    assert tokens == want_tokens
    np.testing.assert_allclose(first_two, want_chunked[:2], atol=1e-5)


def test_a_thousand_calls_at_once_come_back_right_without_stalling_the_loop(bert_server: RunningServer) -> None:
    """1,000 calls of one text each, all in flight at once from one event loop, each answered
    with its own row, while a ticker task measures how long the loop's turns take.

    The server's worker is stopped while the calls are sent, so all 1,000 wait at once and
    their answers come back in a burst. The calls are started ten a loop turn, as requests
    reach a server, so what a turn costs is the client's work, not the test's creating 1,000
    tasks at once. The ticker yields at every turn and records the CPU time the loop's thread
    spent between two ticks: that is the stall the client's code causes, whatever else the
    machine runs (wall-clock gaps, printed too, add the time the OS ran other processes on a
    busy 2-core machine). The bound is on the median of three runs' largest stall; the aim,
    and what an idle machine measures, is under 5 ms."""
    texts = [f"sentence number {i} of the flood" for i in range(1000)]
    with BertClient(**bert_server.client_kwargs, timeout=60_000) as bc:
        want = bc.encode(texts)
        workers = [worker["pid"] for worker in bc.server_status["workers"]]

    async def flood(client: AsyncBertClient) -> tuple[float, float, int, list[Any]]:
        stalls: list[tuple[float, float]] = []  # (CPU, wall) between two ticks
        done = False

        async def ticker() -> None:
            while not done:
                wall, cpu = time.perf_counter(), time.thread_time()
                await asyncio.sleep(0)
                stalls.append((time.thread_time() - cpu, time.perf_counter() - wall))

        ticking = asyncio.create_task(ticker())
        calls: list[asyncio.Task[Any]] = []
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            for start in range(0, len(texts), 10):
                calls += [asyncio.create_task(client.encode([text])) for text in texts[start : start + 10]]
                await asyncio.sleep(0)
            await asyncio.sleep(0.05)
            assert client._connection.transport is not None
            in_flight = client._connection.transport.in_flight
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        results = await asyncio.gather(*calls)
        done = True
        await ticking
        return max(cpu for cpu, _ in stalls), max(wall for _, wall in stalls), in_flight, results

    async def main() -> list[tuple[float, float, int, list[Any]]]:
        async with async_client(bert_server, timeout=60_000) as client:
            await client.encode(["warm up"])
            return [await flood(client) for _ in range(3)]

    # The test process holds TensorFlow (the tiny BERT's fixtures write it), whose objects make a
    # full collection take 100 ms or more: an application's own heap, not the client's work.
    gc.freeze()
    try:
        runs = run(main)
    finally:
        gc.unfreeze()
    for _, _, in_flight, results in runs:
        assert in_flight == len(texts)
        np.testing.assert_allclose(np.concatenate(results), want, atol=1e-5)
    cpu = [stall for stall, _, _, _ in runs]
    print(
        "\nlargest event-loop stall per run of 1,000 calls: CPU "
        + ", ".join(f"{stall * 1000:.1f}" for stall in cpu)
        + " ms; wall clock "
        + ", ".join(f"{wall * 1000:.1f}" for _, wall, _, _ in runs)
        + " ms"
    )
    assert statistics.median(cpu) < STALL_BOUND_S, cpu


# -- the request options (need the server's side of them) -------------------------------------


def test_dimensions_keep_the_first_k_at_unit_length(bert_server: RunningServer) -> None:
    texts = sentences(12, seed=2)

    async def main() -> tuple[np.ndarray, np.ndarray]:
        async with async_client(bert_server) as client:
            full = await client.encode(texts)
            cut = await client.encode(texts, dimensions=8)
            with pytest.raises(ValueError, match="more than the model's 32 dimensions"):
                await client.encode(texts, dimensions=33)
            return full, cut

    full, cut = run(main)
    assert cut.shape == (12, 8)
    np.testing.assert_allclose(np.linalg.norm(full, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)
    expected_cut = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected_cut, atol=1e-5)
    with BertClient(**bert_server.client_kwargs, timeout=30_000) as bc:
        np.testing.assert_allclose(bc.encode(texts, dimensions=8), cut, atol=1e-5)
        assert bc.encode(texts, dimensions=8, show_progress=True).shape == (12, 8)


def test_a_prompt_is_put_before_every_text(bert_server: RunningServer) -> None:
    texts = sentences(5, seed=3)

    async def main() -> tuple[np.ndarray, np.ndarray]:
        async with async_client(bert_server) as client:
            prompted = await client.encode(texts, prompt_name="query")
            by_hand = await client.encode([PROMPTS["query"] + text for text in texts])
            with pytest.raises(ValueError, match="the server's prompts are 'passage', 'query'"):
                await client.encode(texts, prompt_name="document")
            return prompted, by_hand

    prompted, by_hand = run(main)
    np.testing.assert_allclose(prompted, by_hand, atol=1e-5)


def test_truncation_direction_cuts_the_other_end(bert_server: RunningServer) -> None:
    long = " ".join(f"word{i}" for i in range(80))  # far past max_seq_len 32
    short = "short enough"

    async def main() -> dict[str, np.ndarray]:
        async with async_client(bert_server, check_length=False) as client:
            return {
                side: await client.encode([long, short], truncation_direction=side) for side in ("left", "right")
            } | {"default": await client.encode([long, short])}

    got = run(main)
    np.testing.assert_allclose(got["default"], got["right"], atol=1e-5)
    np.testing.assert_allclose(got["left"][1], got["right"][1], atol=1e-5)  # nothing cut: the same
    assert not np.allclose(got["left"][0], got["right"][0], atol=1e-3)


# -- deadlines, cancellation, refusals, closing ----------------------------------------------


def test_a_timeout_is_raised_within_the_timeout_and_the_server_drops_the_work(paced_server: RunningServer) -> None:
    async def main() -> tuple[float, dict[str, Any]]:
        async with async_client(paced_server, timeout=10_000) as client:
            await client.encode(["warm up"])
            blocker = asyncio.create_task(client.encode(["SLOWME " + text for text in sentences(16, seed=4)]))
            await asyncio.sleep(0.1)  # the worker is busy for a second
            client.timeout = 300
            started = time.monotonic()
            with pytest.raises(ServerTimeoutError, match="within 300 ms") as info:
                await client.encode(sentences(3, seed=5))
            elapsed = time.monotonic() - started
            assert info.value.timeout_ms == 300
            client.timeout = 10_000
            await blocker
            return elapsed, await client.server_status()

    elapsed, status = run(main)
    assert 0.29 < elapsed < 1.0
    # Withdrawn or expired: either way the server did not compute it for nobody.
    assert status["requests_cancelled"] + status.get("requests_expired", 0) >= 1, status


def test_a_cancelled_call_is_withdrawn_and_its_reply_dropped(paced_server: RunningServer) -> None:
    big = sentences(96, seed=6)  # six runs of 50 ms

    async def main() -> tuple[dict[str, Any], dict[str, Any], int, np.ndarray]:
        async with async_client(paced_server) as client:
            before = await client.server_status()
            call = asyncio.create_task(client.encode(big))
            await asyncio.sleep(0.08)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            after = await client.server_status()
            await asyncio.sleep(0.5)  # time for a late reply to come, and be dropped
            assert client._connection.transport is not None
            waiting = client._connection.transport.in_flight
            return before, after, waiting, await client.encode(big[:4])

    before, after, waiting, vectors = run(main)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert waiting == 0  # nothing kept for the cancelled call
    np.testing.assert_allclose(vectors, expected(big[:4]), atol=1e-6)


def test_a_full_queue_refuses_with_server_busy(paced_server: RunningServer) -> None:
    async def main() -> list[Any]:
        async with async_client(paced_server) as client:
            calls = [asyncio.create_task(client.encode(sentences(60, seed=7 + i))) for i in range(2)]
            return await asyncio.gather(*calls, return_exceptions=True)

    first, second = run(main)
    np.testing.assert_allclose(first, expected(sentences(60, seed=7)), atol=1e-6)
    assert isinstance(second, ServerBusyError) and second.kind == "busy", second


def test_closing_fails_the_calls_in_flight(paced_server: RunningServer) -> None:
    async def main() -> None:
        client = async_client(paced_server)
        await client.connect()
        calls = [asyncio.create_task(client.encode(sentences(16, seed=20 + i))) for i in range(5)]
        await asyncio.sleep(0.05)
        await client.aclose()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, ClientClosedError) for r in results), results
        with pytest.raises(ClientClosedError):
            await client.encode(["after"])
        await client.aclose()  # twice is harmless
        client.close()

    run(main)


def test_a_server_error_is_a_server_error(paced_server: RunningServer) -> None:
    async def main() -> None:
        async with async_client(paced_server) as client:
            with pytest.raises(ServerError, match=r"characters"):
                await client.encode(["x" * 200_000])

    run(main)


# -- CURVE ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def curve_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("curve")
    keygen(root, "server")
    keygen(root / "clients", "alice")
    keygen(root / "outsiders", "mallory")
    return root


@pytest.fixture(scope="module")
def curve_server(curve_keys: Path, tiny_google: str) -> Iterator[RunningServer]:
    server = start_server(
        "--model-dir",
        tiny_google,
        "--max-seq-len",
        "32",
        "--model-class",
        "faulty_model:PacedModel",
        "--num-worker",
        "1",
        "--max-batch-size",
        "16",
        "--curve-dir",
        str(curve_keys),
        env=pythonpath_env(),
        timeout=60,
    )
    yield server
    server.stop()


def test_curve_serves_an_allowed_key_and_refuses_another(curve_server: RunningServer, curve_keys: Path) -> None:
    def keyed(name: str, **options: Any) -> AsyncBertClient:
        folder = "clients" if name == "alice" else "outsiders"
        return async_client(
            curve_server,
            server_key=curve_keys / "server.key",
            client_cert=curve_keys / folder / f"{name}.key_secret",
            **options,
        )

    texts = sentences(30, seed=8)

    async def main() -> tuple[list[Any], dict[str, Any]]:
        async with keyed("alice") as alice:
            answers = await asyncio.gather(*(alice.encode([text]) for text in texts))
            call = asyncio.create_task(alice.encode(sentences(96, seed=9)))
            await asyncio.sleep(0.08)
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            status = await alice.server_status()
        started = time.monotonic()
        with pytest.raises(AuthenticationError, match="refused this client's key"):
            async with keyed("mallory", timeout=10_000):
                pass
        assert time.monotonic() - started < 3  # at once, not at the timeout
        return answers, status

    answers, status = run(main)
    np.testing.assert_allclose(np.concatenate(answers), expected(texts), atol=1e-6)
    assert status["requests_cancelled"] == 1  # the CANCEL came from the key that sent the request
