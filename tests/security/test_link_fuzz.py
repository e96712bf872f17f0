"""The worker link under attack: a real head on loopback, a real host of one worker, and two
fake peers that send it over 10,000 fuzzed messages.

One peer never joins (it speaks before a valid HELLO, with other model files); the other
joins with the head's model sha256, registers four workers that ask for every credit, takes
jobs from a client's requests and answers them right, wrong (other requests, other rows, a
short buffer, a second result, a credit before its result, an error of a made-up kind) or not
at all, between messages of every kind with wrong types, infinite, NaN, negative and huge
numbers, too many and too few frames, non-JSON, unknown kinds and huge frames. Meanwhile every
answer the client gets is the right vectors or an error of a known kind, and afterwards the
head still serves the right vectors, with no traceback in its log. The random generator is
seeded: a failure replays.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from bertserve.client import BertClient, ServerError, protocol as p
from bertserve.server.model.checksum import tree_sha256
from bertserve.server.serving.protocol import wire
from bertserve.server.serving.protocol.link_bodies import ERROR_KINDS
from bertserve.server.testing.launcher import free_port, start_server, start_worker_host
from faulty_model import expected, pythonpath_env, sentences, wait_for

pytestmark = pytest.mark.timeout(180)

MODEL = "faulty_model:FaultyModel"
SEED = 20_250_611
STRANGER_MESSAGES = 4_000
JOINED_MESSAGES = 6_500
NAMES = [b"w0-1", b"w1-1", b"w2-1", b"w3-1"]  # the joined peer's workers

NUMBERS: list[Any] = [
    math.inf,
    -math.inf,
    math.nan,
    -1,
    0,
    1,
    7,
    2**31,
    2**63,
    2**64,
    10**400,
    1e308,
    -1e-308,
    0.5,
    True,
    False,
    None,
    "1",
    "",
    [],
    {},
    [1, 2],
    {"a": 1},
]
STRINGS: list[Any] = [
    "",
    "w0-1",
    "x" * 300,
    "\n\x1b[31mred",
    "../../etc/passwd",
    "/etc/passwd",
    "é" * 50,
    "\ud800",
    "1e999",
    "NaN",
]
RAW_JSON = [
    b"1e999",
    b"-1e999",
    b"NaN",
    b"Infinity",
    b"[" * 5000,
    b"{",
    b"\xff\xfe",
    b"",
    b"null",
    b"[]",
    b'"x"',
    b"{}",
    b'{"credits":1e999}',
    b'{"a":' * 3000,
]
KINDS = [
    wire.HELLO,
    wire.HEARTBEAT,
    wire.READY,
    wire.DONE,
    wire.RESULT,
    wire.JOB_ERROR,
    wire.GONE,
    wire.DRAIN,
    wire.BYE,
]
OTHER_KINDS = [
    wire.WELCOME,
    wire.JOB,
    wire.FORGET,
    wire.REFUSED,
    wire.STOP,
    b"",
    b"NOPE",
    b"\x00\xff",
    b"ready",
    b"X" * 100,
]
BAD_NAMES = [b"", b"w" * 65, b"../w0", b"w0\n", b"\xff", b"w 0"]
JOB_ERROR_KINDS = ["worker", "input", "timeout", "evil\nlabel", "x" * 200, "", "busy"]


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()  # writes NaN, Infinity and lone surrogates as a careless peer would


class Fuzzer:
    """Messages of every kind from a host, most of them broken in one way or another."""

    def __init__(self, rng: random.Random, sha: str) -> None:
        self.rng = rng
        self.sha = sha
        self.held: list[tuple[bytes, bytes, bytes, bytes]] = []  # (worker, job id, header, payload) given to us
        self.answers: dict[str, int] = {}

    def value(self) -> Any:
        return self.rng.choice(NUMBERS + STRINGS)

    def name(self) -> bytes:
        return self.rng.choice([*NAMES, b"w9-9", *BAD_NAMES])

    def job_id(self) -> bytes:
        ids = [b"1", b"999999", b"0.1", b"x", b"", b"9" * 80]
        if self.held and self.rng.random() < 0.3:
            ids.append(self.rng.choice(self.held)[1])
        return self.rng.choice(ids)

    def body(self, base: dict[str, Any]) -> bytes:
        """``base`` as JSON, with one thing wrong (or, now and then, nothing)."""
        roll = self.rng.random()
        body = dict(base)
        if roll < 0.15:
            return self.rng.choice(RAW_JSON)
        if roll < 0.55 and body:
            body[self.rng.choice(list(body))] = self.value()
        elif roll < 0.75 and body:
            del body[self.rng.choice(list(body))]
        elif roll < 0.85:
            body[self.rng.choice(["junk", "x" * 100, ""])] = self.value()
        elif roll < 0.90:
            return dumps(self.rng.choice([[body], "text", 5, None]))
        return dumps(body)

    def frames(self, kind: bytes, joined_sha: bool) -> list[bytes]:
        name, job = self.name(), self.job_id()
        if kind == wire.HELLO:
            sha = self.sha if joined_sha else f"{self.rng.getrandbits(256):064x}"
            hello = {
                "link": wire.LINK_VERSION,
                "version": "fuzz",
                "hostname": "fuzz",
                "model_sha256": sha,
                "workers": 4,
            }
            frames = [self.body(hello)]
        elif kind == wire.HEARTBEAT:
            frames = self.rng.choice([[], [name]])
        elif kind == wire.READY:
            ready = {"worker": 0, "pid": 1, "credits": 1, "device": "fuzz", "hostname": "fuzz"}
            frames = [name, self.body(ready)]
        elif kind == wire.DONE:
            frames = [
                self.body(
                    {
                        "job": job.decode(errors="replace"),
                        "worker": name.decode(errors="replace"),
                        "seconds": 0.1,
                        "tokens": 1,
                        "slots": 1,
                    }
                )
            ]
        elif kind == wire.RESULT:
            rows = self.rng.choice([1, 2, 3])
            header = {"parts": [{"key": "k#1@0", "rows": list(range(rows))}], "dtype": "float32", "shape": [rows, 16]}
            frames = [name, job, self.body(header), b"\0" * self.rng.choice([64 * rows, 0, 7, 64])]
        elif kind == wire.JOB_ERROR:
            error = {"parts": [{"key": "k#1@0", "rows": [0]}], "error": "boom", "kind": "worker"}
            frames = [name, job, self.body(error)]
        elif kind == wire.GONE:
            frames = self.rng.choice([[name], [name, b"died\n\x1b[31m"]])
        else:
            frames = []
        roll = self.rng.random()
        if roll < 0.08:
            frames = frames[: self.rng.randrange(len(frames) + 1)] if frames else [b"extra"]
        elif roll < 0.16:
            frames = frames + [b"extra"] * self.rng.randint(1, 3)
        return [kind, *frames]

    def message(self, *, joined_sha: bool) -> list[bytes]:
        roll = self.rng.random()
        if roll < 0.06:
            return [self.rng.choice(OTHER_KINDS), *[self.rng.choice(RAW_JSON) for _ in range(self.rng.randrange(4))]]
        if roll < 0.07:
            return [
                self.rng.choice([wire.READY, wire.DONE, wire.HELLO]),
                *([b"w0-1"] * (self.rng.random() < 0.5)),
                b'{"pad":"' + b"x" * (2 << 20) + b'"}',
            ]
        return self.frames(self.rng.choice(KINDS), joined_sha)

    # -- answers to the jobs the head gave us ------------------------------------------------

    def answer(self, job: tuple[bytes, bytes, bytes, bytes]) -> list[list[bytes]]:
        """How a broken (or, half of the time, a good) worker answers a job it holds."""
        worker, job_id, raw_header, payload = job
        parts = p.loads(raw_header)["parts"]
        texts = p.loads(payload)
        header = {"parts": parts, "dtype": "float32", "shape": [len(texts), 16], "truncated": [False] * len(texts)}
        vectors = np.ascontiguousarray(expected(texts), dtype=np.float32).tobytes()
        result = [wire.RESULT, worker, job_id, p.dumps(header), vectors]
        done = [wire.DONE, p.dumps({"job": job_id.decode(), "worker": worker.decode(), "seconds": 0.01})]
        other_parts = [{**part, "key": "someone-else#" + part["key"]} for part in parts]
        fewer_rows = [{**parts[0], "rows": parts[0]["rows"][:-1]}, *parts[1:]]
        choice = self.rng.choice(
            ["good", "good", "good", "other-requests", "other-rows", "short", "second", "early", "error", "gone"]
        )
        if choice == "other-rows" and len(texts) == 1:
            choice = "good"
        self.answers[choice] = self.answers.get(choice, 0) + 1
        if choice == "good":
            return [result, done]
        if choice == "other-requests":
            return [[wire.RESULT, worker, job_id, p.dumps({**header, "parts": other_parts}), vectors], done]
        if choice == "other-rows":
            shape = [len(texts) - 1, 16]
            return [
                [
                    wire.RESULT,
                    worker,
                    job_id,
                    p.dumps({**header, "parts": fewer_rows, "shape": shape, "truncated": [False] * shape[0]}),
                    vectors[: 64 * (len(texts) - 1)],
                ],
                done,
            ]
        if choice == "short":
            return [[*result[:4], vectors[:-1]], done]
        if choice == "second":
            return [result, result, done]
        if choice == "early":
            return [done, result]
        if choice == "error":
            error = {"parts": other_parts, "error": "boom\n" * 400, "kind": self.rng.choice(JOB_ERROR_KINDS)}
            return [[wire.JOB_ERROR, worker, job_id, dumps(error)], done]
        return [[wire.GONE, worker, b"it died (says the fuzz)"]]  # its jobs run elsewhere; it registers again


class Peer:
    """A fake host on a DEALER, counting what it sends."""

    def __init__(self, context: zmq.Context, port: int, identity: bytes) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.identity = identity
        self.socket.linger = 0
        self.socket.sndtimeo = 20_000  # a head that stops reading fails the test, never hangs it
        self.socket.connect(f"tcp://127.0.0.1:{port}")
        self.sent = 0

    def send(self, frames: list[bytes]) -> None:
        self.socket.send_multipart(frames)
        self.sent += 1

    def received(self) -> list[list[bytes]]:
        messages = []
        while self.socket.poll(0):
            messages.append(self.socket.recv_multipart())
        return messages

    def close(self) -> None:
        self.socket.close(linger=0)


def join(peer: Peer, fuzzer: Fuzzer, context_timeout: float = 20.0) -> None:
    peer.send(
        [
            wire.HELLO,
            p.dumps(
                {
                    "link": wire.LINK_VERSION,
                    "version": "fuzz",
                    "hostname": "fuzz",
                    "model_sha256": fuzzer.sha,
                    "workers": 4,
                }
            ),
        ]
    )
    deadline = time.monotonic() + context_timeout
    while time.monotonic() < deadline:
        if peer.socket.poll(100) and peer.socket.recv_multipart()[0] == wire.WELCOME:
            register(peer)
            return
    raise AssertionError("the head did not welcome the fake host")


def register(peer: Peer, names: list[bytes] = NAMES) -> None:
    for index, name in enumerate(names):  # each asks for far more credits than it gets
        peer.send([wire.READY, name, p.dumps({"worker": index, "pid": 1, "credits": 1_000_000, "hostname": "fuzz"})])


def test_a_fuzzed_worker_link_raises_nothing_and_the_head_serves_right_after(tiny_google: str, tmp_path: Path) -> None:
    worker_port = free_port()
    log = tmp_path / "head.log"
    head = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        MODEL,
        "--num-worker",
        "0",
        "--worker-port",
        str(worker_port),
        "--max-batch-size",
        "8",
        "--max-latency-ms",
        "1",
        "--heartbeat-timeout-ms",
        "4000",
        "--job-timeout-ms",
        "20000",
        env=pythonpath_env(),
        log_path=log,
    )
    host = None
    context = zmq.Context()
    peers: list[Peer] = []
    stop = threading.Event()
    outcomes: dict[str, int] = {}
    wrong: list[str] = []
    try:
        host = start_worker_host(worker_port, "--model-dir", tiny_google, "--model-class", MODEL, env=pythonpath_env())
        with BertClient(**head.client_kwargs, timeout=30_000) as client:
            wait_for(lambda: len(client.server_status["workers"]) == 1, 60, "the real worker registering")

        def load() -> None:  # a client whose requests the fake peer takes jobs of
            rng = np.random.default_rng(SEED)
            with BertClient(**head.client_kwargs, timeout=60_000) as client:
                while not stop.is_set():
                    texts = sentences(int(rng.integers(1, 12)), seed=int(rng.integers(1 << 30)))
                    try:
                        vectors = client.encode(texts)
                    except ServerError as exc:
                        outcomes[f"error:{exc.kind}"] = outcomes.get(f"error:{exc.kind}", 0) + 1
                        if exc.kind not in ERROR_KINDS:
                            wrong.append(repr(exc))
                        continue
                    except BaseException as exc:
                        wrong.append(repr(exc))
                        return
                    ok = np.allclose(vectors, expected(texts), atol=1e-6)
                    outcomes["ok" if ok else "wrong"] = outcomes.get("ok" if ok else "wrong", 0) + 1
                    if not ok:
                        wrong.append(f"wrong vectors for {texts}")

        sha = tree_sha256(tiny_google, None)
        rng = random.Random(SEED)
        stranger = Peer(context, worker_port, b"fuzz-stranger")
        joined = Peer(context, worker_port, b"fuzz-joined")
        peers += [stranger, joined]
        fuzzer = Fuzzer(rng, sha)
        join(joined, fuzzer)
        loaders = [threading.Thread(target=load, name=f"load-{i}", daemon=True) for i in range(2)]
        for loader in loaders:
            loader.start()
        started = time.monotonic()
        joined.send([wire.RESULT, b"w0-1", b"1", b'{"pad":"' + b"x" * (65 << 20) + b'"}', b""])  # past the header bound
        while stranger.sent < STRANGER_MESSAGES or joined.sent < JOINED_MESSAGES:
            if stranger.sent < STRANGER_MESSAGES:
                stranger.send(fuzzer.message(joined_sha=False))
                stranger.received()  # BYE and REFUSED: it is not joined
            if joined.sent >= JOINED_MESSAGES:
                continue
            for message in joined.received():
                if message[0] == wire.JOB:
                    fuzzer.held.append((message[1], message[2], message[3], message[4]))
                elif message[0] == wire.WELCOME:
                    register(joined)
                elif message[0] == wire.FORGET and message[1] in NAMES:
                    register(joined, [message[1]])  # "replaced": the same name joins again
                elif message[0] == wire.BYE:  # the head forgot us (a BYE of ours, say): join again
                    join(joined, fuzzer)
            if fuzzer.held and rng.random() < 0.5:
                job = fuzzer.held.pop(rng.randrange(len(fuzzer.held)))
                answer = fuzzer.answer(job)
                for frames in answer:
                    joined.send(frames)
                if answer[-1][0] == wire.GONE:
                    register(joined, [job[0]])
            elif rng.random() < 0.05:
                joined.send([wire.HEARTBEAT, rng.choice(NAMES)])
            elif not fuzzer.held and rng.random() < 0.3:
                joined.socket.poll(2)  # a moment for the client's next jobs
            else:
                message = fuzzer.message(joined_sha=True)
                if message[0] not in (wire.BYE, wire.DRAIN) or rng.random() < 0.05:
                    joined.send(message)
        fuzzed_s = time.monotonic() - started
        joined.send([wire.BYE])  # what it still holds runs on the real worker
        stop.set()
        for loader in loaders:
            loader.join(90)
            assert not loader.is_alive(), "a request of the client during the fuzz did not end"
        sent = stranger.sent + joined.sent
        assert sent >= 10_000
        assert not wrong, wrong[:5]
        assert outcomes.get("ok", 0) > 0 and sum(fuzzer.answers.values()) >= 20, (outcomes, fuzzer.answers)

        texts = sentences(300, seed=11)
        with BertClient(**head.client_kwargs, timeout=60_000) as client:
            wait_for(lambda: len(client.server_status["workers"]) == 1, 30, "only the real worker being left")
            np.testing.assert_allclose(client.encode(texts), expected(texts), atol=1e-6)
            np.testing.assert_allclose(client.encode(texts[:7]), expected(texts[:7]), atol=1e-6)
        assert head.process.poll() is None and host.process.poll() is None
    finally:
        stop.set()
        for peer in peers:
            peer.close()
        context.term()
        if host is not None:
            host.stop()
        head.stop()
    text = log.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in text, text[text.index("Traceback") - 2000 :][:6000]
    refusals = [line for line in text.splitlines() if "bertserve.link" in line and " ERROR " in line]
    print(
        f"{sent} fuzzed messages in {fuzzed_s:.1f} s; jobs answered {fuzzer.answers}; client outcomes {outcomes}; "
        f"the head logged {text.count(chr(10))} lines, {len(refusals)} of them refusals"
    )
    assert any("more refused in the last second" in line for line in refusals)
    assert len(refusals) <= fuzzed_s + 10, "the refusals flooded the log"  # one a second, counting the rest
