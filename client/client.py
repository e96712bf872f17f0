"""``BertClient``: sentences in, vectors out, from a bertserve server over ZeroMQ.

The client pushes requests to the server's PULL port and reads replies from its reply port,
subscribed to its own identity (under CURVE: on a DEALER that announces it, see
:func:`~bertserve.client.security.reply_socket`). Every wait is a poll with a deadline (the ZeroMQ guide's
Lazy Pirate client), so a server that is down or gone gives :class:`ServerTimeoutError`
within ``timeout`` milliseconds instead of a hang. A reply to a request nobody waits for any
more (it timed out) is recognised by its request id and dropped.

With ``server_key`` and ``client_cert`` both sockets use CURVE, and the client's identity is
its public key, ``":"`` and a suffix, the only form a CURVE server lets it use. Monitors on
both sockets turn a refused handshake into :class:`AuthenticationError` rather than a
timeout.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import re
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Collection, Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, overload

import numpy as np
import zmq

from ._version import __version__
from .errors import (
    BertClientError,
    ClientClosedError,
    ConcurrentUseError,
    ProtocolVersionError,
    ServerBusyError,
    ServerError,
    ServerTimeoutError,
)
from .protocol import (
    CONFIG,
    ENCODE,
    PROTOCOL_VERSION,
    RELOAD,
    STATUS,
    TERMINATE,
    ProtocolError,
    Reply,
    check_texts,
    decode_reply,
    encode_request,
)
from .security import (
    CURVE_KEY_LENGTH,
    HandshakeWatch,
    KeySource,
    announce,
    load_public_key,
    load_secret_cert,
    reply_socket,
)
from .terminal import progress_bar

logger = logging.getLogger("bertserve.client")

DEFAULT_HOST = "localhost"
DEFAULT_PORT = 5555
DEFAULT_TIMEOUT_MS = 60_000
MAX_IDENTITY_BYTES = 64

Embedding: TypeAlias = "np.ndarray | list[Any]"
"""One request's vectors: an array, or nested lists with ``output_fmt="list"``."""

# The handshake re-sends CONFIG this often: until the server's PUB has seen our
# subscription (ZeroMQ's slow joiner), a reply published to us is silently lost.
_HANDSHAKE_RESEND_S = 0.2
# Requests encode_async, and encode with show_progress, keep in flight at once.
_ASYNC_WINDOW = 4
_ANNOUNCE_EVERY_MS = 1000  # how often a client waiting for replies announces its route again (CURVE)
_REPLY_INFO = ("token_count", "chunked", "model_version")  # reply header fields kept in last_info
# encode(show_progress=True) sends its input in chunks of this many of the server's mini-jobs
# (max_batch_size texts each): a chunk is still a bulk request the server sorts by length and
# cuts, and with a window of chunks in flight the server holds the next ones while we read.
_PROGRESS_CHUNK_JOBS = 4
_PROGRESS_CHUNK_DEFAULT = 1024  # when the server's config does not give max_batch_size
_TEXT_INDEX = re.compile(r"\btexts\[(\d+)\]")  # how an error names an input: texts[3]
_CONCURRENT_USE = (
    "this BertClient is in use by another thread; use ConcurrentBertClient to share one server between threads"
)


@dataclass(frozen=True)
class EncodeResult:
    """The answer to one non-blocking request, as :meth:`BertClient.fetch` yields it."""

    id: int
    embedding: Embedding
    tokens: list[list[str]] | None = None
    info: dict[str, Any] = field(default_factory=dict)  # token_count, chunked: see BertClient.last_info


@dataclass
class _Pending:
    show_tokens: bool
    fetchable: bool  # sent with blocking=False, so fetch() hands it out


