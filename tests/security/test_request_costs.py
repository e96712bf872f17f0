"""Attack: requests whose work or answer is many times their size.

One server of tiny task models (a reranker, a SPLADE model, an embedder), without API keys so
that each peer address is a principal, with bounds a test can reach: ``--max-request-tokens``
20,000, ``--max-reply-bytes`` 256 KiB and ``--max-message-bytes`` 1 MiB. Each test sends what
an attacker with a valid request would send:

- a rerank of a 99,990-character query and 1,000 one-word documents (100 M characters of
  pairs from a 105 KB body): refused by its cost before any work; within the bound, ranked as
  its whole pairs would be (the query cut once to what a pair keeps of it), while a caller from
  another address is answered at once;
- 100,000 one-letter inputs to ``/embed_sparse`` and ``/v1/embeddings`` (answers of every
  vocabulary entry, or of hundreds of MB of JSON): refused with how many inputs fit;
- a rerank whose pairs make a frame larger than the head takes: refused, never left to hang;

and every refusal, on HTTP and ZeroMQ alike, answers within a second.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
from bertserve.client import BertClient, protocol as p
from bertserve.client.errors import ServerError
from bertserve.server.http.gateway import FrameTooLarge, Gateway
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from raw_link import raw_request

pytestmark = pytest.mark.timeout(300)

DATA = Path(__file__).resolve().parent.parent / "data"
RANKER, SPLADE, EMBEDDER = "ranker", "splade", "embedder"
TOKENS, REPLY, MESSAGE = 20_000, 256 * 1024, 1024 * 1024
MAX_LEN = 32  # the tiny reranker's length (its tokenizer's model_max_length)
QUERY = "q" * 99_990


def _words(start: int, count: int) -> str:
    return " ".join(f"word{i}" for i in range(start, start + count))


class Costs:
    def __init__(self, running: RunningServer, http_port: int) -> None:
        self.running = running
        self.url = f"http://127.0.0.1:{http_port}"

    def http(self, address: str = "127.0.0.1", timeout: float = 60) -> httpx.Client:
        transport = httpx.HTTPTransport(local_address=address)
        return httpx.Client(base_url=self.url, transport=transport, timeout=timeout)

    def client(self, model: str) -> BertClient:
        return BertClient(port=self.running.port, port_out=self.running.port_out, model=model, timeout=60_000)

    def http_process(self) -> psutil.Process:
        """The server's process that listens on the HTTP port."""
        port = int(self.url.rsplit(":", 1)[1])
        for process in self.running.family():
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in process.net_connections("tcp")):
                return process
        raise AssertionError("no process of the server listens on the HTTP port")


@pytest.fixture(scope="module")
def costs(session_graph_dir: str) -> Iterator[Costs]:
    models = {RANKER: DATA / "tasks" / "rerank_bert", SPLADE: DATA / "tasks" / "splade_bert"}
    models[EMBEDDER] = DATA / "families" / "roberta"
    flags = [arg for name, where in models.items() for arg in ("--model", f"{name}={where},dtype=fp32")]
    port = free_port()
    running = start_server(
        "--http-port",
        str(port),
        "--graph-dir",
        session_graph_dir,
        "--max-latency-ms",
        "2",
        "--max-request-tokens",
        str(TOKENS),
        "--max-reply-bytes",
        str(REPLY),
        "--max-message-bytes",
        str(MESSAGE),
        *flags,
    )
    yield Costs(running, port)
    running.stop()


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


# -- rerank amplification ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank"])
def test_a_rerank_of_a_long_query_is_refused_by_its_cost_before_any_work(costs: Costs, path: str) -> None:
    documents = [f"d{i}" for i in range(1000)]
    body = {"model": RANKER, "query": QUERY, "texts" if path == "/rerank" else "documents": documents}
    with costs.http() as http:
        reply, took = _timed(lambda: http.post(path, json=body))
    assert reply.status_code == 413, reply.text
    message = reply.json()["error"] if path == "/rerank" else reply.json()["message"]
    assert f"{1000 * MAX_LEN} tokens" in message and f"at most {TOKENS} tokens" in message, message
    assert "--max-request-tokens" in message
    assert took < 1.0


@pytest.mark.parametrize("direction", ["Right", "Left"])
def test_a_long_query_is_ranked_as_its_whole_pairs(costs: Costs, direction: str) -> None:
    query = _words(0, 3000)  # 27,000 characters, far past the model
    documents = ["word5 word6", _words(100, 40), _words(7000, 200), "another short one", _words(2990, 10)]
    body = {"model": RANKER, "query": query, "texts": documents, "raw_scores": True}
    with costs.http() as http:
        reply = http.post("/rerank", json={**body, "truncation_direction": direction})
    assert reply.status_code == 200, reply.text
    served = {item["index"]: item for item in reply.json()}
    with costs.client(RANKER) as client:  # ZeroMQ: the whole pairs, tokenized whole by the workers
        whole = client.rerank(query, documents, raw_scores=True, truncation_direction=direction.lower())
    for ranked in whole:
        assert served[ranked.index]["score"] == pytest.approx(ranked.score, abs=1e-5)
        assert served[ranked.index]["truncated"] is True


