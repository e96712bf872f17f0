"""What ``BertClient`` and ``AsyncBertClient`` share, with no sockets and no waiting.

A :class:`ClientCore` holds a client's checked options and its timeout, what the server told
of each model it asked about (a server of several models has a configuration for each: its
dimension, prompts, length), the frames of its requests, and the errors a wait ends with. The
drivers (``sync/``, ``aio/``) own the sockets and the waiting, and ask the core what to send,
what a reply means and which error to raise, as httpx's ``Client`` and ``AsyncClient`` ask
their ``BaseClient``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import BertClientError, ServerTimeoutError
from ..protocol import CANCEL, Reply
from .handshake import Handshake, check_server
from .options import ClientOptions, check_timeout
from .requests import check_size, request_frames


class ClientCore:
    """The shared state of one client of the server ``options`` name."""

    def __init__(self, options: ClientOptions) -> None:
        self.options = options
        self.address = options.address
        self._timeout = options.timeout
        self._configs: dict[str | None, dict[str, Any]] = {}  # by model name, None the server's default

    @property
    def timeout(self) -> float:
        """Milliseconds that any one wait may take; may be changed at any time."""
        return self._timeout

    @timeout.setter
    def timeout(self, timeout: float) -> None:
        self._timeout = check_timeout(timeout)

    # -- what the server told ----------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        """The configuration of the client's model, as the server last told it."""
        return self._configs.get(self.options.model, {})

    def known_config(self, model: str | None) -> dict[str, Any] | None:
        """The configuration of ``model`` (``None``: the server's default) as last told, if it
        was: a request's options are checked against the model it goes to."""
        return self._configs.get(model)

    def learn(self, model: str | None, config: dict[str, Any]) -> dict[str, Any]:
        """Keep ``config``, what the server said of ``model``; ``config``."""
        self._configs[model] = config
        return config

    # -- connecting --------------------------------------------------------------------

    def handshake(self, now: float) -> Handshake:
        """The handshake of a connection started ``now``, with the client's timeout."""
        return Handshake(
            self.options.model, address=self.address, port_out=self.options.port_out, timeout_ms=self._timeout, now=now
        )

    def connected(self, handshake: Handshake, reply: Reply) -> dict[str, Any]:
        """The configuration of the client's model that ``reply`` answers ``handshake`` with, kept."""
        return self.learn(self.options.model, handshake.config(reply))

    def check_server(self, *, stacklevel: int) -> None:
        """Raise :class:`ProtocolVersionError` if the server speaks another protocol; warn if it
        runs another version of bertserve, ``stacklevel`` as ``warnings.warn`` would take it
        where this is called."""
        check_server(self.config, self.address, stacklevel=stacklevel + 2)  # past check_server and this

    # -- requests ----------------------------------------------------------------------

    def frames(
        self, command: bytes, request_id: int, header: dict[str, Any] | None = None, texts: Sequence[Any] = ()
    ) -> list[bytes]:
        """The frames of a request; ``ValueError`` if the server would drop them unread."""
        frames = request_frames(self.options.identity, command, request_id, header, texts)
        check_size(frames, self.config)
        return frames

    def cancel_frames(self, request_id: int) -> list[bytes]:
        """The frames that withdraw ``request_id`` from the server."""
        return request_frames(self.options.identity, CANCEL, request_id)

    # -- errors ------------------------------------------------------------------------

    def timeout_error(
        self, what: str, refusal: BertClientError | None, timeout_ms: float | None = None
    ) -> BertClientError:
        """The error for a wait for ``what`` that ran out after ``timeout_ms`` (by default the
        client's): the failed handshake ``refusal`` if there was one, since then the server never
        saw the client, else a timeout."""
        if refusal is not None:
            return refusal
        timeout_ms = self._timeout if timeout_ms is None else timeout_ms
        return ServerTimeoutError(
            f"no answer from the bertserve server at {self.address} (replies on port {self.options.port_out}) "
            f"to {what} within {timeout_ms:g} ms",
            address=self.address,
            timeout_ms=timeout_ms,
        )

    def cannot_connect(self, exc: Exception) -> BertClientError:
        """The error for sockets that could not be opened."""
        return BertClientError(f"cannot connect to {self.address}: {exc}")

    def malformed(self, exc: Exception) -> BertClientError:
        """The error for a reply that breaks the protocol."""
        return BertClientError(f"malformed reply from the server at {self.address}: {exc}")

    def zmq_failed(self, exc: Exception) -> BertClientError:
        """The error for a socket that failed."""
        return BertClientError(f"ZeroMQ failed talking to {self.address}: {exc}")
