"""``malformed``: 10,000 malformed messages of 29 shapes through a raw PUSH socket; the
server's processes unchanged, and served after."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import zmq
from lib.load import wait_until

from sharing.bench import Bench, compare_vectors, log


def _malformed_shapes() -> dict[str, list[bytes]]:
    cid, ok = b"malformed-sender", json.dumps({"protocol": 1}).encode()
    text = b'["a sentence"]'

    def encode(header: bytes = ok, payload: bytes = text, rid: bytes = b"1", command: bytes = b"ENCODE") -> list[bytes]:
        return [cid, command, rid, header, payload]

    return {
        "1 frame": [b"x"],
        "3 frames": [cid, b"ENCODE", b"1"],
        "7 frames": [*encode(), b"x", b"y"],
        "empty client id": [b"", *encode()[1:]],
        "65-byte client id": [b"c" * 65, *encode()[1:]],
        "64 KiB client id": [b"c" * 2**16, *encode()[1:]],
        "unknown command": encode(command=b"ENCODEX"),
        "lower-case command": encode(command=b"encode"),
        "request id not a number": encode(rid=b"abc"),
        "request id 1.5": encode(rid=b"1.5"),
        "request id of 5,000 digits": encode(rid=b"9" * 5000),
        "non-UTF-8 header": encode(header=b"\xff\xfe{}"),
        "junk JSON header": encode(header=b"{not json"),
        "header not an object": encode(header=b"[1, 2]"),
        "wrong protocol version": encode(header=b'{"protocol": 99}'),
        "no protocol version": encode(header=b"{}"),
        "protocol 1e999": encode(header=b'{"protocol": 1e999}'),
        "deeply nested header": encode(header=b'{"a":' * 100_000),
        "non-UTF-8 payload": encode(payload=b'["\xff\xfe"]'),
        "junk JSON payload": encode(payload=b'["a",'),
        "payload not a list": encode(payload=b'{"a": 1}'),
        "payload of numbers": encode(payload=b"[1, 2, 3]"),
        "empty strings": encode(payload=b'["", " "]'),
        "lone surrogate": encode(payload=b'["\\ud800"]'),
        "deeply nested payload": encode(payload=b"[" * 100_000),
        "token lists, not tokenized": encode(payload=b'[["a"]]'),
        "is_tokenized with strings": encode(header=b'{"protocol": 1, "is_tokenized": "yes"}'),
        "STATUS, wrong version": encode(command=b"STATUS", header=b'{"protocol": 2}', payload=b""),
        "TERMINATE, wrong version": encode(command=b"TERMINATE", header=b'{"protocol": 0}', payload=b""),
    }


def malformed(bench: Bench, count: int = 10_000) -> dict[str, Any]:
    with bench.server("malformed") as server, bench.client(server) as client:
        texts = bench.texts(32, offset=21)
        reference = np.asarray(client.encode(texts))
        pids = sorted(p.pid for p in server.family())
        before = client.server_status
        shapes = _malformed_shapes()
        names = list(shapes)
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.setsockopt(zmq.SNDTIMEO, 30_000)
        sent = dict.fromkeys(names, 0)
        log(f"malformed: sending {count:,} messages of {len(names)} shapes")
        try:
            push.connect(f"tcp://127.0.0.1:{server.port}")
            for i in range(count):
                push.send_multipart(shapes[names[i % len(names)]])
                sent[names[i % len(names)]] += 1
            seen: list[int] = []

            def settled() -> bool:
                seen.append(client.server_status["requests_rejected"])
                return seen[-1] >= before["requests_rejected"] + count or (len(seen) > 6 and seen[-1] == seen[-7])

            wait_until(settled, 120, 0.5)
        finally:
            push.close(linger=0)
            context.term()
        after = client.server_status
        got = np.asarray(client.encode(texts))
        pids_after = sorted(p.pid for p in server.family())
    loop_errors = bench.server_log("malformed").count("error in the ventilator loop")
    rejected = after["requests_rejected"] - before["requests_rejected"]
    served = compare_vectors(got, reference)[0] < 1e-3
    return {
        "messages": count,
        "shapes": sent,
        "rejected": rejected,
        "rejections": after["rejections"],
        "unanswered": count - rejected,
        "pids_unchanged": pids == pids_after,
        "pids": pids,
        "ventilator_loop_exceptions": loop_errors,
        "served_after": served,
        "met": pids == pids_after and served,
    }
