"""The sink: reassembles each request from its parts and publishes it whole.

Parts arrive from workers as job results; one job may carry rows of several requests and
one request may be spread over several jobs and workers. A row counts once: a job that is
delivered twice (its worker died after sending the result, and it ran again elsewhere) can
neither complete a request early nor overwrite it. Each request is published once, on its
client's topic, when every row is in; a request that can no longer complete (its job
failed, its deadline passed, assembling it failed) gets an error reply instead of silence.

Replies leave through :mod:`.replies`: published by topic on an ``XPUB`` without CURVE,
routed to the connections of the key that owns them on a ``ROUTER`` under CURVE. Each
client's queue is bounded by ``reply_hwm`` messages: a reply past that (its client stopped
reading) is dropped, and its client is told so by an error as soon as it reads again.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq
from bertserve.client import protocol as p

from ... import metrics
from ...config.server import ServerConfig
from ..protocol import formats, wire
from .replies import Replies, open_replies

logger = logging.getLogger("bertserve.sink")

_ORPHAN_TTL = 30.0  # seconds a result may wait for its request's registration
_MAX_ORPHAN_KEYS = 10_000
_CLOSED_TTL = 120.0  # seconds the key of an answered request is remembered, so late parts are dropped


class _BadParts(ValueError):
    """A result does not fit the request it names."""


class _TooManyDimensions(ValueError):
    """A request asked for more dimensions than the model's vectors have."""


@dataclass
class _Pending:
    client: bytes
    request_id: int
    count: int
    show_tokens: bool
    deadline: float
    admitted: float = field(default_factory=time.monotonic)
    parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (rows, vectors)
    tokens: list[Any] | None = None
    token_count: int = 0  # tokens of the rows placed, [CLS] and [SEP] included
    chunked: int = 0  # rows placed that were encoded in windows (long_inputs=chunk)
    version: int | None = None  # the model version its rows are computed with, pinned at admission
    format: formats.ReplyFormat = formats.NATIVE  # how its replies are laid out, chosen at admission
    dimensions: int | None = None  # keep the first k dimensions of each vector
    renormalize: bool = False  # and scale them back to unit length (the model's output is normalized)
    model: str = ""  # the served model it runs on: a label of its metrics
    filled: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.filled = np.zeros(self.count, bool)

    @property
    def complete(self) -> bool:
        return bool(self.filled.all())

    def add(
        self, rows: np.ndarray, vectors: np.ndarray, tokens: list[Any] | None, counts: np.ndarray | None = None
    ) -> None:
        """Place the rows not placed yet; rows already in are duplicates and are skipped.
        ``counts`` holds each row's tokens and whether it was chunked (0 or 1)."""
        if len(rows) != len(vectors) or (len(rows) and (rows.min() < 0 or rows.max() >= self.count)):
            raise _BadParts(f"rows {rows[:8].tolist()}... do not fit a request of {self.count}")
        if self.parts and (vectors.ndim, vectors.shape[2:]) != (self.parts[0][1].ndim, self.parts[0][1].shape[2:]):
            raise _BadParts(f"vectors of shape {vectors.shape} do not match {self.parts[0][1].shape}")
        new = ~self.filled[rows]
        if not new.any():
            return
        rows, vectors = rows[new], vectors[new]
        self.filled[rows] = True
        if counts is not None and len(counts) == len(new):
            self.token_count += int(counts[new, 0].sum())
            self.chunked += int(counts[new, 1].sum())
        self.parts.append((rows, vectors))
        if self.show_tokens and tokens is not None:
            if self.tokens is None:
                self.tokens = [None] * self.count
            for row, row_tokens in zip(
                rows.tolist(), [t for t, keep in zip(tokens, new, strict=True) if keep], strict=True
            ):
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
        return out if self.dimensions is None else self._cut(out)

    def _cut(self, out: np.ndarray) -> np.ndarray:
        """The first ``dimensions`` of each vector (Matryoshka), at unit length again where
        the model's vectors were."""
        k = self.dimensions
        assert k is not None
        if k > out.shape[-1]:
            raise _TooManyDimensions(
                f"dimensions={k} is more than this model's {out.shape[-1]} dimensions: ask for 1 to {out.shape[-1]}"
            )
        cut = np.ascontiguousarray(out[..., :k])
        if self.renormalize:
            norms = np.linalg.norm(cut.astype(np.float32), axis=-1, keepdims=True)
            cut = (cut / np.maximum(norms, 1e-12)).astype(out.dtype)
        return cut


