"""``ConcurrentBertClient``: one server shared by many threads, through a pool of clients.

A ``BertClient`` owns ZeroMQ sockets, which belong to one thread at a time; the pool lends
each caller a client of its own, creating up to ``max_concurrency`` of them as needed. When
all are lent out a caller waits for one (at most the clients' timeout). A client that
failed for any reason other than the server's own error answer is closed and replaced, so
the next caller never inherits a connection in an unknown state.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..core.keywords import RequestOptions
from ..core.options import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_TIMEOUT_MS, check_model, check_timeout
from ..core.requests import encode_options
from ..core.results import Embedding
from ..errors import ClientClosedError, ServerError, ServerTimeoutError
from .client import BertClient

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; only type checkers read it


class ConcurrentBertClient:
    """A thread-safe pool of :class:`BertClient` for one server.

    ``kwargs`` are passed to every ``BertClient`` (``host``, ``port``, ``port_out``, by default
    ``port + 1``, ``timeout``, ``server_key`` and ``client_cert``, ``model``, ...); under CURVE
    each pooled client gets its own identity under the one key. Clients are created when first
    needed, at most ``max_concurrency`` of them; a caller that finds them all busy waits up to
    ``timeout`` ms, then raises :class:`ServerTimeoutError`. A call that finds no server raises
    what a new ``BertClient`` raises: :class:`NoServerError`, within a second if nothing listens
    on this machine. Use it as a context manager or call :meth:`close`.
    """

    def __init__(self, max_concurrency: int = 10, **kwargs: Any) -> None:
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be an int >= 1, not {max_concurrency!r}")
        inspect.signature(BertClient).bind(**kwargs)  # a misspelt option fails here, not on first use
        self.max_concurrency = max_concurrency
        self.timeout = check_timeout(kwargs.get("timeout", DEFAULT_TIMEOUT_MS))
        self.model = check_model(kwargs.get("model"))  # where every pooled client's requests go
        self._kwargs = kwargs
        self._address = f"tcp://{kwargs.get('host', DEFAULT_HOST)}:{kwargs.get('port', DEFAULT_PORT)}"
        self._condition = threading.Condition()
        self._idle: list[BertClient] = []
        self._created = 0  # idle plus lent out
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def encode(
        self,
        texts: Sequence[Any],
        *,
        show_tokens: bool = False,
        show_progress: bool = False,
        **options: Unpack[RequestOptions],
    ) -> Embedding | tuple[Embedding, list[list[str]]]:
        """Like :meth:`BertClient.encode` with ``blocking=True`` (``show_progress``, ``pairs`` and
        the request options, ``model`` among them, included); safe to call from any thread."""
        # Bad input or options fail before waiting for a client.
        asked = encode_options("ConcurrentBertClient.encode", options, None, show_tokens=show_tokens)
        texts = asked.check_texts(texts)
        with self._client() as client:
            return client.encode(texts, show_tokens=show_tokens, show_progress=show_progress, **options)

    @property
    def server_config(self) -> dict[str, Any]:
        """The server's configuration of the pool's model, asked for afresh."""
        with self._client() as client:
            return client.server_config

    def server_config_of(self, model: str | None) -> dict[str, Any]:
        """The server's configuration of ``model`` (``None``: its default), as
        :meth:`BertClient.server_config_of`."""
        model = check_model(model)
        with self._client() as client:
            return client.server_config_of(model)

    @property
    def server_status(self) -> dict[str, Any]:
        """The server's current status."""
        with self._client() as client:
            return client.server_status

    def close(self) -> None:
        """Close every idle client now and each lent-out one when it comes back; calling it
        again does nothing."""
        with self._condition:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
            self._created -= len(idle)
            self._condition.notify_all()
        for client in idle:
            client.close()

    def __enter__(self) -> ConcurrentBertClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ConcurrentBertClient {self._address} max_concurrency={self.max_concurrency}>"

    @contextmanager
    def _client(self) -> Iterator[BertClient]:
        client = self._acquire()
        broken = True
        try:
            yield client
            broken = False
        except (ServerError, ValueError, TypeError):
            broken = False  # the server answered, or nothing was sent: the client is fine
            raise
        finally:
            self._release(client, broken)

    def _acquire(self) -> BertClient:
        deadline = time.monotonic() + self.timeout / 1000
        with self._condition:
            while True:
                if self._closed:
                    raise ClientClosedError("this ConcurrentBertClient is closed")
                if self._idle:
                    return self._idle.pop()
                if self._created < self.max_concurrency:
                    self._created += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ServerTimeoutError(
                        f"all {self.max_concurrency} clients of this ConcurrentBertClient for {self._address} "
                        f"stayed busy for {self.timeout:g} ms",
                        address=self._address,
                        timeout_ms=self.timeout,
                    )
                self._condition.wait(remaining)
        try:
            return BertClient(**self._kwargs)  # the handshake runs outside the lock
        except BaseException:
            with self._condition:
                self._created -= 1
                self._condition.notify()
            raise

    def _release(self, client: BertClient, broken: bool) -> None:
        with self._condition:
            keep = not broken and not self._closed
            if keep:
                self._idle.append(client)
            else:
                self._created -= 1
            self._condition.notify()
        if not keep:
            client.close()
