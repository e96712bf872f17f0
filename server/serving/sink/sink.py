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
from typing import Any

import numpy as np
import zmq
from bertserve.client import protocol as p

from ... import metrics, tracing
from ...config.server import ServerConfig
from ...config.telemetry import Telemetry
from ...logs import Refusals
from ..protocol import formats, sink as messages
from .pending import BadParts, Pending, TooManyDimensions, row_counts
from .replies import Replies, open_replies

logger = logging.getLogger("bertserve.sink")

_ORPHAN_TTL = 30.0  # seconds a result may wait for its request's registration
_MAX_ORPHAN_KEYS = 10_000
_CLOSED_TTL = 120.0  # seconds the key of an answered request is remembered, so late parts are dropped


class Sink:
    """Runs in its own process: PULL from the ventilator and the workers, replies to clients (:mod:`.replies`)."""

    def __init__(
        self,
        config: ServerConfig,
        pull_address: str,
        context: zmq.Context,
        extra_keys: frozenset[bytes] = frozenset(),
        *,
        version: int | None = None,
    ) -> None:
        self.config = config
        self.version = version  # the default model's version: a request's unless it says
        self.authenticator: Any = None
        self.pull = context.socket(zmq.PULL)
        self.pull.linger = 0
        try:
            self.pull.bind(pull_address)
            keys = None
            if config.security.curve_dir is not None:
                from ...security import load_curve_dir, start_authenticator

                keys = load_curve_dir(config.security.curve_dir)
                self.authenticator = start_authenticator(context, keys, extra_keys)
            self.replies: Replies = open_replies(config, context, keys)
        except BaseException:  # or context.term() would wait for these forever
            self.pull.close()
            if self.authenticator is not None:
                self.authenticator.stop()
            raise
        self.pending: dict[str, Pending] = {}
        self.traced: dict[str, tuple[str, int]] = {}  # traced requests pending: traceparent, when registered (ns)
        self.orphans: dict[
            str, list[tuple[float, np.ndarray, np.ndarray, list[Any] | None, np.ndarray | None, bool]]
        ] = {}
        self.closed: OrderedDict[str, float] = OrderedDict()  # answered keys -> when
        self.served = 0
        self.failed = 0
        self.failures: Counter[str] = Counter()  # the requests failed, by kind
        self.started = time.time()
        self.running = True
        self._refusals = Refusals(logger, level=logging.ERROR)
        self._handlers: dict[type, Callable[[Any], None]] = {
            messages.Register: self._on_register,
            messages.Publish: self._on_publish,
            messages.Fail: self._on_fail,
            messages.Status: self._on_status,
            messages.Result: self._on_result,
            messages.JobError: self._on_job_error,
            messages.Stop: self._on_stop,
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
        """One message, parsed at the edge (:mod:`..protocol.sink`): one that does not follow
        its schema is logged and dropped; nothing raises past here."""
        try:
            message = messages.read([frame.bytes for frame in frames])
        except p.ProtocolError as exc:
            self._refusals.log("dropped a malformed internal message: %s", exc)
            return
        try:
            self._handlers[type(message)](message)
        except Exception:
            logger.exception("error while handling a %s message", type(message).__name__)

    # -- messages ------------------------------------------------------------------------

    def _on_register(self, message: messages.Register) -> None:
        key = message.key
        if key in self.pending:
            logger.error(
                "request %s is already pending; ignoring a second registration", key, extra={"request_id": key}
            )
            return
        self.closed.pop(key, None)
        pending = Pending(
            message.client_id,
            message.request_id,
            message.count,
            message.show_tokens,
            message.deadline,
            admitted=message.admitted,
            version=message.version if message.version is not None else self.version,
            format=formats.named(message.format),
            dimensions=message.dimensions,
            normalize=message.normalize,
            model=message.model,
        )
        self.pending[key] = pending
        if message.trace is not None and tracing.enabled():
            self.traced[key] = (message.trace, time.time_ns())
        for _, rows, vectors, tokens, counts, normalizes in self.orphans.pop(key, []):
            self._add(key, pending, rows, vectors, tokens, counts, normalizes)
        self._maybe_publish(key)

    def _on_publish(self, message: messages.Publish) -> None:
        self.replies.send(message.frames, message.format)

    def _on_fail(self, message: messages.Fail) -> None:
        for key in message.keys:
            self._fail(key, message.error, message.kind)

    def _on_status(self, message: messages.Status) -> None:
        status = dict(message.status)
        status.update(
            requests_served=self.served,
            requests_failed=self.failed,
            requests_expired=self.failures[p.EXPIRED],
            requests_in_flight=len(self.pending),
        )
        fmt = message.format
        self.replies.send(fmt.status(message.client, message.request_id, status), fmt)

    def _on_result(self, message: messages.Result) -> None:
        header = message.header
        vectors = np.frombuffer(message.buffer, dtype=header.dtype).reshape(header.shape)
        tokens = header.tokens
        counts = row_counts(header, len(vectors))
        version = header.model_version
        offset = 0
        for part in header.parts:
            rows = np.asarray(part.rows, dtype=np.int64)
            chunk = vectors[offset : offset + len(rows)]
            chunk_tokens = tokens[offset : offset + len(rows)] if tokens is not None else None
            part_counts = counts[offset : offset + len(rows)]
            offset += len(rows)
            key = part.key
            pending = self.pending.get(key)
            if pending is None:
                if key not in self.closed:
                    self._keep_orphan(key, rows, chunk, chunk_tokens, part_counts, bool(header.normalizes))
                continue
            if version is not None and pending.version is not None and version != pending.version:
                logger.error(
                    "a result for %s came from model version %d, not %d",
                    key,
                    version,
                    pending.version,
                    extra={"request_id": key},
                )
                self._fail(
                    key,
                    f"the server computed part of this request with model version {version}, not "
                    f"{pending.version}; please retry",
                    "internal",
                )
                continue
            self._add(key, pending, rows, chunk, chunk_tokens, part_counts, bool(header.normalizes))
            self._maybe_publish(key)

    def _keep_orphan(
        self,
        key: str,
        rows: np.ndarray,
        vectors: np.ndarray,
        tokens: list[Any] | None,
        counts: np.ndarray | None,
        normalizes: bool,
    ) -> None:
        if key not in self.orphans and len(self.orphans) >= _MAX_ORPHAN_KEYS:
            logger.warning(
                "too many results for unknown requests; dropping those for %s", key, extra={"request_id": key}
            )
            return
        self.orphans.setdefault(key, []).append((time.monotonic(), rows, vectors.copy(), tokens, counts, normalizes))

    def _add(
        self,
        key: str,
        pending: Pending,
        rows: np.ndarray,
        vectors: np.ndarray,
        tokens: Any,
        counts: Any = None,
        normalizes: bool = False,
    ) -> None:
        try:
            pending.add(rows, vectors, tokens, counts, normalizes=normalizes)
        except BadParts as exc:
            logger.error("a result for %s does not fit it: %s", key, exc, extra={"request_id": key})
            self._fail(key, f"the server produced a malformed result for this request: {exc}", "internal")

    def _on_job_error(self, message: messages.JobError) -> None:
        for part in message.body.parts:
            self._fail(part.key, message.body.error, message.body.kind)

    def _on_stop(self, message: messages.Stop) -> None:
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
            header["truncated"] = np.flatnonzero(pending.truncated).tolist()  # the inputs cut, by index
            if pending.version is not None:
                header["model_version"] = pending.version
            if pending.model:
                header["model"] = pending.model
            if pending.show_tokens:
                header["tokens"] = pending.tokens
            frames = pending.format.vectors(pending.client, pending.request_id, array, header)
        except TooManyDimensions as exc:
            self._fail(key, str(exc), "input")
            return
        except Exception as exc:
            logger.exception("could not assemble the reply to %s", key, extra={"request_id": key})
            self._fail(key, f"the server could not assemble the reply: {exc}", "internal")
            return
        del self.pending[key]
        self._close(key)
        traced = self.traced.pop(key, None)
        self.replies.send(frames, pending.format)
        self.served += 1
        _count(pending, "ok")
        _trace(traced, pending, "ok")

    def _fail(self, key: str, error: str, kind: str) -> None:
        pending = self.pending.pop(key, None)
        if pending is None:
            return
        self._close(key)
        traced = self.traced.pop(key, None)
        self.failed += 1
        self.failures[kind] += 1
        reply = pending.format.error(pending.client, pending.request_id, error, kind)
        self.replies.send(reply, pending.format)
        _count(pending, kind)
        _trace(traced, pending, kind, error)

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
            logger.warning("dropped results for unknown request %s", key, extra={"request_id": key})
            del self.orphans[key]
        while self.closed and next(iter(self.closed.values())) + _CLOSED_TTL <= now:
            self.closed.popitem(last=False)


def _trace(traced: tuple[str, int] | None, pending: Pending, outcome: str, error: str | None = None) -> None:
    """The span of a traced request in the sink (``traced``: its traceparent and when its
    REGISTER came, taken from the book as the request left it): until its reply was sent."""
    if traced is not None:
        attributes = {"bertserve.model": pending.model, "bertserve.rows": pending.count, "bertserve.outcome": outcome}
        tracing.record("bertserve.sink.reply", [traced[0]], traced[1], time.time_ns(), attributes, error=error)


def _count(pending: Pending, outcome: str) -> None:
    path = metrics.path_of(pending.client)
    metrics.REQUESTS.labels(path, outcome, pending.model).inc()
    metrics.REQUEST_SECONDS.labels(path, pending.model).observe(time.monotonic() - pending.admitted)


def run_sink(
    config: ServerConfig,
    pull_address: str,
    telemetry: Telemetry,
    grace_s: float = 0.0,
    extra_keys: frozenset[bytes] = frozenset(),
    version: int | None = None,
) -> None:
    """Entry point of the sink process; ``version`` is the default model's version served."""
    from ...logs import child_telemetry

    child_telemetry(telemetry, "sink")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server process decides when we stop
    context = zmq.Context()
    sink = None
    try:
        sink = Sink(config, pull_address, context, extra_keys, version=version)
        logger.debug("sink %d publishing on port %d", os.getpid(), config.ports.out)
        sink.run(grace_s)
    except zmq.ZMQError as exc:
        logger.error("the sink cannot bind port %d: %s", config.ports.out, exc)
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
