"""bert-as-service 1.x's own client (``bert-serving-client`` 1.10.0, from PyPI) against a real
bertserve server, next to our own client on the same server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from bert_serving.client import BertClient as OldClient, ConcurrentBertClient as OldConcurrentClient
from bertserve.client import BertClient, protocol as p
from bertserve.server.testing.launcher import RunningServer, start_server
from zmq.utils import jsonapi

pytestmark = pytest.mark.timeout(180)

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world"]
TIMEOUT_MS = 30_000  # the old client's receive timeout: a failure raises instead of hanging
HASHING = "bertserve.server.model.interface:HashingModel"  # for the servers a test stops: no TensorFlow


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 21)))) + f" {i}" for i in range(n)]


def assert_same_vectors(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    cosine = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= 0.99999, cosine.min()


@pytest.fixture(scope="module")
def server(tiny_server: RunningServer) -> RunningServer:
    """The session's tiny BERT (``--max-seq-len 32 --max-batch-size 16 --show-tokens-to-client``):
    the old client's vectors and tokens are BERT's, pairs and all."""
    return tiny_server


@pytest.fixture(scope="module")
def ours(server: RunningServer) -> Iterator[BertClient]:
    with BertClient(**server.client_kwargs, timeout=60_000) as client:
        yield client


@pytest.fixture
def old(server: RunningServer) -> Iterator[OldClient]:
    client = OldClient(port=server.port, port_out=server.port_out, timeout=TIMEOUT_MS)  # every check on
    yield client
    client.close()


def test_vectors_equal_our_clients_in_the_same_order(old: OldClient, ours: BertClient) -> None:
    texts = sentences(40)
    assert_same_vectors(old.encode(texts), ours.encode(texts))
    assert_same_vectors(old.encode(texts[:1]), ours.encode(texts[:1]))


def test_a_request_larger_than_max_batch_size(old: OldClient, ours: BertClient) -> None:
    texts = sentences(300, seed=1)  # max_batch_size 16: about 19 mini-jobs
    assert_same_vectors(old.encode(texts), ours.encode(texts))


def test_pre_tokenized_input(old: OldClient, ours: BertClient) -> None:
    tokens = [["hello", "world"], ["the", "quick", "brown", "fox"], ["jumps"]]
    got = old.encode(tokens, is_tokenized=True)
    assert_same_vectors(got, ours.encode(tokens, is_tokenized=True))
    assert_same_vectors(got, ours.encode(["hello world", "the quick brown fox", "jumps"]))


def test_show_tokens_when_the_server_shows_them(old: OldClient, ours: BertClient) -> None:
    assert old.token_info_available  # read from show_tokens_to_client
    texts = ["hello world", "the fox ||| the dog"]
    vectors, tokens = old.encode(texts, show_tokens=True)
    want_vectors, want_tokens = ours.encode(texts, show_tokens=True)
    assert (
        tokens
        == want_tokens
        == [["[CLS]", "hello", "world", "[SEP]"], ["[CLS]", "the", "fox", "[SEP]", "the", "dog", "[SEP]"]]
    )
    assert_same_vectors(vectors, want_vectors)


def test_non_blocking_requests_and_encode_async(old: OldClient, ours: BertClient) -> None:
    batches = [sentences(1 + i % 5, seed=100 + i) for i in range(12)]
    for batch in batches:
        assert old.encode(batch, blocking=False) is None
    results = old.fetch_all(sort=True)
    assert len(results) == len(batches)
    for batch, got in zip(batches, results, strict=True):
        assert_same_vectors(got, ours.encode(batch))

    first_id = old.request_id + 1
    responses = sorted(old.encode_async(iter(batches), max_num_batch=8), key=lambda r: r.id)
    assert [r.id for r in responses] == list(range(first_id, first_id + 8))
    for batch, response in zip(batches, responses, strict=False):
        assert_same_vectors(response.embedding, ours.encode(batch))


def test_server_config_and_status(old: OldClient, ours: BertClient) -> None:
    config = old.server_config
    assert config["server_version"] == "1.10.0" and config["bertserve_version"] == ours.server_config["server_version"]
    assert (config["max_seq_len"], config["show_tokens_to_client"]) == (32, True)
    assert (config["pooling_strategy"], config["pooling_layer"]) == ("REDUCE_MEAN", [-2])
    assert (config["num_worker"], config["max_batch_size"], config["client"]) == (1, 16, old.identity.decode())
    old.encode(sentences(3))
    status = old.server_status
    assert status["server_version"] == "1.10.0" and status["statistic"]["num_data_request"] >= 1
    assert status["requests_served"] >= 1 and status["workers"][0]["jobs_done"] >= 1


def test_the_old_concurrent_client_from_sixteen_threads(server: RunningServer, ours: BertClient) -> None:
    batches = {i: sentences(1 + (i * 7) % 12, seed=1000 + i) for i in range(16)}
    want = {i: ours.encode(batch) for i, batch in batches.items()}
    pool = OldConcurrentClient(max_concurrency=16, port=server.port, port_out=server.port_out, timeout=TIMEOUT_MS)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            for _ in range(3):
                assert_same_vectors(pool.encode(batches[i]), want[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        pool.close()
    assert not errors, errors[0]


def test_a_legacy_and_a_current_client_at_once_each_get_their_own(old: OldClient, server: RunningServer) -> None:
    batches = [sentences(1 + i % 7, seed=2000 + i) for i in range(30)]
    with BertClient(**server.client_kwargs, timeout=60_000) as reference:
        want = [reference.encode(batch) for batch in batches]
    outcome: dict[str, Any] = {}

    def current() -> None:
        try:
            with BertClient(**server.client_kwargs, timeout=60_000) as client:
                ids = [client.encode(batch, blocking=False) for batch in reversed(batches)]
                got = dict(zip(ids, client.fetch_all(sort=True), strict=True))
                outcome["current"] = [got[i] for i in reversed(ids)]
        except BaseException as exc:
            outcome["current"] = exc

    thread = threading.Thread(target=current)
    thread.start()
    for batch in batches:
        old.encode(batch, blocking=False)
    legacy_got = old.fetch_all(sort=True)
    thread.join(120)
    assert not isinstance(outcome["current"], BaseException), outcome["current"]
    for got_old, got_current, expected in zip(legacy_got, outcome["current"], want, strict=True):
        assert_same_vectors(got_old, expected)
        assert_same_vectors(got_current, expected)
    assert not old.pending_response and not old.pending_request  # nothing of anyone else's came in


@pytest.mark.parametrize(
    ("payload", "count", "message"),
    [
        (["fine", ""], 2, r"bertserve error \(input\): texts\[1\] is empty"),
        ({"texts": ["a"]}, 1, r"\(protocol\): malformed request: the payload of ENCODE must be a JSON list"),
        ("a string", 1, "the payload of ENCODE must be a JSON list"),
        (["a", ["b"]], 2, r"texts\[1\] must be a string; not list"),
        (["a", "b"], 3, "the header says 3 inputs; the payload holds 2"),
    ],
)
def test_bad_requests_raise_at_once_and_others_are_served(
    old: OldClient, server: RunningServer, ours: BertClient, payload: Any, count: int, message: str
) -> None:
    """What the old client's own checks stop, sent past them through its own socket; the
    answer is read by its own code, as a reply to ``encode`` is."""
    texts = sentences(40, seed=9)
    with OldClient(port=server.port, port_out=server.port_out, timeout=TIMEOUT_MS) as other:
        other.encode(texts, blocking=False)  # in flight while the bad request is answered
        request_id = old._send(jsonapi.dumps(payload), count)
        began = time.monotonic()
        with pytest.raises(TypeError, match=message):
            old._recv_ndarray(request_id)
        assert time.monotonic() - began < 5  # an answer, not the old client's timeout
        (got,) = other.fetch_all()
    want = ours.encode(texts)
    assert_same_vectors(got, want)
    assert_same_vectors(old.encode(texts), want)


def test_the_server_stops_on_termination_as_on_terminate(tiny_google: str) -> None:
    server = start_server("--model-dir", tiny_google, "--model-class", HASHING, "--max-seq-len", "32")
    try:
        with zmq.Context() as context, context.socket(zmq.PUSH) as push:  # as bert-serving-terminate sends it
            push.linger = 1000
            push.connect(f"tcp://127.0.0.1:{server.port}")
            push.send_multipart([b"0", b"TERMINATION", b"0", b"0"])
        assert server.process.wait(60) == 0
    finally:
        server.stop()


def test_with_legacy_clients_off_their_messages_are_malformed(tiny_google: str) -> None:
    server = start_server(
        "--model-dir", tiny_google, "--model-class", HASHING, "--max-seq-len", "32", "--legacy-clients", "false"
    )
    old = OldClient(port=server.port, port_out=server.port_out, ignore_all_checks=True, timeout=TIMEOUT_MS)
    try:
        reply = None
        deadline = time.monotonic() + 10
        while reply is None and time.monotonic() < deadline:  # until our reply gets past ZeroMQ's slow joiner
            old._send(b"SHOW_CONFIG")
            if old.receiver.poll(200):
                reply = p.decode_reply(old.receiver.recv_multipart())  # our layout, not the old client's
        assert reply is not None and not reply.ok
        assert reply.header["kind"] == "protocol" and "a request has 5 frames" in reply.header["error"]
    finally:
        old.close()
        server.stop()
    assert "rejected a malformed request" in server.tail(200)