class Sink:
    """Runs in its own process: PULL from the ventilator and the workers, replies to clients (:mod:`.replies`)."""

    def __init__(
        self, config: ServerConfig, pull_address: str, context: zmq.Context, extra_keys: frozenset[bytes] = frozenset()
    ) -> None:
        self.config = config
        self.authenticator: Any = None
        self.pull = context.socket(zmq.PULL)
        self.pull.linger = 0
        try:
            self.pull.bind(pull_address)
            keys = None
            if config.curve_dir is not None:
                from ...security import load_curve_dir, start_authenticator

                keys = load_curve_dir(config.curve_dir)
                self.authenticator = start_authenticator(context, keys, extra_keys)
            self.replies: Replies = open_replies(config, context, keys)
        except BaseException:  # or context.term() would wait for these forever
            self.pull.close()
            if self.authenticator is not None:
                self.authenticator.stop()
            raise
        self.pending: dict[str, _Pending] = {}
        self.orphans: dict[str, list[tuple[float, np.ndarray, np.ndarray, list[Any] | None, np.ndarray | None]]] = {}
        self.closed: OrderedDict[str, float] = OrderedDict()  # answered keys -> when
        self.served = 0
        self.failed = 0
        self.failures: Counter[str] = Counter()  # the requests failed, by kind
        self.started = time.time()
        self.running = True
        self._handlers: dict[bytes, Callable[[list[Any]], None]] = {
            wire.REGISTER: self._on_register,
            wire.PUBLISH: self._on_publish,
            wire.FAIL: self._on_fail,
            p.STATUS: self._on_status,
            wire.RESULT: self._on_result,
            wire.JOB_ERROR: self._on_job_error,
            wire.STOP: self._on_stop,
        }
        self._frame_counts = {
            wire.REGISTER: 1,
            wire.PUBLISH: -1,
            wire.FAIL: 1,
            p.STATUS: 4,
            wire.RESULT: 3,
            wire.JOB_ERROR: 2,
            wire.STOP: 0,
        }

    def close(self) -> None:
        self.pull.close()
        self.replies.close()
        if self.authenticator is not None:
            self.authenticator.stop()

    def run(self, grace_s: float = 0.0) -> None:
        """Serve until STOP. A sink started in place of one that died first waits ``grace_s``
        for clients to subscribe again (under CURVE: to announce their routes, which clients
        waiting for a reply do every second), so the error replies waiting for it reach them."""
        until = time.monotonic() + grace_s
        while time.monotonic() < until:
            if self.replies.socket.poll(50):
                self.replies.read()
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        poller.register(self.replies.socket, zmq.POLLIN)  # subscriptions or announcements
        next_sweep = time.monotonic()
        while self.running:
            events = dict(poller.poll(100))
            if self.replies.socket in events:
                self.replies.read()
            if self.pull in events:
                for _ in range(1000):
                    try:
                        frames = self.pull.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._handle(frames)
            now = time.monotonic()
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + 0.1
        for key in list(self.pending):
            self._fail(key, "the server is shutting down", "shutdown")
        self.replies.flush()

    def _handle(self, frames: list[zmq.Frame]) -> None:
        try:
            kind, rest = wire.split_message([f.bytes for f in frames], self._frame_counts)
            self._handlers[kind](rest)
        except p.ProtocolError as exc:
            logger.error("dropped a malformed internal message: %s", exc)
        except Exception:
            logger.exception("error while handling a %r message", bytes(frames[0].bytes[:16]))

    # -- messages ------------------------------------------------------------------------

    def _on_register(self, rest: list[Any]) -> None:
        info = p.loads(rest[0])
        key = info["key"]
        if key in self.pending:
            logger.error("request %s is already pending; ignoring a second registration", key)
            return
        self.closed.pop(key, None)
        timeout_s = info.get("timeout_s", self.config.request_timeout_ms / 1000)
        deadline = time.monotonic() + float(timeout_s)
        pending = _Pending(
            bytes.fromhex(info["client"]),
            int(info["request_id"]),
            int(info["count"]),
            bool(info.get("show_tokens")),
            deadline,
        )
        if "dimensions" in info:
            pending.dimensions = int(info["dimensions"])
            pending.renormalize = bool(info.get("renormalize"))
        version = info.get("version")
        pending.version = version if isinstance(version, int) else self.config.version_number
        pending.format = formats.named(str(info.get("format", "native")))
        pending.model = str(info.get("model", ""))
        self.pending[key] = pending
        for _, rows, vectors, tokens, counts in self.orphans.pop(key, []):
            self._add(key, pending, rows, vectors, tokens, counts)
        self._maybe_publish(key)

    def _on_publish(self, rest: list[Any]) -> None:
        if len(rest) < 2:
            raise p.ProtocolError(f"PUBLISH has {len(rest)} frames, expected at least 2")
        fmt = formats.named(rest[0])
        self.replies.send(rest[1:], fmt)

    def _on_fail(self, rest: list[Any]) -> None:
        info = p.loads(rest[0])
        for key in info["keys"]:
            self._fail(key, info["error"], info.get("kind", "error"))

    def _on_status(self, rest: list[Any]) -> None:
        name, client, request_id, raw = rest
        fmt = formats.named(name)
        status = p.loads(raw)
        status.update(
            requests_served=self.served,
            requests_failed=self.failed,
            requests_expired=self.failures[p.EXPIRED],
            requests_in_flight=len(self.pending),
        )
        self.replies.send(fmt.status(client, int(request_id), status), fmt)

    def _on_result(self, rest: list[Any]) -> None:
        _, raw_header, buffer = rest
        header = p.loads(raw_header)
        vectors = p.array_from_buffer(header, buffer)
        tokens = header.get("tokens")
        counts = _row_counts(header, len(vectors))
        version = header.get("model_version")
        offset = 0
        for part in header["parts"]:
            rows = np.asarray(part["rows"], dtype=np.int64)
            chunk = vectors[offset : offset + len(rows)]
            chunk_tokens = tokens[offset : offset + len(rows)] if tokens is not None else None
            part_counts = counts[offset : offset + len(rows)] if counts is not None else None
            offset += len(rows)
            key = part["key"]
            pending = self.pending.get(key)
            if pending is None:
                if key not in self.closed:
                    self._keep_orphan(key, rows, chunk, chunk_tokens, part_counts)
                continue
            if isinstance(version, int) and pending.version is not None and version != pending.version:
                logger.error("a result for %s came from model version %d, not %d", key, version, pending.version)
                self._fail(
                    key,
                    f"the server computed part of this request with model version {version}, not "
                    f"{pending.version}; please retry",
                    "internal",
                )
                continue
            self._add(key, pending, rows, chunk, chunk_tokens, part_counts)
            self._maybe_publish(key)

    def _keep_orphan(
        self, key: str, rows: np.ndarray, vectors: np.ndarray, tokens: list[Any] | None, counts: np.ndarray | None
    ) -> None:
        if key not in self.orphans and len(self.orphans) >= _MAX_ORPHAN_KEYS:
            logger.warning("too many results for unknown requests; dropping those for %s", key)
            return
        self.orphans.setdefault(key, []).append((time.monotonic(), rows, vectors.copy(), tokens, counts))

    def _add(
        self, key: str, pending: _Pending, rows: np.ndarray, vectors: np.ndarray, tokens: Any, counts: Any = None
    ) -> None:
        try:
            pending.add(rows, vectors, tokens, counts)
        except _BadParts as exc:
            logger.error("a result for %s does not fit it: %s", key, exc)
            self._fail(key, f"the server produced a malformed result for this request: {exc}", "internal")

    def _on_job_error(self, rest: list[Any]) -> None:
        _, raw = rest
        info = p.loads(raw)
        for part in info["parts"]:
            self._fail(part["key"], info["error"], info.get("kind", "error"))

    def _on_stop(self, rest: list[Any]) -> None:
        self.running = False

    # -- requests ------------------------------------------------------------------------

    def _maybe_publish(self, key: str) -> None:
        pending = self.pending.get(key)
        if pending is None or not pending.complete:
            return
        try:
            array = pending.assemble()
            header = p.array_header(array)
            header["token_count"] = pending.token_count
            header["chunked"] = pending.chunked
            if pending.version is not None:
                header["model_version"] = pending.version
            if pending.model:
                header["model"] = pending.model
            if pending.show_tokens:
                header["tokens"] = pending.tokens
            frames = pending.format.vectors(pending.client, pending.request_id, array, header)
        except _TooManyDimensions as exc:
            self._fail(key, str(exc), "input")
            return
        except Exception as exc:
            logger.exception("could not assemble the reply to %s", key)
            self._fail(key, f"the server could not assemble the reply: {exc}", "internal")
            return
        del self.pending[key]
        self._close(key)
        self.replies.send(frames, pending.format)
        self.served += 1
        _count(pending, "ok")

    def _fail(self, key: str, error: str, kind: str) -> None:
        pending = self.pending.pop(key, None)
        if pending is None:
            return
        self._close(key)
        self.failed += 1
        self.failures[kind] += 1
        reply = pending.format.error(pending.client, pending.request_id, error, kind)
        self.replies.send(reply, pending.format)
        _count(pending, kind)

    def _close(self, key: str) -> None:
        self.closed[key] = time.monotonic()
        self.orphans.pop(key, None)

    def _sweep(self, now: float) -> None:
        self.replies.release_due(now)
        for key in [k for k, v in self.pending.items() if v.deadline <= now]:
            pending = self.pending[key]
            self._fail(
                key,
                f"the request expired: it did not complete within its deadline, "
                f"{pending.deadline - pending.admitted:.3g} s after it arrived (the client's timeout, at most "
                "the server's --request-timeout-ms); its queued work was dropped",
                p.EXPIRED,
            )
        for key in [k for k, parts in self.orphans.items() if parts[0][0] + _ORPHAN_TTL <= now]:
            logger.warning("dropped results for unknown request %s", key)
            del self.orphans[key]
        while self.closed and next(iter(self.closed.values())) + _CLOSED_TTL <= now:
            self.closed.popitem(last=False)


