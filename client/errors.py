"""Exceptions raised by the bertserve client.

    BertClientError
    ├── ServerTimeoutError (TimeoutError)    no answer within the timeout: the server is down,
    │                                        not ready, or went away in the middle of a request
    ├── ServerError                          the server answered with an error (``.kind``, ``.message``)
    │   ├── ServerBusyError                  the server's queues are full: it refused the request (kind "busy")
    │   └── UnknownModelError                the request named a model the server does not serve (kind "model");
    │                                        the message lists the models it serves
    ├── AuthenticationError                  the CURVE handshake failed: the server refused this client's key,
    │                                        or one side uses CURVE and the other does not
    ├── ProtocolVersionError                 the server speaks another version of the wire protocol
    ├── ClientClosedError                    the client was used after ``close()``
    └── ConcurrentUseError (RuntimeError)    one ``BertClient`` used from two threads at once

A malformed reply and a ZeroMQ failure surface as a plain :class:`BertClientError` (the
low-level exception is its ``__cause__``). Input problems are ``ValueError``/``TypeError``
naming the bad element (``texts[3] is empty``) and are raised before anything is sent.
"""

from __future__ import annotations


class BertClientError(Exception):
    """Base class of every error the bertserve client raises on its own account."""


class ServerTimeoutError(BertClientError, TimeoutError):
    """No answer from the server within the client's timeout."""

    def __init__(self, message: str, *, address: str | None = None, timeout_ms: float | None = None) -> None:
        super().__init__(message)
        self.address = address
        self.timeout_ms = timeout_ms


class ServerError(BertClientError):
    """The server answered a request with an error.

    ``kind`` is the server's short name for the failure (for example ``"input"``), or
    ``None`` if it gave none; ``message`` is what the server said.
    """

    def __init__(self, message: str, *, kind: str | None = None, request_id: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.request_id = request_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, kind={self.kind!r})"


class ServerBusyError(ServerError):
    """The server refused a request because its queues are full; try again later."""


class UnknownModelError(ServerError):
    """The request named a model the server does not serve (kind ``"model"``).

    ``message`` is the server's, and lists the models it serves; ``server_config["models"]``
    has them too.
    """


class AuthenticationError(BertClientError):
    """The connection's security handshake failed, so the server never sees this client.

    The server refused this client's key, ``server_key`` is not the server's public key, or
    one side uses CURVE and the other does not. The message says which, as far as ZeroMQ
    tells; ``address`` is the server's.
    """

    def __init__(self, message: str, *, address: str | None = None) -> None:
        super().__init__(message)
        self.address = address


class ProtocolVersionError(BertClientError):
    """The server speaks a version of the wire protocol this client does not."""


class ClientClosedError(BertClientError):
    """The client was used after ``close()``."""


class ConcurrentUseError(BertClientError, RuntimeError):
    """One ``BertClient`` was used from two threads at once."""