def check_timeout(timeout: object) -> float:
    """``timeout`` in milliseconds as a float; it must be finite and positive."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of milliseconds, not {type(timeout).__name__}")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(
            f"timeout must be a finite number of milliseconds > 0, not {timeout!r}: "
            "a bertserve client never waits forever"
        )
    return float(timeout)


def _check_port(name: str, port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"{name} must be an int, not {type(port).__name__}")
    if not 0 < port < 65536:
        raise ValueError(f"{name} must be 1 to 65535, not {port}")
    return port


def _check_port_out(port: int, port_out: object) -> int:
    """The reply port: ``port_out``, or ``port + 1`` when it is ``None``."""
    if port_out is not None:
        return _check_port("port_out", port_out)
    if port == 65535:
        raise ValueError("port_out defaults to port + 1, and port is 65535: pass port_out")
    return port + 1


def _check_identity(identity: bytes | str | None, public_key: bytes | None = None) -> bytes:
    """The bytes replies are addressed to. Under CURVE that is ``public_key + b":" + suffix``
    (``identity`` is the suffix, by default 16 random hex digits): the server lets a client
    subscribe only to identities of its own key."""
    if identity is None:
        identity = uuid.uuid4().hex[: 16 if public_key else 32].encode("ascii")
    if isinstance(identity, str):
        identity = identity.encode("utf-8")
    if not isinstance(identity, bytes):
        raise TypeError(f"identity must be bytes or str, not {type(identity).__name__}")
    if not 0 < len(identity) <= MAX_IDENTITY_BYTES:
        # An empty identity would subscribe to every client's replies.
        raise ValueError(f"identity must be 1 to {MAX_IDENTITY_BYTES} bytes, not {len(identity)}")
    if public_key is None:
        return identity
    full = public_key + b":" + identity
    if len(full) > MAX_IDENTITY_BYTES:
        most = MAX_IDENTITY_BYTES - CURVE_KEY_LENGTH - 1
        raise ValueError(
            f"identity {identity!r} is {len(identity)} bytes: under CURVE the client id is the public key "
            f"(40 bytes), ':' and the identity, at most {MAX_IDENTITY_BYTES} bytes in all, so an identity "
            f"may have at most {most} bytes"
        )
    return full


def _load_curve(server_key: KeySource | None, client_cert: str | os.PathLike[str] | None) -> _Curve | None:
    if server_key is None and client_cert is None:
        return None
    if server_key is None or client_cert is None:
        given, missing = ("server_key", "client_cert") if client_cert is None else ("client_cert", "server_key")
        raise ValueError(
            f"CURVE needs both server_key (the server's public key) and client_cert (this client's "
            f"NAME.key_secret): {given} was given without {missing}"
        )
    public, secret = load_secret_cert(client_cert)
    return _Curve(server=load_public_key(server_key), public=public, secret=secret)


@dataclass(frozen=True)
class _Curve:
    server: bytes
    public: bytes
    secret: bytes = field(repr=False)

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client of the server; must come before ``connect``."""
        sock.curve_serverkey = self.server
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


def _word_count(item: Any, is_tokenized: bool) -> int:
    return len(item) if is_tokenized else len(item.split())


def _renumbered(error: ServerError, offset: int) -> ServerError:
    """``error``, about a request of the texts from ``offset`` on, naming each text by its place
    in the whole input, as the answer to one request of the whole input would."""
    if not offset:
        return error
    message = _TEXT_INDEX.sub(lambda match: f"texts[{int(match[1]) + offset}]", error.message)
    return type(error)(message, kind=error.kind, request_id=error.request_id)


def _join(parts: list[np.ndarray]) -> np.ndarray:
    """The answers to consecutive parts of one input as one answer. Per-token vectors are
    padded with zeros to the widest part, as the server pads the parts of one request."""
    if parts[0].ndim == 3:
        width = max(part.shape[1] for part in parts)
        parts = [np.pad(part, ((0, 0), (0, width - part.shape[1]), (0, 0))) for part in parts]
    return np.concatenate(parts, axis=0)


