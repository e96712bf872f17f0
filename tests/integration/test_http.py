"""The HTTP front end, end to end: real servers with ``--http-port``, spoken to by the
official ``openai`` package and by ``httpx``, checked against ``BertClient`` over ZeroMQ."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import time
from collections.abc import Iterator

import httpx
import numpy as np
import psutil
import pytest
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer, free_port, metric_total, start_server
from faulty_model import SLOW_WORD, SlowStartModel, pythonpath_env, sentences, wait_for
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

KEY = "test-key-0123456789"
MODEL = "tiny-bert"


class HTTPServer:
    def __init__(self, running: RunningServer, http_port: int) -> None:
        self.running = running
        self.url = f"http://127.0.0.1:{http_port}"
        self.http_port = http_port

    def http(self, key: str | None = KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def bert_client(self) -> BertClient:
        return BertClient(**self.running.client_kwargs, timeout=60_000)


def serve_http(*args: str, expect_ready: bool = True, env: dict[str, str] | None = None) -> HTTPServer:
    port = free_port()
    running = start_server("--http-port", str(port), *args, expect_ready=expect_ready, env=env)
    return HTTPServer(running, port)


@pytest.fixture(scope="module")
def server(tiny_google: str, session_graph_dir: str) -> Iterator[HTTPServer]:
    running = serve_http(
        "--model-dir",
        tiny_google,
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        "32",
        "--max-latency-ms",
        "2",
        "--api-key",
        KEY,
        "--served-model-name",
        MODEL,
        "--model-alias",
        "text-embedding-3-small",
        "--max-request-size",
        "2000",
    )
    yield running
    running.running.stop()


def metric_values(server: HTTPServer, key: str | None = KEY) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with server.http(key) as http:
        text = http.get("/metrics").raise_for_status().text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


# -- the openai package -------------------------------------------------------------------


def test_the_openai_package_gets_bertclients_vectors(server: HTTPServer) -> None:
    openai = OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    texts = sentences(1000, seed=3)
    with server.bert_client() as bc:
        expected = bc.encode(texts)

    one = openai.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    assert one.model == MODEL and len(one.data) == 1 and one.data[0].index == 0
    np.testing.assert_allclose(one.data[0].embedding, expected[0], rtol=0, atol=1e-5)
    with server.bert_client() as bc:
        _, tokens = bc.encode(texts[:2], show_tokens=True)
    assert one.usage.prompt_tokens == one.usage.total_tokens == len(tokens[0])
    two = openai.embeddings.create(model=MODEL, input=texts[:2])
    assert two.usage.prompt_tokens == len(tokens[0]) + len(tokens[1])

    many = openai.embeddings.create(model="text-embedding-3-small", input=texts, encoding_format="float")
    assert [d.index for d in many.data] == list(range(1000))
    np.testing.assert_allclose(np.array([d.embedding for d in many.data]), expected, rtol=0, atol=1e-5)

    packed = openai.embeddings.create(model=MODEL, input=texts[:50], encoding_format="base64")
    vectors = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in packed.data])
    np.testing.assert_allclose(vectors, expected[:50], rtol=0, atol=1e-5)

    default = openai.embeddings.create(model=MODEL, input=texts[:3])  # the package asks for base64 itself
    np.testing.assert_allclose(np.array([d.embedding for d in default.data]), expected[:3], rtol=0, atol=1e-5)


def test_token_ids_are_refused_unless_the_server_takes_them(server: HTTPServer) -> None:
    """Token arrays may be another tokenizer's ids (LangChain sends tiktoken's): refused by
    default, naming the fix; test_http_options covers --token-id-input."""
    with server.http() as http:
        ids = _tokenizer_ids(["hello", "world"])
        reply = http.post("/v1/embeddings", json={"model": MODEL, "input": [ids]})
        assert reply.status_code == 422, reply.text
        assert "check_embedding_ctx_length=False" in reply.json()["error"]["message"]


def _tokenizer_ids(tokens: list[str]) -> list[int]:
    from bertserve.server.testing.tiny_bert import tiny_vocab

    vocab = tiny_vocab()
    return [vocab.index(token) for token in tokens]


# -- the other APIs ------------------------------------------------------------------------


def test_tei_embed_and_bert_as_service_encode(server: HTTPServer) -> None:
    texts = sentences(20, seed=4)
    with server.http() as http, server.bert_client() as bc:
        expected = bc.encode(texts)
        norms = np.linalg.norm(expected, axis=1, keepdims=True)
        embed = http.post("/embed", json={"inputs": texts})
        assert embed.status_code == 200, embed.text
        np.testing.assert_allclose(np.array(embed.json()), expected / norms, atol=1e-5)
        raw = http.post("/embed", json={"inputs": texts[0], "normalize": False}).json()
        np.testing.assert_allclose(raw[0], expected[0], atol=1e-5)

        long = " ".join(["hello world"] * 40)
        too_long = http.post("/embed", json={"inputs": ["fine", long]})
        assert too_long.status_code == 413 and "inputs[1]" in too_long.json()["error"], too_long.text
        assert http.post("/embed", json={"inputs": ["fine", long], "truncate": True}).status_code == 200

        chunked = http.post("/embed", json={"inputs": ["fine", long], "long_inputs": "chunk"})
        assert chunked.status_code == 200 and chunked.headers["x-chunked-inputs"] == "1", chunked.text
        assert not np.allclose(
            chunked.json()[1], http.post("/embed", json={"inputs": long, "truncate": True}).json()[0]
        )
        openai_body = {"input": ["fine", long], "long_inputs": "chunk"}
        openai_chunked = http.post("/v1/embeddings", json=openai_body).json()
        assert openai_chunked["chunked_inputs"] == 1
        np.testing.assert_allclose(
            openai_chunked["data"][1]["embedding"], bc.encode([long], long_inputs="chunk")[0], atol=1e-5
        )
        bad = http.post("/v1/embeddings", json={"input": ["fine"], "long_inputs": "window"})
        assert bad.status_code == 422, bad.text

        legacy = http.post("/encode", json={"id": 7, "texts": texts})
        assert legacy.status_code == 200 and legacy.json()["id"] == 7
        np.testing.assert_allclose(np.array(legacy.json()["result"]), expected, atol=1e-5)
        tokenized = http.post("/encode", json={"id": 8, "texts": [["hello", "world"]], "is_tokenized": True})
        assert tokenized.status_code == 200, tokenized.text


def test_health_ready_status_models_and_docs(server: HTTPServer) -> None:
    with server.http(key=None) as anonymous, server.http() as http:
        assert anonymous.get("/health").json() == {"status": "ok"}
        assert anonymous.get("/ready").status_code == 200
        status = http.get("/status").json()
        assert status["ready"] is True and status["workers"], status
        models = http.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == [MODEL, "text-embedding-3-small"]
        schema = http.get("/openapi.json").json()
        for path in ("/v1/embeddings", "/v1/models", "/embed", "/encode", "/health", "/ready", "/status", "/metrics"):
            assert path in schema["paths"], path
        assert "input" in schema["components"]["schemas"]["EmbeddingRequest"]["properties"]
        assert http.get("/docs").status_code == 200


def test_a_missing_or_wrong_key_is_401(server: HTTPServer) -> None:
    body = {"model": MODEL, "input": "hello"}
    for key in (None, "wrong-key-0123456789", KEY[:-1]):
        with server.http(key=key) as http:
            reply = http.post("/v1/embeddings", json=body)
            assert reply.status_code == 401, reply.text
            assert reply.headers["www-authenticate"] == "Bearer"
            assert reply.json()["error"]["type"] == "authentication_error"
            assert http.get("/metrics").status_code == 401
    with server.http() as http:
        assert http.post("/v1/embeddings", json=body).status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"input": []}, 422, "non-empty"),
        ({"input": ["fine", "  "]}, 422, "input[1] is empty"),
        ({"input": ["fine", 3]}, 422, "input[1]"),
        ({"input": [[1, 2], "x"]}, 422, "input[1]"),
        ({"input": "x", "encoding_format": "hex"}, 422, "encoding_format"),
        ({"input": "x", "dimensions": 33}, 422, "dimensions=33"),
        ({"input": "x", "model": "gpt-4"}, 404, "gpt-4"),
        ({"model": MODEL}, 422, "input"),
        ({"input": ["x"] * 2001}, 413, "at most 2000"),
    ],
)
def test_bad_requests_get_openai_errors_naming_the_problem(
    server: HTTPServer, body: dict, status: int, words: str
) -> None:
    with server.http() as http:
        reply = http.post("/v1/embeddings", json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert words in error["message"] and error["type"], error


def test_a_body_over_the_limit_is_refused_before_it_is_read(server: HTTPServer) -> None:
    with server.http() as http:
        limit = http.get("/status").json()  # any call: the limit is the request frame's
        big = b'{"input": "' + b"a" * (80 * 2**20) + b'"}'
        reply = http.post("/v1/embeddings", content=big, headers={"content-type": "application/json"})
        assert reply.status_code == 413 and "limit" in reply.json()["error"]["message"], reply.text[:200]

        def chunks() -> Iterator[bytes]:
            yield b'{"input": "'
            for _ in range(100):
                yield b"a" * 2**20
            yield b'"}'

        chunked = http.post("/v1/embeddings", content=chunks(), headers={"content-type": "application/json"})
        assert chunked.status_code == 413, chunked.text[:200]
        assert http.post("/v1/embeddings", json={"input": "still served"}).status_code == 200
    assert limit


def test_metrics_count_each_request_once_by_path(server: HTTPServer) -> None:
    before = metric_values(server)
    with server.http() as http, server.bert_client() as bc:
        for i in range(5):
            assert http.post("/v1/embeddings", json={"input": f"metric sentence {i}"}).status_code == 200
        assert http.post("/v1/embeddings", json={"input": [""]}).status_code == 422
        for i in range(3):
            bc.encode([f"zmq metric sentence {i}", "and another"])
    after = metric_values(server)

    def delta(name: str, **labels: str) -> float:
        return metric_total(after, name, **labels) - metric_total(before, name, **labels)

    assert delta("bertserve_requests_total", path="http", outcome="ok") == 5
    assert delta("bertserve_requests_total", path="zmq", outcome="ok") == 3
    assert delta("bertserve_http_requests_total", endpoint="/v1/embeddings", status="200") == 5
    assert delta("bertserve_http_requests_total", endpoint="/v1/embeddings", status="422") == 1
    assert delta("bertserve_request_duration_seconds_count", path="http") == 5
    assert delta("bertserve_sentences_total") == 5 + 6
    assert after[("bertserve_ready", ())] == 1
    assert after[("bertserve_workers", ())] == 1
    names = {name for name, _ in after}
    for name in (
        "bertserve_queued_sentences",
        "bertserve_in_flight_requests",
        "bertserve_job_sentences_bucket",
        "bertserve_job_seconds_bucket",
        "bertserve_padding_ratio",
        "bertserve_model_info",
        "bertserve_tokens_total",
        "bertserve_http_request_duration_seconds_bucket",
    ):
        assert name in names, name


def test_64_concurrent_requests_are_all_answered_correctly(server: HTTPServer) -> None:
    batches = [sentences(1 + i % 5, seed=1000 + i) for i in range(64)]
    with server.bert_client() as bc:
        expected = [bc.encode(batch) for batch in batches]

    async def run() -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {KEY}"}
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60, limits=limits) as http:
            return await asyncio.gather(
                *(
                    http.post("/v1/embeddings", json={"input": batch, "user": f"user-{i % 8}"})
                    for i, batch in enumerate(batches)
                )
            )

    replies = asyncio.run(run())
    for reply, want in zip(replies, expected, strict=True):
        assert reply.status_code == 200, reply.text
        got = np.array([d["embedding"] for d in reply.json()["data"]])
        np.testing.assert_allclose(got, want, atol=1e-5)


def front_end(server: HTTPServer) -> psutil.Process | None:
    """The server's child process that listens on the HTTP port."""
    for child in psutil.Process(server.running.process.pid).children(recursive=True):
        try:
            connections = child.net_connections()
        except psutil.Error:
            continue
        if any(c.laddr.port == server.http_port and c.status == psutil.CONN_LISTEN for c in connections):
            return child
    return None