def test_a_caller_from_another_address_is_answered_while_long_queries_are_ranked(costs: Costs) -> None:
    documents = [f"d{i}" for i in range(200)]  # 200 x 32 tokens: within the bound, so it runs
    attack = {"model": RANKER, "query": _words(0, 12_000)[:99_990], "texts": documents}
    small = {"model": RANKER, "query": "what is a fox", "texts": ["a fox is an animal", "the sky"]}
    stop = threading.Event()
    answered: list[int] = []

    def attacker() -> None:
        with costs.http() as http:
            while not stop.is_set():
                answered.append(http.post("/rerank", json=attack).status_code)

    with costs.http("127.0.0.2") as bystander:
        assert bystander.post("/rerank", json=small).status_code == 200
        http_process = costs.http_process()
        idle = http_process.memory_info().rss
        threads = [threading.Thread(target=attacker, daemon=True) for _ in range(4)]
        for thread in threads:
            thread.start()
        latencies, peak = [], idle
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            reply, took = _timed(lambda: bystander.post("/rerank", json=small))
            assert reply.status_code == 200, reply.text
            latencies.append(took)
            peak = max(peak, http_process.memory_info().rss)
            time.sleep(0.1)
        stop.set()
        for thread in threads:
            thread.join(60)
    assert answered and set(answered) == {200}, answered
    assert statistics.median(latencies) < 0.5 and max(latencies) < 1.0, sorted(latencies)[-5:]
    assert (peak - idle) / 2**20 <= 4 * 64  # at most 64 MiB a request at once


# -- answers without a bound -----------------------------------------------------------------


def test_a_sparse_answer_past_the_bound_is_refused_with_how_many_inputs_fit(costs: Costs) -> None:
    fits = REPLY // (700 * 8)  # every entry of the tiny model's 700-word vocabulary, an id and a weight
    with costs.http() as http:
        reply, took = _timed(lambda: http.post("/embed_sparse", json={"model": SPLADE, "inputs": ["a"] * 100_000}))
        assert reply.status_code == 413 and took < 1.0
        assert f"send at most {fits} inputs" in reply.json()["error"], reply.text
        assert http.post("/embed_sparse", json={"model": SPLADE, "inputs": ["a fox"] * fits}).status_code == 200
        assert http.post("/embed_sparse", json={"model": SPLADE, "inputs": ["a"] * (fits + 1)}).status_code == 413
    with costs.client(SPLADE) as client, pytest.raises(ServerError) as refused:
        client.encode_sparse(["a"] * (fits + 1))
    assert refused.value.kind == "limit" and f"send at most {fits} inputs" in refused.value.message


def test_sparse_rows_travel_as_id_and_weight_pairs(costs: Costs) -> None:
    texts = ["the quick brown fox", "a lazy dog sleeps", "x"]
    with costs.http() as http:
        served = http.post("/embed_sparse", json={"model": SPLADE, "inputs": texts}).json()
    reply = _raw(costs.running, p.ENCODE, {"model": SPLADE, "task": "sparse"}, texts)
    assert reply is not None and reply.ok, reply and reply.header
    pairs = reply.array()
    assert pairs.ndim == 3 and pairs.shape[0] == 3 and pairs.shape[2] == 2
    assert pairs.shape[1] == max(len(row) for row in served) < 700  # the fullest row's terms, not the vocabulary
    for row, terms in zip(pairs, served, strict=True):
        kept = row[row[:, 1] != 0]
        assert kept[:, 0].astype(int).tolist() == [term["index"] for term in terms]
        np.testing.assert_allclose(kept[:, 1], [term["value"] for term in terms], rtol=1e-6)


def test_an_embeddings_answer_past_the_bound_is_refused_and_clients_split_by_it(costs: Costs) -> None:
    with costs.http() as http:
        reply, took = _timed(lambda: http.post("/v1/embeddings", json={"model": EMBEDDER, "input": ["a"] * 100_000}))
        assert reply.status_code == 413 and took < 1.0
        message = reply.json()["error"]["message"]
        assert "as JSON" in message and "--max-reply-bytes" in message, message
        fits = int(message.rsplit("send at most ", 1)[1].split()[0])
        ok = http.post("/v1/embeddings", json={"model": EMBEDDER, "input": ["a fox"] * fits})
        assert ok.status_code == 200 and len(ok.json()["data"]) == fits
    with costs.client(EMBEDDER) as client:
        rows = client.server_config["max_reply_rows"]
        dim = client.server_config["output_dim"]
        assert rows == REPLY // (4 * dim)
        texts = [f"sentence {i}" for i in range(rows * 2 + 3)]  # split into requests whose answers fit
        vectors = client.encode(texts)
        assert vectors.shape == (len(texts), dim)
        np.testing.assert_allclose(vectors[-1], client.encode(texts[-1:])[0], rtol=1e-5, atol=1e-6)