class BertClient:
    """A connection to one bertserve server; not to be shared between threads.

    ``BertClient(host, port, port_out)`` connects to the server's request port ``port`` and
    reply port ``port_out`` (by default ``port + 1``, as the server has it) and asks for its
    configuration, so a server that is not there raises :class:`ServerTimeoutError` right
    away. ``timeout`` (milliseconds, finite) bounds every wait. Use it as a context manager,
    or call :meth:`close`; a closed client raises :class:`ClientClosedError`. Calls from two
    threads at once raise :class:`ConcurrentUseError`: share a server between threads with
    ``ConcurrentBertClient``.

    Options: ``output_fmt`` ``"ndarray"`` (default) or ``"list"``; ``identity`` the bytes
    the replies are addressed to (default a random UUID); ``check_version`` compares the
    server's version and protocol with this client's; ``check_length`` warns when a text
    has more words than the server's ``max_seq_len``; ``show_server_config`` logs the
    server's configuration on connecting.

    Against a server that uses CURVE pass both ``server_key`` (the server's ``server.key``
    file or its z85 public key) and ``client_cert`` (this client's ``NAME.key_secret``, whose
    public half the server lists). The identity then becomes ``public_key + b":" + identity``
    (at most 64 bytes; by default a random suffix). A server that refuses the key, or a
    mismatch between a CURVE and a plain side, raises :class:`AuthenticationError`.
    """

    def __init__(
        self,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        port_out: int | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_MS,
        output_fmt: Literal["ndarray", "list"] = "ndarray",
        identity: bytes | str | None = None,
        check_version: bool = True,
        check_length: bool = True,
        show_server_config: bool = False,
        server_key: KeySource | None = None,
        client_cert: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(host, str) or not host:
            raise ValueError(f"host must be a non-empty string, not {host!r}")
        self.host = host
        self.port = _check_port("port", port)
        self.port_out = _check_port_out(self.port, port_out)
        self.timeout = check_timeout(timeout)
        if output_fmt not in ("ndarray", "list"):
            raise ValueError(f'output_fmt must be "ndarray" or "list", not {output_fmt!r}')
        self.output_fmt = output_fmt
        curve = _load_curve(server_key, client_cert)
        self.identity = _check_identity(identity, None if curve is None else curve.public)
        self.check_length = check_length
        bracketed = f"[{host}]" if ":" in host else host  # an IPv6 address
        self._address = f"tcp://{bracketed}:{port}"
        self._address_out = f"tcp://{bracketed}:{self.port_out}"

        self._lock = threading.Lock()
        self._closed = False
        self._ids = itertools.count(1)
        self._expected: dict[int, _Pending] = {}  # requests whose replies someone will collect
        #: What the last reply said beside its vectors: ``token_count`` (the tokens its inputs
        #: became, [CLS] and [SEP] included), ``chunked`` (inputs encoded in windows) and, from a
        #: server of a model repository, ``model_version``.
        self.last_info: dict[str, Any] = {}
        self._arrived: dict[int, Reply] = {}  # their replies that came while waiting for another
        self._config: dict[str, Any] = {}

        self._context = zmq.Context()
        try:
            self._push = self._context.socket(zmq.PUSH)
            self._push.setsockopt(zmq.LINGER, 0)
            self._replies = reply_socket(self._context, self.identity, routed=curve is not None)
            for sock in (self._push, self._replies):
                sock.setsockopt(zmq.IPV6, ":" in host)
                if curve is not None:
                    curve.apply(sock)
            self._watch = HandshakeWatch(
                {self._address: self._push, self._address_out: self._replies},
                public_key=None if curve is None else curve.public,
            )
            self._push.connect(self._address)
            self._replies.connect(self._address_out)
            self._poller = zmq.Poller()
            for sock in (self._replies, *self._watch.monitors):
                self._poller.register(sock, zmq.POLLIN)
            with self._using():
                self._config = self._handshake()
        except BaseException as exc:
            self._closed = True
            self._context.destroy(linger=0)
            if isinstance(exc, zmq.ZMQError):
                raise BertClientError(f"cannot connect to {self._address}: {exc}") from exc
            raise
        self._check_server(self._config, check_version)
        if show_server_config:
            logger.info("server config of %s:\n%s", self._address, json.dumps(self._config, indent=2))

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Close the sockets and discard queued messages; calling it again does nothing."""
        if self._closed:
            return
        if not self._lock.acquire(blocking=False):
            raise ConcurrentUseError(_CONCURRENT_USE)
        try:
            self._closed = True
            self._expected.clear()
            self._arrived.clear()
            self._watch.close()
            self._push.close(linger=0)
            self._replies.close(linger=0)
            self._context.term()
        finally:
            self._lock.release()

    def __enter__(self) -> BertClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<BertClient {self._address} out={self.port_out} id={self.identity!r} {state}>"

    # -- control commands --------------------------------------------------------------

    @property
    def server_config(self) -> dict[str, Any]:
        """The server's configuration, asked for afresh."""
        with self._using():
            self._config = self._call(CONFIG, "CONFIG")
            return dict(self._config)

    @property
    def server_status(self) -> dict[str, Any]:
        """The server's current status (workers, queues, counters)."""
        with self._using():
            return self._call(STATUS, "STATUS")

    def terminate(self) -> dict[str, Any]:
        """Ask the server to shut down; returns its answer (``{"stopping": true}``)."""
        with self._using():
            return self._call(TERMINATE, "TERMINATE")

    def reload(self, version: int | str = "latest") -> dict[str, Any]:
        """Ask a server of a model repository to check it now and swap to ``version`` (a
        number, or ``"latest"``: the newest whole version above the one served). Answered at
        once with ``{"reload": n, ...}``; the swap's progress is ``server_status["swap"]``,
        which names the reload ``n`` it answers. Same permissions as :meth:`terminate`."""
        with self._using():
            return self._call(RELOAD, "RELOAD", {"version": str(version)})

    # -- encoding ----------------------------------------------------------------------

    @overload
    def encode(
        self,
        texts: Sequence[Any],
        *,
        blocking: Literal[True] = ...,
        is_tokenized: bool = ...,
        show_tokens: Literal[False] = ...,
        show_progress: bool = ...,
        long_inputs: str | None = ...,
    ) -> Embedding: ...

    @overload
    def encode(
        self,
        texts: Sequence[Any],
        *,
        blocking: Literal[True] = ...,
        is_tokenized: bool = ...,
        show_tokens: Literal[True],
        show_progress: bool = ...,
        long_inputs: str | None = ...,
    ) -> tuple[Embedding, list[list[str]]]: ...

    @overload
    def encode(
        self,
        texts: Sequence[Any],
        *,
        blocking: Literal[False],
        is_tokenized: bool = ...,
        show_tokens: bool = ...,
        show_progress: Literal[False] = ...,
        long_inputs: str | None = ...,
    ) -> int: ...

    @overload
    def encode(
        self,
        texts: Sequence[Any],
        *,
        blocking: Literal[True] = ...,
        is_tokenized: bool = ...,
        show_tokens: bool,
        show_progress: bool = ...,
        long_inputs: str | None = ...,
    ) -> Embedding | tuple[Embedding, list[list[str]]]: ...

    @overload
    def encode(
        self,
        texts: Sequence[Any],
        *,
        blocking: bool = ...,
        is_tokenized: bool = ...,
        show_tokens: bool = ...,
        show_progress: bool = ...,
        long_inputs: str | None = ...,
    ) -> Embedding | tuple[Embedding, list[list[str]]] | int: ...

    def encode(
        self,
        texts: Sequence[Any],
        *,
        blocking: bool = True,
        is_tokenized: bool = False,
        show_tokens: bool = False,
        show_progress: bool = False,
        long_inputs: str | None = None,
    ) -> Embedding | tuple[Embedding, list[list[str]]] | int:
        """Encode ``texts`` into one vector each (or one per token, if the server pools none).

        ``texts`` is a list of non-empty strings (``"first ||| second"`` for a sentence pair)
        or, with ``is_tokenized``, a list of token lists; a bad element raises ``ValueError``
        before anything is sent. Returns the ``(len(texts), D)`` vectors, or
        ``(vectors, tokens)`` with ``show_tokens``. With ``blocking=False`` it returns the
        request id at once; collect the answer with :meth:`fetch` or :meth:`fetch_all`.

        With ``show_progress`` an input larger than one chunk (four of the server's mini-jobs:
        ``4 * max_batch_size`` texts, 1024 with the default server) goes as one request per
        chunk, four in flight at once, while a tqdm bar on stderr counts the texts answered.
        The answer is the one a single request gets, in the same order; each chunk's answer is
        awaited at most ``timeout`` ms, so a long input needs no longer timeout. A smaller
        input is one request, with no bar.

        ``long_inputs`` says what the server does with an input longer than its
        ``max_seq_len``: ``"truncate"`` it, or ``"chunk"`` it (encode it in windows and combine
        their vectors); by default what the server was started with. :attr:`last_info` has
        the reply's ``token_count`` and ``chunked`` (how many inputs were chunked).

        Raises :class:`ServerTimeoutError` when no answer comes within the timeout and
        :class:`ServerError` when the server answers with an error.
        """
        if show_progress and not blocking:
            raise ValueError("show_progress needs blocking=True: fetch() collects a non-blocking request")
        if long_inputs not in (None, "truncate", "chunk"):
            raise ValueError(f"long_inputs must be None, 'truncate' or 'chunk', not {long_inputs!r}")
        with self._using():
            texts = check_texts(texts, is_tokenized)
            chunking = long_inputs == "chunk" or (long_inputs is None and self._config.get("long_inputs") == "chunk")
            if self.check_length and not chunking and (message := self._length_warning(texts, is_tokenized)):
                warnings.warn(message, stacklevel=2)
            if blocking and not texts and (empty := self._empty_embedding()) is not None:
                return (empty, []) if show_tokens else empty
            if show_progress and len(texts) > (chunk := self._chunk_size()):
                embedding, tokens = self._encode_in_chunks(texts, chunk, is_tokenized, show_tokens, long_inputs)
                return (embedding, tokens) if show_tokens else embedding
            deadline = self._deadline()
            request_id = self._request(ENCODE, deadline, texts, is_tokenized, show_tokens, long_inputs)
            self._expected[request_id] = _Pending(show_tokens, fetchable=not blocking)
            if not blocking:
                return request_id
            result = self._collect(request_id, deadline)
        return (result.embedding, result.tokens or []) if show_tokens else result.embedding

    def fetch(self) -> Iterator[EncodeResult]:
        """Yield the answers to the outstanding ``blocking=False`` requests as they arrive.

        Each answer is awaited at most ``timeout`` ms; on a timeout the requests still
        outstanding are given up and :class:`ServerTimeoutError` is raised. An error answer
        raises :class:`ServerError` (its ``request_id`` says which); the other requests stay
        outstanding.
        """
        while True:
            with self._using():
                waiting = {rid for rid, pending in self._expected.items() if pending.fetchable}
                if not waiting:
                    return
                deadline = self._deadline()
                reply = self._await_any(waiting, deadline)
                if reply is None:
                    for rid in waiting:
                        del self._expected[rid]
                    raise self._timeout_error(f"{len(waiting)} outstanding request(s)")
                result = self._result(reply, self._expected.pop(reply.request_id).show_tokens)
            yield result

    @overload
    def fetch_all(self, sort: bool = ..., concat: Literal[False] = ...) -> list[Embedding]: ...

    @overload
    def fetch_all(self, sort: bool = ..., *, concat: Literal[True]) -> Embedding: ...

    def fetch_all(self, sort: bool = True, concat: bool = False) -> list[Embedding] | Embedding:
        """The vectors of every outstanding ``blocking=False`` request.

        A list with one entry per request, in request order with ``sort`` (else in order of
        arrival); with ``concat``, all rows in one array (or one list).
        """
        results = list(self.fetch())
        if sort:
            results.sort(key=lambda result: result.id)
        embeddings = [result.embedding for result in results]
        if not concat:
            return embeddings
        if self.output_fmt == "list":
            return [row for embedding in embeddings for row in embedding]
        if not embeddings:
            empty = self._empty_embedding()
            return empty if empty is not None else np.zeros((0, 0), np.float32)
        return np.concatenate(embeddings, axis=0)

    def encode_async(
        self, batch_generator: Iterable[Sequence[Any]], *, max_num_batch: int | None = None, is_tokenized: bool = False
    ) -> Iterator[Embedding]:
        """Encode the batches ``batch_generator`` yields, keeping a few requests in flight.

        Yields each batch's vectors in the order of the batches; stops after
        ``max_num_batch`` batches if given. Each answer is awaited at most ``timeout`` ms.
        """
        if max_num_batch is not None and (isinstance(max_num_batch, bool) or max_num_batch < 0):
            raise ValueError(f"max_num_batch must be None or >= 0, not {max_num_batch!r}")
        batches = self._checked(itertools.islice(batch_generator, max_num_batch), is_tokenized)
        answers = self._in_order(batches, is_tokenized, show_tokens=False)
        try:
            while True:
                with self._using():
                    result = next(answers, None)
                if result is None:
                    return
                yield result.embedding
        finally:
            answers.close()  # gives up the requests still in flight

    # -- internals ---------------------------------------------------------------------

    @contextmanager
    def _using(self) -> Iterator[None]:
        """Hold the client for one call: fail loudly if another thread holds it, and
        translate low-level errors at the boundary."""
        if not self._lock.acquire(blocking=False):
            raise ConcurrentUseError(_CONCURRENT_USE)
        try:
            if self._closed:
                raise ClientClosedError("this BertClient is closed")
            yield
        except ProtocolError as exc:
            raise BertClientError(f"malformed reply from the server at {self._address}: {exc}") from exc
        except zmq.ZMQError as exc:
            raise BertClientError(f"ZeroMQ failed talking to {self._address}: {exc}") from exc
        finally:
            self._lock.release()

    def _checked(self, batches: Iterable[Sequence[Any]], is_tokenized: bool) -> Iterator[list[Any]]:
        """``batches`` checked as ``encode`` checks its input, an error naming the batch; the
        first batch with a text longer than the server's ``max_seq_len`` warns, once."""
        warned = not self.check_length
        for index, batch in enumerate(batches):
            try:
                texts = check_texts(batch, is_tokenized)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"batch {index}: {exc}") from None
            if not warned and (message := self._length_warning(texts, is_tokenized)):
                warnings.warn(message, stacklevel=4)  # past _in_order and encode_async: the caller
                warned = True
            yield texts

    def _in_order(
        self,
        batches: Iterator[list[Any]],
        is_tokenized: bool,
        show_tokens: bool,
        output_fmt: Literal["ndarray", "list"] | None = None,
        long_inputs: str | None = None,
    ) -> Generator[EncodeResult, None, None]:
        """Send each of ``batches`` as one request, at most ``_ASYNC_WINDOW`` in flight, and
        yield their answers in the order of the batches, each awaited at most ``timeout`` ms.

        Whoever advances this generator holds the client (``_using``). Closing it gives up the
        requests still in flight: their replies, if they come, are dropped.
        """
        in_flight: deque[int] = deque()
        try:
            while True:
                while len(in_flight) < _ASYNC_WINDOW and (batch := next(batches, None)) is not None:
                    request_id = self._request(ENCODE, self._deadline(), batch, is_tokenized, show_tokens, long_inputs)
                    self._expected[request_id] = _Pending(show_tokens, fetchable=False)
                    in_flight.append(request_id)
                if not in_flight:
                    return
                yield self._collect(in_flight.popleft(), self._deadline(), output_fmt)
        finally:
            for request_id in in_flight:
                self._expected.pop(request_id, None)

    def _chunk_size(self) -> int:
        """Texts per request of ``encode(show_progress=True)``."""
        size = self._config.get("max_batch_size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            return _PROGRESS_CHUNK_DEFAULT
        return _PROGRESS_CHUNK_JOBS * size

    def _encode_in_chunks(
        self, texts: list[Any], size: int, is_tokenized: bool, show_tokens: bool, long_inputs: str | None = None
    ) -> tuple[Embedding, list[list[str]]]:
        """``texts`` as requests of ``size`` texts each, a bar counting the answers; the
        answers joined as the server joins the parts of one request."""
        chunks = (texts[start : start + size] for start in range(0, len(texts), size))
        answers = self._in_order(chunks, is_tokenized, show_tokens, output_fmt="ndarray", long_inputs=long_inputs)
        arrays: list[np.ndarray] = []
        tokens: list[list[str]] = []
        done = 0
        try:
            with progress_bar(len(texts)) as bar:
                for result in answers:
                    arrays.append(np.asarray(result.embedding))
                    tokens.extend(result.tokens or [])
                    done += len(result.embedding)
                    bar.update(len(result.embedding))
        except ServerError as exc:  # about the chunk from texts[done] on
            raise _renumbered(exc, done) from None
        finally:
            answers.close()
        vectors = _join(arrays)
        return (vectors.tolist() if self.output_fmt == "list" else vectors), tokens

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout / 1000

    def _timeout_error(self, what: str) -> BertClientError:
        """The error for a wait that ran out: a failed handshake if there was one, since
        then the server never saw us, else a timeout."""
        refused = self._watch.error()
        if refused is not None:
            return refused
        return ServerTimeoutError(
            f"no answer from the bertserve server at {self._address} (replies on port {self.port_out}) "
            f"to {what} within {self.timeout:g} ms",
            address=self._address,
            timeout_ms=self.timeout,
        )

    def _handshake(self) -> dict[str, Any]:
        """Ask for the server's config, re-asking until the subscription has reached the
        server's PUB socket and an answer comes through."""
        deadline = self._deadline()
        asked: set[int] = set()
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise self._watch.error() or ServerTimeoutError(
                    f"no bertserve server answered at {self._address} (replies on port {self.port_out}) "
                    f"within {self.timeout:g} ms",
                    address=self._address,
                    timeout_ms=self.timeout,
                )
            asked.add(self._request(CONFIG, deadline))
            reply = self._await_any(asked, min(deadline, now + _HANDSHAKE_RESEND_S))
            if reply is None:
                if (refused := self._watch.error(certain_only=True)) is not None:
                    raise refused  # retrying cannot help, so do not wait out the timeout
                continue
            if not reply.ok and reply.header.get("kind") == "protocol":
                raise ProtocolVersionError(
                    f"the server at {self._address} does not speak protocol {PROTOCOL_VERSION} "
                    f"(bertserve client {__version__}): {reply.header.get('error')}"
                )
            return self._answer(reply)

    def _check_server(self, config: dict[str, Any], check_version: bool) -> None:
        if not check_version:
            return
        protocol = config.get("protocol")
        if protocol is not None and protocol != PROTOCOL_VERSION:
            self.close()
            raise ProtocolVersionError(
                f"the server at {self._address} speaks protocol {protocol!r}, this client "
                f"{PROTOCOL_VERSION}: install the bertserve version the server runs "
                f"({config.get('server_version', 'unknown')})"
            )
        server_version = config.get("server_version")
        if server_version != __version__:
            warnings.warn(
                f"the server at {self._address} runs bertserve {server_version or '(unknown version)'}, "
                f"this client {__version__}; pass check_version=False to silence this",
                stacklevel=3,
            )

    def _length_warning(self, texts: list[Any], is_tokenized: bool) -> str | None:
        limit = self._config.get("max_seq_len")
        if isinstance(limit, bool) or not isinstance(limit, int):
            return None
        for i, item in enumerate(texts):
            if (words := _word_count(item, is_tokenized)) > limit:
                return (
                    f"texts[{i}] has {words} words, more than the server's max_seq_len={limit} tokens: "
                    "it and any other long text will be truncated; pass long_inputs='chunk' to encode it in "
                    "windows, start the server with a larger max_seq_len, or pass check_length=False to silence this"
                )
        return None

    def _empty_embedding(self) -> Embedding | None:
        """The answer to an empty request, if the server config tells its shape."""
        dim = self._config.get("output_dim")
        if isinstance(dim, bool) or not isinstance(dim, int) or self._config.get("token_level"):
            return None
        dtype = self._config.get("output_dtype")
        empty = np.zeros((0, dim), np.float16 if dtype == "float16" else np.float32)
        return empty.tolist() if self.output_fmt == "list" else empty

    def _request(
        self,
        command: bytes,
        deadline: float,
        texts: Sequence[Any] = (),
        is_tokenized: bool = False,
        show_tokens: bool = False,
        long_inputs: str | None = None,
        header: dict[str, Any] | None = None,
    ) -> int:
        header = {"client_version": __version__, **(header or {})}
        if command == ENCODE:
            header.update(is_tokenized=is_tokenized, show_tokens=show_tokens)
            if long_inputs is not None:
                header["long_inputs"] = long_inputs
        request_id = next(self._ids)
        frames = encode_request(self.identity, command, request_id, header, texts)
        limit = self._config.get("max_message_bytes")
        if isinstance(limit, int) and not isinstance(limit, bool) and len(frames[-1]) > limit:
            # The server's socket would drop it unread and this client would only see a timeout.
            raise ValueError(
                f"the request is {len(frames[-1])} bytes as JSON; the server takes at most {limit} bytes per "
                "message (max_message_bytes): send fewer or shorter texts per request"
            )
        announce(self._replies, self.identity)  # under CURVE: where the reply goes, as the sink may be new
        # Without a server the frames just queue; this wait only matters once the queue is full.
        remaining_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
        if not self._push.poll(remaining_ms, zmq.POLLOUT):
            raise self._timeout_error(f"request {request_id} (the send queue stayed full)")
        self._push.send_multipart(frames, zmq.NOBLOCK, copy=False)
        return request_id

    def _call(self, command: bytes, what: str, header: dict[str, Any] | None = None) -> dict[str, Any]:
        deadline = self._deadline()
        request_id = self._request(command, deadline, header=header)
        reply = self._await_any({request_id}, deadline)
        if reply is None:
            raise self._timeout_error(f"{what} (request {request_id})")
        return self._answer(reply)

    def _collect(
        self, request_id: int, deadline: float, output_fmt: Literal["ndarray", "list"] | None = None
    ) -> EncodeResult:
        """Wait for the answer to ``request_id`` and turn it into a result (in ``output_fmt``,
        by default the client's)."""
        reply = self._await_any({request_id}, deadline)
        pending = self._expected.pop(request_id)
        if reply is None:
            raise self._timeout_error(f"request {request_id}")
        return self._result(reply, pending.show_tokens, output_fmt)

    def _answer(self, reply: Reply) -> dict[str, Any]:
        if not reply.ok:
            raise self._server_error(reply)
        return reply.header

    def _server_error(self, reply: Reply) -> ServerError:
        message = str(reply.header.get("error", "the server gave no reason"))
        kind = reply.header.get("kind")
        error = ServerBusyError if kind == "busy" else ServerError
        return error(message, kind=None if kind is None else str(kind), request_id=reply.request_id)

    def _result(
        self, reply: Reply, show_tokens: bool, output_fmt: Literal["ndarray", "list"] | None = None
    ) -> EncodeResult:
        if not reply.ok:
            raise self._server_error(reply)
        array = reply.array().copy()  # own the memory, not the ZeroMQ frame's
        embedding: Embedding = array.tolist() if (output_fmt or self.output_fmt) == "list" else array
        tokens = reply.header.get("tokens") if show_tokens else None
        info = {key: reply.header[key] for key in _REPLY_INFO if key in reply.header}
        self.last_info = info
        return EncodeResult(reply.request_id, embedding, tokens, info)

    def _await_any(self, wanted: Collection[int], deadline: float) -> Reply | None:
        """The first reply to one of ``wanted``, or ``None`` at the deadline. Replies to
        other expected requests are kept for later; replies nobody expects are dropped."""
        for request_id in sorted(wanted):
            if request_id in self._arrived:
                return self._arrived.pop(request_id)
        while (reply := self._receive(deadline)) is not None:
            if reply.request_id in wanted:
                return reply
            if reply.request_id in self._expected:
                self._arrived[reply.request_id] = reply
            else:
                logger.debug("dropping a late reply to request %d", reply.request_id)
        return None

    def _receive(self, deadline: float) -> Reply | None:
        """The next well-formed reply addressed to this client, or ``None`` at the deadline."""
        while True:
            remaining_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
            ready = dict(self._poller.poll(min(remaining_ms, _ANNOUNCE_EVERY_MS)))
            if len(ready) > (self._replies in ready):
                self._watch.drain()  # a handshake happened; keep the monitors' queues empty
            if self._replies not in ready:
                if time.monotonic() >= deadline:
                    return None
                # Under CURVE a restarted sink knows no route until told: tell it again while waiting.
                announce(self._replies, self.identity)
                continue
            frames = self._replies.recv_multipart(zmq.NOBLOCK, copy=False)
            try:
                reply = decode_reply([frame.buffer for frame in frames])
            except ProtocolError as exc:
                logger.warning("ignoring a malformed reply from %s: %s", self._address, exc)
                continue
            if reply.client_id == self.identity:  # not another client whose id we prefix
                return reply