def _row_counts(header: dict[str, Any], rows: int) -> np.ndarray | None:
    """Each row's token count and whether it was chunked, as ``[rows, 2]``; None if the
    worker did not say (the reply then counts no tokens)."""
    lengths, windows = header.get("lengths"), header.get("windows")
    if not isinstance(lengths, list) or len(lengths) != rows:
        return None
    counts = np.zeros((rows, 2), np.int64)
    counts[:, 0] = np.asarray(lengths, dtype=np.int64)
    if isinstance(windows, list) and len(windows) == rows:
        counts[:, 1] = np.asarray(windows, dtype=np.int64) > 1
    return counts


def _count(pending: _Pending, outcome: str) -> None:
    path = metrics.path_of(pending.client)
    metrics.REQUESTS.labels(path, outcome, pending.model).inc()
    metrics.REQUEST_SECONDS.labels(path, pending.model).observe(time.monotonic() - pending.admitted)


def run_sink(
    config: ServerConfig,
    pull_address: str,
    log_level: int,
    grace_s: float = 0.0,
    extra_keys: frozenset[bytes] = frozenset(),
) -> None:
    """Entry point of the sink process."""
    from ...logs import child_logging

    child_logging(log_level)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server process decides when we stop
    context = zmq.Context()
    sink = None
    try:
        sink = Sink(config, pull_address, context, extra_keys)
        logger.debug("sink %d publishing on port %d", os.getpid(), config.port_out)
        sink.run(grace_s)
    except zmq.ZMQError as exc:
        logger.error("the sink cannot bind port %d: %s", config.port_out, exc)
        raise SystemExit(3) from None
    except (ValueError, OSError) as exc:
        logger.error("the sink cannot start: %s", exc)
        raise SystemExit(3) from None
    except KeyboardInterrupt:
        pass
    finally:
        if sink is not None:
            sink.close()
        context.term()