def test_the_http_process_never_loads_tensorflow(server: HTTPServer) -> None:
    front = front_end(server)
    assert front is not None
    mapped = [m.path for m in front.memory_maps()]
    assert mapped and not [path for path in mapped if "tensorflow" in path.lower()], "TensorFlow is loaded"


def test_a_killed_http_process_is_replaced(server: HTTPServer) -> None:
    front = front_end(server)
    assert front is not None
    front.kill()
    front.wait(10)
    replaced = wait_for(lambda: front_end(server), 30, "a new HTTP process listening")
    assert replaced.pid != front.pid
    with server.http() as http:
        reply = wait_for(lambda: _ok(http, {"input": "after the restart"}), 30, "the new HTTP process serving")
    assert len(reply.json()["data"]) == 1
    assert metric_values(server)[("bertserve_process_restarts_total", (("process", "http"),))] == 1


def _ok(http: httpx.Client, body: dict) -> httpx.Response | None:
    try:
        reply = http.post("/v1/embeddings", json=body)
    except httpx.TransportError:
        return None
    return reply if reply.status_code == 200 else None


# -- start-up and overload -------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_ready_is_503_until_a_worker_is_up_and_a_late_answer_is_504(tiny_google: str) -> None:
    server = serve_http(
        "--model-dir",
        tiny_google,
        "--model-class",
        "faulty_model:SlowStartModel",
        "--request-timeout-ms",
        "500",
        expect_ready=False,
        env=pythonpath_env(),
    )
    try:

        def probe() -> httpx.Response | None:
            try:
                return httpx.get(server.url + "/ready", timeout=2)
            except httpx.TransportError:
                return None

        first = wait_for(probe, 60, "the HTTP port answering", interval=0.05)
        assert first.status_code == 503 and "starting" in first.json()["error"]["message"], first.text
        assert httpx.get(server.url + "/health").status_code == 200
        early = httpx.post(server.url + "/v1/embeddings", json={"input": "too early"})
        assert early.status_code == 503, early.text
        server.running.wait_ready(SlowStartModel.SLOW_START_S + 60)
        assert httpx.get(server.url + "/ready").status_code == 200
        assert httpx.post(server.url + "/v1/embeddings", json={"input": "now"}).status_code == 200
        late = httpx.post(server.url + "/v1/embeddings", json={"input": f"{SLOW_WORD} takes a second"}, timeout=30)
        assert late.status_code == 504 and "deadline" in late.json()["error"]["message"], late.text
    finally:
        server.running.stop()


