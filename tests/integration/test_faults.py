"""Faults, end to end: workers killed, frozen, crashed or hung by their input; a sink killed;
a flood of malformed messages; a model that cannot load. The server must answer every
request (with its vectors or with an error naming the cause) and keep serving.

Most tests serve :class:`faulty_model.FaultyModel` (a numpy model that crashes on the word
``CRASHME`` and hangs on ``HANGME``), which starts in about two seconds; the kill -9 test
serves the tiny BERT. Destructive tests get a server of their own, so restarts and their
back-off do not leak from one test into the next.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psutil
import pytest
import zmq
from bertserve.client import BertClient, ServerError, ServerTimeoutError, protocol as p
from bertserve.server.testing.launcher import RunningServer, start_server
from faulty_model import BREAK_FILE_ENV, CRASH_EXIT_CODE, expected, pythonpath_env, sentences, wait_for
from raw_link import raw_link, raw_request

FAULTY = "faulty_model:FaultyModel"


def worker_pids(client: BertClient) -> list[int]:
    return [w["pid"] for w in client.server_status["workers"]]


def family_pids(server: RunningServer) -> set[int]:
    return {process.pid for process in server.family()}


def sink_pid(server: RunningServer) -> int | None:
    """The child that listens on the results port."""
    for process in server.family()[1:]:
        try:
            connections = process.net_connections("tcp")
        except psutil.Error:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == server.port_out for c in connections):
            return process.pid
    return None


def gone(pid: int, timeout: float) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


@pytest.fixture
def faulty(tiny_google: str) -> Iterator[Callable[..., RunningServer]]:
    """Start FaultyModel servers with extra flags; every one is stopped after the test."""
    started: list[RunningServer] = []

    def start(*flags: str, env: dict[str, str] | None = None) -> RunningServer:
        server = start_server(
            "--model-dir",
            tiny_google,
            "--max-seq-len",
            "32",
            "--model-class",
            FAULTY,
            *flags,
            env=pythonpath_env(**(env or {})),
            timeout=60,
        )
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


# -- workers -----------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_kill_9_of_a_worker_mid_request_loses_and_mixes_up_nothing(tiny_google: str) -> None:
    server = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        FAULTY,  # HashingModel's 3000 vectors take a second or more: long enough to kill a worker mid-request
        "--max-seq-len",
        "32",
        "--max-batch-size",
        "8",
        "--num-worker",
        "2",
        env=pythonpath_env(),
    )
    try:
        texts = sentences(3000, seed=21)
        with (
            BertClient(**server.client_kwargs, timeout=120_000) as client,
            BertClient(**server.client_kwargs, timeout=10_000) as watcher,
        ):
            client.encode(texts, blocking=False)

            def a_busy_worker() -> int | None:
                workers = watcher.server_status["workers"]
                return next((w["pid"] for w in workers if w["jobs_in_flight"] > 0), None)

            victim = wait_for(a_busy_worker, 30, "a worker taking a job")
            psutil.Process(victim).kill()
            (during,) = client.fetch_all()
            wait_for(lambda: len(pids := worker_pids(watcher)) == 2 and victim not in pids, 60, "the worker's restart")
            after = client.encode(texts)  # the same request, with no fault
            status = watcher.server_status
        assert during.shape == (3000, 16) and np.isfinite(during).all()
        np.testing.assert_allclose(during, after, atol=1e-5)
        np.testing.assert_allclose(during, expected(texts), atol=1e-5)
        assert status["requests_failed"] == 0, status
    finally:
        server.stop()


@pytest.mark.timeout(90)
def test_a_frozen_worker_holding_a_job_is_replaced_and_the_job_answered(faulty) -> None:
    server = faulty("--num-worker", "1", "--heartbeat-timeout-ms", "3000")
    texts = sentences(40, seed=2)
    with (
        BertClient(**server.client_kwargs, timeout=30_000) as client,
        BertClient(**server.client_kwargs, timeout=10_000) as watcher,
    ):
        client.encode(["warm up"])
        (victim,) = worker_pids(watcher)
        os.kill(victim, signal.SIGSTOP)
        try:
            started = time.monotonic()
            request_id = client.encode(texts, blocking=False)
            held = wait_for(lambda: watcher.server_status["jobs_in_flight"], 5, "the job reaching the frozen worker")
            assert held == 1
            (got,) = client.fetch_all()
            elapsed = time.monotonic() - started
        finally:
            if not gone(victim, 0):
                os.kill(victim, signal.SIGCONT)
        assert request_id >= 0
        np.testing.assert_allclose(got, expected(texts), atol=1e-6)
        assert elapsed >= 2.5, f"answered in {elapsed:.1f} s: the frozen worker cannot have run it"
        assert gone(victim, 10), "the frozen worker was not killed"
        (replacement,) = worker_pids(watcher)
        assert replacement != victim
        np.testing.assert_allclose(client.encode(texts[:5]), expected(texts[:5]), atol=1e-6)


@pytest.mark.timeout(90)
def test_a_job_that_hangs_its_worker_twice_fails_and_others_are_served_meanwhile(faulty) -> None:
    server = faulty("--num-worker", "2", "--job-timeout-ms", "1500")
    kwargs = server.client_kwargs
    with BertClient(**kwargs, timeout=40_000) as victim, BertClient(**kwargs, timeout=10_000) as other:
        started = time.monotonic()
        victim.encode(["this one HANGME forever"], blocking=False)
        wait_for(lambda: other.server_status["jobs_in_flight"], 1, "the hanging job starting")  # alone, not merged
        served = 0
        while time.monotonic() - started < 1.2:  # before the first kill: the other worker serves
            texts = sentences(3, seed=served)
            np.testing.assert_allclose(other.encode(texts), expected(texts), atol=1e-6)
            served += 1
        with pytest.raises(ServerError) as caught:
            victim.fetch_all()
        elapsed = time.monotonic() - started
        assert caught.value.kind == "worker", caught.value
        assert "has run for" in caught.value.message and "2 times" in caught.value.message, caught.value.message
        assert elapsed < 30
        assert served >= 3
        texts = sentences(20, seed=99)
        np.testing.assert_allclose(victim.encode(texts), expected(texts), atol=1e-6)
        wait_for(lambda: len(other.server_status["workers"]) == 2, 20, "both hung workers' replacements")


@pytest.mark.timeout(90)
def test_a_request_that_crashes_its_worker_fails_alone(faulty) -> None:
    """A poison request, merged with another client's: the poison gets a ``worker`` error
    naming the crash, the other client its vectors, and the server keeps serving."""
    server = faulty("--num-worker", "1", "--max-batch-size", "64")
    kwargs = server.client_kwargs
    with (
        BertClient(**kwargs, timeout=30_000) as poison,
        BertClient(**kwargs, timeout=30_000) as bystander,
        BertClient(**kwargs, timeout=30_000) as slow,
    ):
        bystander.encode(["warm up"])
        innocent = sentences(7, seed=3)
        started = time.monotonic()
        slow.encode(["SLOWME please"], blocking=False)  # the worker is busy for a second...
        wait_for(lambda: bystander.server_status["jobs_in_flight"], 1, "the slow job starting", interval=0.02)
        poison.encode(["a fine sentence", "CRASHME right now", "another fine one"], blocking=False)
        bystander.encode(innocent, blocking=False)  # ...so these two gather into one job
        (got,) = bystander.fetch_all()
        slow.fetch_all()
        with pytest.raises(ServerError) as caught:
            poison.fetch_all()
        elapsed = time.monotonic() - started
        np.testing.assert_allclose(got, expected(innocent), atol=1e-6)
        assert caught.value.kind == "worker", caught.value
        assert f"exit code {CRASH_EXIT_CODE}" in caught.value.message, caught.value.message
        assert elapsed < 20
        after = sentences(30, seed=4)
        np.testing.assert_allclose(poison.encode(after), expected(after), atol=1e-6)
        status = bystander.server_status
    assert status["requests_failed"] >= 1 and len(status["workers"]) == 1, status


# -- malformed input ---------------------------------------------------------------------


def malformed_messages(count: int, seed: int = 0) -> Iterator[list[bytes]]:
    """Messages of assorted wrong shapes: frame counts, JSON, ids, commands, encodings.
    None is a valid TERMINATE (this server would obey it)."""
    rng = random.Random(seed)
    header = p.dumps({"protocol": p.PROTOCOL_VERSION})
    ids = [b"junk", b"\xff\xfe\x00\x01", "café".encode(), b"x" * 64, b"x" * 65, b"", b"\x00"]
    texts = [{}, "a string", 1, None, [None], [1], [[1]], [{"a": 1}], [""], ["x" * 1001], ["\ud800"]]
    headers = [[], None, 1, "s", {"protocol": 99}, {"protocol": "1"}, {"protocol": 1, "is_tokenized": True}]
    shapes: list[Callable[[bytes], list[bytes]]] = [
        lambda c: [c],
        lambda c: [c, b"ENCODE"],
        lambda c: [c, b"ENCODE", b"1", header],
        lambda c: [c, b"ENCODE", b"1", header, b'["x"]', b"extra"],
        lambda c: [c] * rng.randint(7, 40),
        lambda c: [c, b"ENCODE", b"2", b"{not json", b"[]"],
        lambda c: [c, b"ENCODE", b"3", b"\xff\xfe\xfd", b'["x"]'],
        lambda c: [c, b"ENCODE", b"4", header, b"\x80\x81\xff"],
        lambda c: [c, b"ENCODE", b"9" * rng.choice([5000, 20_000]), header, b'["x"]'],
        lambda c: [c, b"ENCODE", rng.choice([b"-", b"1e9", b"0x10", b"\xff", b""]), header, b'["x"]'],
        lambda c: [c, rng.choice([b"BOGUS", b"encode", b"", b"TERMINATE\x00", b"\xff"]), b"5", header, b""],
        lambda c: [c, b"ENCODE", b"6", p.dumps(rng.choice(headers)), b'["x"]'],
        lambda c: [c, b"ENCODE", b"7", header, json.dumps(rng.choice(texts)).encode()],  # "\\ud800" escaped
        lambda c: [c, b"ENCODE", b"7", header, b'["\xed\xa0\x80"]'],  # a surrogate in UTF-8: not UTF-8
        lambda c: [c, b"ENCODE", b"8", header, b"[" * 10_000],  # nested past Python's recursion limit
        lambda c: [c, b"STATUS", b"not a number", header, b""],
        lambda c: [c, b"CONFIG", b"11", b"[]", b""],
        lambda c: [c, b"TERMINATE", b"12", b"{}", b""],  # no protocol version: refused
    ]
    for _ in range(count):
        yield rng.choice(shapes)(rng.choice(ids))


@pytest.mark.timeout(120)
def test_ten_thousand_malformed_messages_kill_nothing(faulty) -> None:
    server = faulty("--num-worker", "1", "--max-text-chars", "1000")
    before = family_pids(server)
    with BertClient(**server.client_kwargs, timeout=20_000) as client:
        rejected_before = client.server_status["requests_rejected"]
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        try:
            push.linger = 30_000  # closing waits until every message is sent
            push.sndtimeo = 30_000
            push.connect(f"tcp://127.0.0.1:{server.port}")
            for frames in malformed_messages(10_000):
                push.send_multipart(frames)
        finally:
            push.close()
            context.term()

        def read_them_all() -> dict[str, Any] | None:
            first = client.server_status
            time.sleep(0.3)
            second = client.server_status
            rejected = second["requests_rejected"] - rejected_before
            return second if rejected >= 9000 and first["requests_rejected"] == second["requests_rejected"] else None

        status = wait_for(read_them_all, 60, "9000 rejections of the flood")
        texts = sentences(25, seed=6)
        np.testing.assert_allclose(client.encode(texts), expected(texts), atol=1e-6)
    assert server.process.poll() is None
    assert family_pids(server) == before, "a process died or was replaced"
    assert status["rejections"].get("protocol", 0) >= 5000, status["rejections"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "what, request_id, payload",
    [
        ("an id of 5000 digits", b"9" * 5000, b'["x"]'),
        ("JSON nested past the recursion limit", b"7", b"[" * 10_000),
    ],
)
def test_a_malformed_request_with_a_client_id_gets_a_protocol_error(faulty, what, request_id, payload) -> None:
    server = faulty("--num-worker", "1")
    client = b"nasty"
    frames = [client, p.ENCODE, request_id, p.dumps({"protocol": p.PROTOCOL_VERSION}), payload]
    reply = raw_request(server, frames, client)
    assert reply is not None, f"no error reply to a request with {what}"
    assert not reply.ok and reply.header.get("kind") == "protocol", reply.header


# -- the sink ----------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_kill_9_of_the_sink_fails_in_flight_requests_and_the_server_recovers(faulty) -> None:
    server = faulty("--num-worker", "1", "--heartbeat-timeout-ms", "60000")
    texts = sentences(30, seed=7)
    with BertClient(**server.client_kwargs, timeout=30_000) as client:
        np.testing.assert_allclose(client.encode(texts), expected(texts), atol=1e-6)
        (worker,) = worker_pids(client)
        sink = sink_pid(server)
        assert sink is not None and sink != worker
        os.kill(worker, signal.SIGSTOP)  # holds the next request in flight
        try:
            client.encode(sentences(10, seed=8), blocking=False)
            wait_for(lambda: client.server_status["jobs_in_flight"], 5, "the job reaching the frozen worker")
            psutil.Process(sink).kill()
            with pytest.raises(ServerError) as caught:
                client.fetch_all()
        finally:
            os.kill(worker, signal.SIGCONT)
        assert caught.value.kind == "internal", caught.value
        new_sink = wait_for(lambda: (pid := sink_pid(server)) not in (None, sink) and pid, 20, "a new sink")
        np.testing.assert_allclose(client.encode(texts), expected(texts), atol=1e-6)  # the old client reconnects
        with BertClient(**server.client_kwargs, timeout=10_000) as fresh:
            np.testing.assert_allclose(fresh.encode(texts[:3]), expected(texts[:3]), atol=1e-6)
            assert worker_pids(fresh) == [worker]
    assert sink_pid(server) == new_sink and server.process.poll() is None


@pytest.mark.timeout(60)
def test_a_request_answered_before_the_sink_died_is_not_answered_again(faulty) -> None:
    """Each request gets one reply: a sink restart must not send an error for a request
    whose vectors were already published."""
    server = faulty("--num-worker", "1")
    client = b"answered-once"
    with raw_link(server, client) as (push, sub):
        push.send_multipart(p.encode_request(client, p.ENCODE, 1, {}, ["hello world"]))
        assert sub.poll(10_000), "no reply"
        first = p.decode_reply(sub.recv_multipart())
        assert first.ok
        sink = sink_pid(server)
        assert sink is not None
        psutil.Process(sink).kill()
        wait_for(lambda: sink_pid(server) not in (None, sink), 20, "a new sink")
        again = p.decode_reply(sub.recv_multipart()) if sub.poll(5000) else None
    assert again is None, f"request 1 was answered twice: then {again.header}"


# -- giving up ---------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_a_model_that_cannot_load_fails_the_start_with_its_cause(tiny_google: str) -> None:
    started = time.monotonic()
    server = start_server(
        "--model-dir",
        tiny_google,
        "--max-seq-len",
        "32",
        "--model-class",
        "faulty_model:BrokenModel",
        "--max-restarts",
        "2",
        env=pythonpath_env(),
        expect_ready=False,
    )
    try:
        code = server.process.wait(60)
    finally:
        server.terminate()
        server.wait_stopped(10)
    output = "".join(server.output)
    assert code != 0
    assert "BrokenModel cannot be loaded" in output, server.tail(40)
    assert "bertserve: error:" in output and "worker 0" in output, server.tail(40)
    assert server.ready_line is None
    assert time.monotonic() - started < 60


@pytest.mark.timeout(90)
def test_the_server_gives_up_after_max_restarts_failures_in_a_row(faulty, tmp_path) -> None:
    flag = tmp_path / "break"
    server = faulty(
        "--model-class",
        "faulty_model:BreakableModel",
        "--num-worker",
        "1",
        "--max-restarts",
        "2",
        env={BREAK_FILE_ENV: str(flag)},
    )
    with BertClient(**server.client_kwargs, timeout=10_000) as client:
        client.encode(["fine"])
        (worker,) = worker_pids(client)
    flag.touch()  # from now on no worker can load the model
    started = time.monotonic()
    psutil.Process(worker).kill()
    code = server.process.wait(60)
    elapsed = time.monotonic() - started
    output = server.tail(200)
    assert code != 0, output
    assert "worker 0 failed 3 times in a row" in output, output
    assert "bertserve: error:" in output, output
    assert elapsed < 30, f"gave up after {elapsed:.1f} s"
    with pytest.raises(ServerTimeoutError):
        BertClient(**server.client_kwargs, timeout=1000)
