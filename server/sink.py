"""The sink: reassembles each request from its parts and publishes it whole.

Parts arrive from workers as job results; one job may carry rows of several requests and
one request may be spread over several jobs and workers. Each request is published once,
on its client's topic, when every row is in; a request that can no longer complete (its
job failed, or its deadline passed) gets an error reply instead of silence.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq
from bertserve.client import protocol as p

from .config import ServerConfig

logger = logging.getLogger("bertserve.sink")

_ORPHAN_TTL = 30.0  # seconds a result may wait for its request's registration


@dataclass
class _Pending:
    client: bytes
    request_id: int
    count: int
    show_tokens: bool
    deadline: float
    parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (rows, vectors)
    tokens: list[Any] | None = None
    filled: int = 0

    def add(self, rows: np.ndarray, vectors: np.ndarray, tokens: list[Any] | None) -> None:
        self.parts.append((rows, vectors))
        self.filled += len(rows)
        if self.show_tokens and tokens is not None:
            if self.tokens is None:
                self.tokens = [None] * self.count
            for row, row_tokens in zip(rows.tolist(), tokens, strict=True):
                self.tokens[row] = row_tokens

    def assemble(self) -> np.ndarray:
        first = self.parts[0][1]
        tail = list(first.shape[1:])
        if first.ndim == 3:  # per-token vectors: parts may be padded to different widths
            tail[0] = max(vectors.shape[1] for _, vectors in self.parts)
        out = np.zeros([self.count, *tail], dtype=first.dtype)
        for rows, vectors in self.parts:
            if vectors.ndim == 3:
                out[rows, : vectors.shape[1]] = vectors
            else:
                out[rows] = vectors
        return out


class Sink:
    """Runs in its own process: PULL from the ventilator and the workers, PUB to clients."""

    def __init__(self, config: ServerConfig, pull_address: str, context: zmq.Context) -> None:
        self.config = config
        self.pull = context.socket(zmq.PULL)
        self.pull.linger = 0
        self.pull.bind(pull_address)
        self.pub = context.socket(zmq.PUB)
        self.pub.linger = 1000
        self.pub.sndhwm = 0  # never drop a reply because a client is slow to read
        self.pub.bind(f"tcp://{config.bind}:{config.port_out}")
        self.pending: dict[str, _Pending] = {}
        self.orphans: dict[str, list[tuple[float, np.ndarray, np.ndarray, list[Any] | None]]] = {}
        self.served = 0
        self.failed = 0
        self.started = time.time()
        self.running = True
        self._handlers: dict[bytes, Callable[[list[Any]], None]] = {
            p.REGISTER: self._on_register,
            p.PUBLISH: self._on_publish,
            p.FAIL: self._on_fail,
            p.STATUS: self._on_status,
            p.RESULT: self._on_result,
            p.JOB_ERROR: self._on_job_error,
            p.STOP: self._on_stop,
        }
        self._frame_counts = {
            p.REGISTER: 1, p.PUBLISH: -1, p.FAIL: 1, p.STATUS: 3, p.RESULT: 3, p.JOB_ERROR: 2, p.STOP: 0,
        }  # fmt: skip

    def close(self) -> None:
        self.pull.close()
        self.pub.close()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        next_sweep = time.monotonic()
        while self.running:
            if poller.poll(100):
                frames = self.pull.recv_multipart(copy=False)
                try:
                    kind, rest = p.split_message([f.bytes for f in frames], self._frame_counts)
                    self._handlers[kind](rest)
                except p.ProtocolError as exc:
                    logger.error("dropped a malformed internal message: %s", exc)
                except Exception:
                    logger.exception("error while handling a %r message", bytes(frames[0].bytes[:16]))
            now = time.monotonic()
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + 0.1
        for key in list(self.pending):
            self._fail(key, "the server is shutting down", "shutdown")

    # -- messages ------------------------------------------------------------------------

    def _on_register(self, rest: list[Any]) -> None:
        info = p.loads(rest[0])
        key = info["key"]
        deadline = time.monotonic() + float(info.get("timeout_s", self.config.request_timeout_ms / 1000))
        pending = _Pending(info["client"].encode(), int(info["request_id"]), int(info["count"]),
                           bool(info.get("show_tokens")), deadline)  # fmt: skip
        self.pending[key] = pending
        for _, rows, vectors, tokens in self.orphans.pop(key, []):
            pending.add(rows, vectors, tokens)
        self._maybe_publish(key)

    def _on_publish(self, rest: list[Any]) -> None:
        self.pub.send_multipart(rest)

    def _on_fail(self, rest: list[Any]) -> None:
        info = p.loads(rest[0])
        for key in info["keys"]:
            self._fail(key, info["error"], info.get("kind", "error"))

    def _on_status(self, rest: list[Any]) -> None:
        client, request_id, raw = rest
        status = p.loads(raw)
        status.update(
            requests_served=self.served,
            requests_failed=self.failed,
            requests_in_flight=len(self.pending),
        )
        self.pub.send_multipart(p.encode_reply(client, int(request_id), True, status))

    def _on_result(self, rest: list[Any]) -> None:
        _, raw_header, buffer = rest
        header = p.loads(raw_header)
        vectors = p.array_from_buffer(header, buffer)
        tokens = header.get("tokens")
        offset = 0
        for part in header["parts"]:
            rows = np.asarray(part["rows"], dtype=np.int64)
            chunk = vectors[offset : offset + len(rows)]
            chunk_tokens = tokens[offset : offset + len(rows)] if tokens is not None else None
            offset += len(rows)
            key = part["key"]
            pending = self.pending.get(key)
            if pending is None:
                self.orphans.setdefault(key, []).append((time.monotonic(), rows, chunk, chunk_tokens))
                continue
            pending.add(rows, chunk, chunk_tokens)
            self._maybe_publish(key)

    def _on_job_error(self, rest: list[Any]) -> None:
        _, raw = rest
        info = p.loads(raw)
        for part in info["parts"]:
            self._fail(part["key"], info["error"], info.get("kind", "error"))

    def _on_stop(self, rest: list[Any]) -> None:
        self.running = False

    # -- requests ------------------------------------------------------------------------

    def _maybe_publish(self, key: str) -> None:
        pending = self.pending[key]
        if pending.filled < pending.count:
            return
        del self.pending[key]
        array = pending.assemble()
        header = p.array_header(array)
        if pending.show_tokens:
            header["tokens"] = pending.tokens
        self.pub.send_multipart(p.encode_reply(pending.client, pending.request_id, True, header, array.data))
        self.served += 1

    def _fail(self, key: str, error: str, kind: str) -> None:
        pending = self.pending.pop(key, None)
        if pending is None:
            return
        self.failed += 1
        self.pub.send_multipart(p.error_reply(pending.client, pending.request_id, error, kind))

    def _sweep(self, now: float) -> None:
        for key in [k for k, v in self.pending.items() if v.deadline <= now]:
            self._fail(key, "the request did not complete before its deadline", "timeout")
        for key in [k for k, parts in self.orphans.items() if parts[0][0] + _ORPHAN_TTL <= now]:
            logger.warning("dropped results for unknown request %s", key)
            del self.orphans[key]


def run_sink(config: ServerConfig, pull_address: str, log_level: int) -> None:
    """Entry point of the sink process."""
    from .logs import child_logging

    child_logging(log_level)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server process decides when we stop
    context = zmq.Context()
    sink = None
    try:
        sink = Sink(config, pull_address, context)
        logger.debug("sink %d publishing on port %d", os.getpid(), config.port_out)
        sink.run()
    except zmq.ZMQError as exc:
        logger.error("the sink cannot bind port %d: %s", config.port_out, exc)
        raise SystemExit(3) from None
    except KeyboardInterrupt:
        pass
    finally:
        if sink is not None:
            sink.close()
        context.term()
