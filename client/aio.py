"""``AsyncBertClient``: the client for asyncio programs, any number of requests in flight at once.

    async with AsyncBertClient("localhost", 5555, timeout=10_000) as client:
        vectors = await client.encode(["First do it", "then do it right"])

One client serves every task of its event loop: each ``encode`` is a request of its own, over the one
pair of sockets of an :class:`~bertserve.client.aio_transport.AsyncTransport`, whose reader hands each
reply to the call waiting for it, with at most as many requests unanswered as the server queues replies
(the rest wait their turn in the client). It takes the options ``BertClient`` takes, checked the same
way (:mod:`~bertserve.client.options`), and raises the same errors (:mod:`~bertserve.client.errors`).
A call that is cancelled, or whose timeout runs out, withdraws its request from the server (CANCEL).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import time
import warnings
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import zmq

from ._version import __version__
from .aio_transport import AsyncTransport
from .chunking import ASYNC_WINDOW, chunk_size, chunks, join, renumbered
from .connection import check_server, check_size, length_warning
from .errors import (
    BertClientError,
    ClientClosedError,
    NoServerError,
    ProtocolVersionError,
    ServerError,
    ServerTimeoutError,
)
from .options import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_TIMEOUT_MS,
    EncodeOptions,
    check_host,
    check_identity,
    check_model,
    check_output_fmt,
    check_port,
    check_port_out,
    check_timeout,
    load_curve,
    model_field,
)
from .protocol import CONFIG, ENCODE, PROTOCOL_VERSION, RELOAD, STATUS, TERMINATE, ProtocolError, Reply
from .protocol import encode_request as _frames
from .results import Embedding, EncodeResult, answer, empty_embedding, encode_result
from .security import KeySource
from .terminal import progress_bar
from .transport import tcp_address

logger = logging.getLogger("bertserve.client")

_HANDSHAKE_RESEND_S = 0.2


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class AsyncBertClient:
    """A connection to one bertserve server for the tasks of one asyncio event loop.

    The options are ``BertClient``'s: ``port_out`` (by default ``port + 1``), ``timeout``
    (milliseconds that each call waits for its answer, finite), ``output_fmt``, ``identity``,
    ``check_version``, ``check_length``, ``show_server_config``, ``server_key`` with
    ``client_cert`` for a server that uses CURVE, and ``model``, the served model every request
    goes to (``None``: the server's default); they are checked here, before any socket is opened.

    ``async with AsyncBertClient(...) as client`` (or ``await client.connect()``) opens the
    sockets and asks for the server's configuration, so a server that is not there raises
    :class:`NoServerError`: within a second if nothing listens on this machine, else within
    the timeout. A call on a client not yet connected connects first. A connection that fails
    leaves the client unconnected, and the next call tries again. The client belongs to the
    event loop it connected on. :meth:`aclose` (or :meth:`close`) fails the calls in flight
    with :class:`ClientClosedError`; a closed client raises it too, and closing it again does
    nothing.
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
        model: str | None = None,
    ) -> None:
        self.host = check_host(host)
        self.port = check_port("port", port)
        self.port_out = check_port_out(self.port, port_out)
        self._timeout = check_timeout(timeout)
        check_output_fmt(output_fmt)
        self.output_fmt = output_fmt
        self._curve = load_curve(server_key, client_cert)
        self.identity = check_identity(identity, None if self._curve is None else self._curve.public)
        self.check_version = check_version
        self.check_length = check_length
        self.show_server_config = show_server_config
        self.model = check_model(model)
        self._address = tcp_address(self.host, self.port)
        self._state = _State.UNOPENED
        self._transport: AsyncTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Lock | None = None
        self._configs: dict[str | None, dict[str, Any]] = {}  # by model name, None the server's default

    @property
    def timeout(self) -> float:
        """Milliseconds that each call waits for its answer; may be changed at any time."""
        return self._timeout

    @timeout.setter
    def timeout(self, timeout: float) -> None:
        self._timeout = check_timeout(timeout)

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._state is _State.CLOSED

    async def connect(self) -> None:
        """Open the sockets and ask for the server's configuration, if not done yet.

        Raises :class:`NoServerError` if no server answers (within a second if nothing listens
        on this machine, else within the timeout), :class:`AuthenticationError` if the CURVE
        handshake is refused, and :class:`ProtocolVersionError` if the server speaks another
        protocol; the client is then left unconnected.
        """
        await self._open()

    def close(self) -> None:
        """Fail the calls in flight with :class:`ClientClosedError` and close the sockets;
        calling it again does nothing. Call it from the client's event loop (or once that
        loop has stopped); :meth:`aclose` also waits for the reader to end."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        if self._transport is not None:
            self._transport.close("this AsyncBertClient was closed while the call waited for its answer")

    async def aclose(self) -> None:
        """:meth:`close`, then wait for the reader task to end."""
        self.close()
        if self._transport is not None:
            await self._transport.wait_closed()

    async def __aenter__(self) -> AsyncBertClient:
        await self._open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncBertClient {self._address} out={self.port_out} id={self.identity!r} {self._state.value}>"

    # -- control commands --------------------------------------------------------------

    async def server_config(self) -> dict[str, Any]:
        """The server's configuration of this client's model, asked for afresh, as
        ``BertClient.server_config``."""
        return await self.server_config_of(self.model)

    async def server_config_of(self, model: str | None) -> dict[str, Any]:
        """The server's configuration of ``model`` (``None``: its default model), asked for
        afresh; :class:`UnknownModelError` if the server does not serve it."""
        model = check_model(model)
        self._configs[model] = await self._call(CONFIG, "CONFIG", model_field(model))
        return dict(self._configs[model])

    async def server_status(self) -> dict[str, Any]:
        """The server's current status (workers, queues, counters; each model's in ``models``)."""
        return await self._call(STATUS, "STATUS")

    async def terminate(self) -> dict[str, Any]:
        """Ask the server to shut down; its answer (``{"stopping": true}``)."""
        return await self._call(TERMINATE, "TERMINATE")

    async def reload(self, version: int | str = "latest", *, model: str | None = None) -> dict[str, Any]:
        """Ask a server of a model repository to swap ``model`` (``None``: this client's) to
        ``version``, as ``BertClient.reload``."""
        header = {"version": str(version), **model_field(check_model(model) or self.model)}
        return await self._call(RELOAD, "RELOAD", header)

    # -- encoding ----------------------------------------------------------------------

    async def encode(
        self,
        texts: Sequence[Any],
        *,
        is_tokenized: bool = False,
        pairs: bool = True,
        show_tokens: bool = False,
        show_progress: bool = False,
        long_inputs: str | None = None,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        truncation_direction: str | None = None,
        model: str | None = None,
    ) -> Embedding | tuple[Embedding, list[list[str]]]:
        """Encode ``texts`` into one vector each, as ``BertClient.encode`` does (``blocking``
        aside: the caller awaits the answer, and other tasks run meanwhile).

        Returns the ``(len(texts), D)`` vectors, or ``(vectors, tokens)`` with ``show_tokens``.
        Bad texts or options raise ``ValueError``/``TypeError`` before anything is sent. With
        ``show_progress`` an input larger than one chunk goes as one request per chunk, four in
        flight, counted on a tqdm bar. ``pairs``, ``long_inputs``, ``dimensions``, ``prompt_name`` and
        ``truncation_direction`` are the request's options
        (:class:`~bertserve.client.options.EncodeOptions`), sent with every chunk; ``model``
        sends the call to another of the server's models than the client's.

        Raises :class:`ServerTimeoutError` when no answer comes within ``timeout`` ms (each
        chunk's answer), :class:`ServerError` (:class:`ServerBusyError` for a refusal of kind
        busy) when the server answers with an error, and :class:`ClientClosedError` if the
        client is closed meanwhile. Cancelling the call withdraws its request from the server.
        """
        options = EncodeOptions(
            is_tokenized=is_tokenized, show_tokens=show_tokens, long_inputs=long_inputs, dimensions=dimensions,
            prompt_name=prompt_name, truncation_direction=truncation_direction,
            model=check_model(model) or self.model, pairs=pairs,
        )  # fmt: skip
        texts = options.check_texts(texts)
        await self._open()
        config = await self._config_of(options.model)
        options.check_server(config)
        if (
            self.check_length
            and not options.chunks_long_inputs(config)
            and (message := length_warning(config, texts, is_tokenized))
        ):
            warnings.warn(message, stacklevel=2)
        if not texts and (empty := empty_embedding(config, self.output_fmt, dimensions)) is not None:
            return (empty, []) if show_tokens else empty
        if show_progress and len(texts) > (size := chunk_size(config)):
            vectors, tokens = await self._encode_chunks(texts, options, size)
            embedding: Embedding = vectors.tolist() if self.output_fmt == "list" else vectors
            return (embedding, tokens) if show_tokens else embedding
        result = await self._encode(texts, options, self.output_fmt)
        return (result.embedding, result.tokens or []) if show_tokens else result.embedding

    # -- internals ---------------------------------------------------------------------

    async def _open(self) -> AsyncTransport:
        """The open transport, connecting first if need be (one handshake for every caller)."""
        loop = asyncio.get_running_loop()
        if self._state is _State.CLOSED:
            raise ClientClosedError("this AsyncBertClient is closed")
        if self._loop is not None and loop is not self._loop:
            raise BertClientError("an AsyncBertClient belongs to the event loop it connected on; make one per loop")
        if self._state is _State.OPEN and self._transport is not None and not self._transport.closed:
            return self._transport
        self._loop = loop
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._state is _State.UNOPENED:
                await self._handshake()
        if self._state is not _State.OPEN or self._transport is None:
            raise ClientClosedError("this AsyncBertClient is closed")
        return self._transport

    async def _handshake(self) -> None:
        """Open the sockets and ask for the server's config, again every 0.2 s until an answer
        comes through (the subscription takes a moment to reach the server)."""
        try:
            transport = AsyncTransport(self.host, self.port, self.port_out, self.identity, self._curve)
        except zmq.ZMQError as exc:
            raise BertClientError(f"cannot connect to {self._address}: {exc}") from exc
        transport.start()
        self._transport = transport
        started = time.monotonic()
        deadline = started + self._timeout / 1000
        asking = _header(model_field(self.model))  # the config of the client's model
        asked: dict[int, asyncio.Future[Reply]] = {}
        opened = False
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    raise transport.refusal() or self._no_server(refused=False)
                request_id, future = transport.expect()
                asked[request_id] = future
                await transport.send(request_id, _frames(self.identity, CONFIG, request_id, asking), deadline)
                wait_s = min(deadline, now + _HANDSHAKE_RESEND_S) - now
                done, _ = await asyncio.wait(asked.values(), timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
                if done:
                    break
                if (refused := transport.refusal(certain_only=True)) is not None:
                    raise refused  # retrying cannot help, so do not wait out the timeout
                if transport.nobody_listens(time.monotonic() - started):  # on this machine, said within a second
                    raise self._no_server(refused=True)
            reply = done.pop().result()
            if not reply.ok and reply.header.get("kind") == "protocol":
                raise ProtocolVersionError(
                    f"the server at {self._address} does not speak protocol {PROTOCOL_VERSION} "
                    f"(bertserve client {__version__}): {reply.header.get('error')}"
                )
            config = self._configs[self.model] = answer(reply)
            transport.window.fit(config)  # as many requests in flight as the server queues replies
            if self.check_version:
                check_server(config, self._address, stacklevel=5)  # the caller of encode or connect
            opened = True
        finally:
            transport.stop_probing()
            for request_id in asked:
                transport.forget(request_id)  # a late answer to one of them is dropped
            if not opened:
                self._transport = None
                transport.close("the connection failed")
                await transport.wait_closed()
        if self._state is _State.CLOSED:  # closed while connecting
            transport.close("this AsyncBertClient was closed")
            return
        self._state = _State.OPEN
        if self.show_server_config:
            logger.info("server config of %s:\n%s", self._address, json.dumps(config, indent=2))

    async def _config_of(self, model: str | None) -> dict[str, Any]:
        """The config of ``model`` (``None``: the server's default) as last told: asked for the
        first time a request goes to it, then kept, so its options are checked against it."""
        if model not in self._configs:
            self._configs[model] = await self._call(CONFIG, "CONFIG", model_field(model))
        return self._configs[model]

    async def _call(self, command: bytes, what: str, header: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = await self._request(command, what, header or {})
        return answer(reply)

    async def _encode(
        self, texts: list[Any], options: EncodeOptions, output_fmt: Literal["ndarray", "list"]
    ) -> EncodeResult:
        reply = await self._request(ENCODE, "request", options.header(self._timeout), texts)
        return encode_result(reply, options.show_tokens, output_fmt)

    async def _request(self, command: bytes, what: str, header: dict[str, Any], texts: Sequence[Any] = ()) -> Reply:
        """Send one request and await its reply, at most ``timeout`` ms. If the caller gives
        up (cancelled, or out of time) a sent ENCODE is withdrawn from the server."""
        transport = await self._open()
        timeout = self._timeout
        deadline = time.monotonic() + timeout / 1000
        request_id, future = transport.expect()
        sent = answered = False
        timer: asyncio.TimerHandle | None = None
        try:
            frames = _frames(self.identity, command, request_id, _header(header), texts)
            check_size(frames, self._configs.get(self.model, {}))
            if not await transport.send(request_id, frames, deadline):
                raise self._timeout_error(f"{what} {request_id} (the send queue stayed full)", timeout)
            sent = True
            timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), _expire, future)
            try:
                reply = await future
            except _TimedOut:
                raise self._timeout_error(f"{what} {request_id}", timeout) from None
            answered = True
            return reply
        except ProtocolError as exc:
            raise BertClientError(f"malformed reply from the server at {self._address}: {exc}") from exc
        except zmq.ZMQError as exc:
            if self.closed:
                raise ClientClosedError("this AsyncBertClient was closed while the call was sent") from None
            raise BertClientError(f"ZeroMQ failed talking to {self._address}: {exc}") from exc
        finally:
            if timer is not None:
                timer.cancel()
            if sent and not answered and command == ENCODE:
                transport.cancel(request_id)
            else:
                transport.forget(request_id)

    async def _encode_chunks(
        self, texts: list[Any], options: EncodeOptions, size: int
    ) -> tuple[np.ndarray, list[list[str]]]:
        """``texts`` as one request per chunk of ``size``, ``ASYNC_WINDOW`` in flight, joined as
        the server joins the parts of one request; a tqdm bar counts the texts answered."""
        parts = chunks(texts, size)
        in_flight: deque[asyncio.Task[EncodeResult]] = deque()
        arrays: list[np.ndarray] = []
        tokens: list[list[str]] = []
        done = 0
        try:
            with progress_bar(len(texts)) as bar:
                while True:
                    while len(in_flight) < ASYNC_WINDOW and (part := next(parts, None)) is not None:
                        in_flight.append(asyncio.ensure_future(self._encode(part, options, "ndarray")))
                    if not in_flight:
                        break
                    result = await in_flight.popleft()
                    arrays.append(np.asarray(result.embedding))
                    tokens.extend(result.tokens or [])
                    done += len(result.embedding)
                    bar.update(len(result.embedding))
        except ServerError as exc:  # about the chunk from texts[done] on
            raise renumbered(exc, done) from None
        finally:
            for task in in_flight:
                task.cancel()  # each withdraws its request
            if in_flight:
                await asyncio.wait(in_flight)
        return join(arrays), tokens

    def _no_server(self, *, refused: bool) -> NoServerError:
        return NoServerError(self._address, port_out=self.port_out, timeout_ms=self._timeout, refused=refused)

    def _timeout_error(self, what: str, timeout: float) -> BertClientError:
        if (refused := self._transport.refusal() if self._transport is not None else None) is not None:
            return refused
        return ServerTimeoutError(
            f"no answer from the bertserve server at {self._address} (replies on port {self.port_out}) "
            f"to {what} within {timeout:g} ms",
            address=self._address,
            timeout_ms=timeout,
        )


class _TimedOut(Exception):
    """The answer to a request did not come within the client's timeout."""


def _expire(future: asyncio.Future[Reply]) -> None:
    if not future.done():
        future.set_exception(_TimedOut())


def _header(fields: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"client_version": __version__, **(fields or {})}