# -- no silent drop ----------------------------------------------------------------------------


def test_a_rerank_whose_pairs_pass_the_frame_limit_is_refused_at_once(costs: Costs) -> None:
    query = "q" * 3500  # one word, one token: nothing to cut, sent whole in every pair
    body = {"model": RANKER, "query": query, "texts": [f"d{i}" for i in range(350)]}  # 350 x 3.5 KB: past 1 MiB
    with costs.http() as http:
        reply, took = _timed(lambda: http.post("/rerank", json=body))
    assert reply.status_code == 413 and took < 1.0, reply.text
    assert "max_message_bytes" in reply.json()["error"]


def test_the_gateway_never_sends_a_frame_the_head_would_drop() -> None:
    async def scenario() -> None:
        gateway = Gateway("127.0.0.1", free_port(), free_port())
        gateway.config = {"max_message_bytes": 4096}
        try:
            started = time.monotonic()
            with pytest.raises(FrameTooLarge, match="at most 4096 bytes"):
                await gateway.request(b"x", p.ENCODE, ["y" * 5000], timeout_s=30)
            assert time.monotonic() - started < 1.0
            assert not gateway._transport.in_flight  # nothing left waiting for a reply that cannot come
        finally:
            await gateway.close()

    asyncio.run(scenario())


# -- every refusal answers within a second -------------------------------------------------------

HTTP_REFUSALS: list[tuple[str, str, dict[str, Any], dict[str, str], int]] = [
    ("tokens", "/rerank", {"model": RANKER, "query": QUERY, "texts": ["d"] * 1000}, {}, 413),
    ("reply", "/embed_sparse", {"model": SPLADE, "inputs": ["a"] * 50_000}, {}, 413),
    ("reply as JSON", "/v1/embeddings", {"model": EMBEDDER, "input": ["a"] * 50_000}, {}, 413),
    ("frame", "/rerank", {"model": RANKER, "query": "w" * 3800, "texts": ["d"] * 350}, {}, 413),
    ("text", "/embed", {"model": EMBEDDER, "inputs": "a" * 100_001}, {}, 413),
    ("body", "/embed", {"model": EMBEDDER, "inputs": ["a b " * 60_000] * 6}, {}, 413),
    ("input", "/embed", {"model": EMBEDDER, "inputs": []}, {}, 422),
    ("model", "/embed", {"model": "nope", "inputs": "a"}, {}, 404),
    ("task", "/rerank", {"model": EMBEDDER, "query": "a", "texts": ["b"]}, {}, 400),
    ("header fields", "/embed", {"model": EMBEDDER, "inputs": "a"}, {f"x-h{i}": "v" for i in range(150)}, 431),
    ("header bytes", "/embed", {"model": EMBEDDER, "inputs": "a"}, {"x-big": "v" * 20_000}, 400),
]


@pytest.mark.parametrize(
    ("what", "path", "body", "headers", "status"), HTTP_REFUSALS, ids=[r[0] for r in HTTP_REFUSALS]
)
def test_every_http_refusal_answers_within_a_second(
    costs: Costs, what: str, path: str, body: dict[str, Any], headers: dict[str, str], status: int
) -> None:
    with costs.http(timeout=10) as http:
        reply, took = _timed(lambda: http.post(path, json=body, headers=headers))
    assert reply.status_code == status, (what, reply.text[:300])
    assert took < 1.0, (what, took)


def test_every_zeromq_refusal_answers_within_a_second(costs: Costs) -> None:
    with costs.client(SPLADE) as client:
        client.encode_sparse(["warm"])
        refusals: list[tuple[str, Callable[[], Any], type[Exception]]] = [
            ("reply", lambda: client.encode_sparse(["a"] * 10_000), ServerError),
            ("frame", lambda: client.encode_sparse(["a" * 50_000] * 30), ValueError),
            ("model", lambda: client.encode(["a"], model="nope"), ServerError),
            ("task", lambda: client.rerank("a", ["b"]), ValueError),  # the client knows the model's task
        ]
        for what, call, error in refusals:
            started = time.monotonic()
            with pytest.raises(error):
                call()
            assert time.monotonic() - started < 1.0, what
    for header in ({"model": SPLADE, "timeout_ms": "soon"}, {"model": SPLADE, "task": "rerank"}):
        started = time.monotonic()
        refused = _raw(costs.running, p.ENCODE, header, ["a ||| b"])
        assert refused is not None and not refused.ok, header
        assert time.monotonic() - started < 1.5  # a second, and the subscription's own 0.5 s


def _raw(server: RunningServer, command: bytes, header: dict[str, Any], texts: list[str]) -> p.Reply | None:
    """One request of bare frames, and its reply if one comes within a second."""
    client = b"raw-costs"
    frames = p.encode_request(client, command, 1, {"protocol": p.PROTOCOL_VERSION, **header}, texts)
    return raw_request(server, frames, client, timeout_s=1)