@pytest.mark.timeout(120)
def test_a_full_server_answers_429_with_retry_after(tiny_google: str) -> None:
    server = serve_http(
        "--model-dir",
        tiny_google,
        "--model-class",
        "faulty_model:FaultyModel",
        "--heartbeat-timeout-ms",
        "60000",
        "--max-request-size",
        "50",
        "--max-client-queued-sentences",
        "100",
        "--max-queued-sentences",
        "100",
        env=pythonpath_env(),
    )
    try:
        with server.bert_client() as bc, httpx.Client(base_url=server.url, timeout=60) as http:
            bc.encode(["warm up"])
            # its credit comes back after its answer: stopped before, the worker would hold it for good
            wait_for(lambda: not bc.server_status["jobs_in_flight"], 10, "the warm-up's credit back")
            (worker,) = [w["pid"] for w in bc.server_status["workers"]]
            os.kill(worker, signal.SIGSTOP)
            try:
                bc.encode(sentences(50, seed=0), blocking=False)
                wait_for(lambda: bc.server_status["jobs_in_flight"], 10, "the first request reaching the worker")
                for i in (1, 2):
                    bc.encode(sentences(50, seed=i), blocking=False)
                wait_for(lambda: bc.server_status["queued_sentences"] == 100, 10, "the queue filling")
                started = time.monotonic()
                reply = http.post("/v1/embeddings", json={"input": sentences(10, seed=9)})
                took = time.monotonic() - started
            finally:
                os.kill(worker, signal.SIGCONT)
            assert reply.status_code == 429, reply.text
            assert reply.headers["retry-after"] == "1" and reply.json()["error"]["type"] == "rate_limit_error"
            assert took < 5
            counted = metric_values(server, key=None)
            assert counted[("bertserve_rejections_total", (("kind", "busy"),))] == 1
            assert metric_total(counted, "bertserve_requests_total", outcome="busy", path="http") == 1
            assert len(bc.fetch_all()) == 3
            assert http.post("/v1/embeddings", json={"input": sentences(10, seed=9)}).status_code == 200
    finally:
        server.running.stop()
