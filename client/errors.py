"""Exceptions raised by the bertserve client.

    BertClientError
    ├── ServerTimeoutError (TimeoutError)    no answer within the timeout: the server is down,
    │   │                                    not ready, or went away in the middle of a request
    │   └── NoServerError                    no server answered the client's first request: on this
    │       │                                machine, nothing listens at the address (said within
    │       │                                a second); elsewhere, nothing answered within the timeout
    │       └── WrongReplyPortError          the server runs, but port_out is not its reply port, so
    │                                        its answer went elsewhere (also a WrongPortError)
    ├── ServerError                          the server answered with an error (``.kind``, ``.message``)
    │   ├── ServerBusyError                  the server's queues are full: it refused the request (kind "busy")
    │   └── UnknownModelError                the request named a model the server does not serve (kind "model");
    │                                        the message lists the models it serves
    ├── AuthenticationError                  the CURVE handshake failed: the server refused this client's key,
    │                                        or one side uses CURVE and the other does not
    ├── WrongPortError                       something other than a bertserve server answers at the port:
    │                                        an HTTP server, or a ZeroMQ socket of another kind (its reply port)
    ├── ProtocolVersionError                 the server speaks another version of the wire protocol
    ├── ClientClosedError                    the client was used after ``close()``
    └── ConcurrentUseError (RuntimeError)    one ``BertClient`` used from two threads at once

A malformed reply and a ZeroMQ failure surface as a plain :class:`BertClientError` (the
low-level exception is its ``__cause__``). Input problems are ``ValueError``/``TypeError``
naming the bad element (``texts[3] is empty``) and are raised before anything is sent.
"""

from __future__ import annotations

from .advice import PYTHON, Advice


class BertClientError(Exception):
    """Base class of every error the bertserve client raises on its own account."""


class ServerTimeoutError(BertClientError, TimeoutError):
    """No answer from the server within the client's timeout."""

    def __init__(self, message: str, *, address: str | None = None, timeout_ms: float | None = None) -> None:
        super().__init__(message)
        self.address = address
        self.timeout_ms = timeout_ms


class NoServerError(ServerTimeoutError):
    """No bertserve server answered the client's first request.

    ``refused``: the address is on this machine and its connections were refused, so
    nothing listens there, which a client says within a second; otherwise nothing answered
    within ``timeout_ms`` (a server elsewhere, or something on this machine that accepts
    connections but does not answer). The message says how to start a server, and how to
    point the client at one elsewhere in the Python API's words; :meth:`advise` says it in
    other words (``bertserve`` names its flags).
    """

    def __init__(self, address: str, *, port_out: int, timeout_ms: float, refused: bool) -> None:
        self.port_out = port_out
        self.refused = refused
        self._where = (address, port_out, timeout_ms)
        super().__init__(self.advise(PYTHON), address=address, timeout_ms=timeout_ms)

    def advise(self, advice: Advice) -> str:
        """The message, its advice in the words of ``advice``."""
        address, port_out, timeout_ms = self._where
        if self.refused:
            what = f"no bertserve server at {address}: the connection was refused, so nothing listens there"
        else:
            what = f"no bertserve server answered at {address} (replies on port {port_out}) within {timeout_ms:g} ms"
        return f"{what}. Start one with `bertserve start`, or {advice.server_elsewhere} if it runs elsewhere"


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


class WrongPortError(BertClientError):
    """The client's handshake failed because something other than a bertserve server's
    request port (or reply port) answers where it connects.

    An HTTP server (a bertserve server's ``--http-port``, say), a ZeroMQ socket of another
    kind (its reply port), or a program that does not speak ZeroMQ at all: the message says
    which, and which of the server's ports to use instead; ``address`` is where it answers.
    """

    def __init__(self, message: str, *, address: str | None = None) -> None:
        super().__init__(message)
        self.address = address


class WrongReplyPortError(NoServerError, WrongPortError):
    """A bertserve server answers at the client's request port, but ``port_out`` is not its
    reply port, so its answers go where the client does not listen.

    ``address`` is the server's, ``port_out`` the port the client was given, and ``found``
    says what answers there instead (``nothing listens there``, an HTTP server...). It is a
    :class:`NoServerError` (no answer came), and a :class:`WrongPortError`. The message says
    where to find the server's reply port; :meth:`advise` says it in other words.
    """

    def __init__(self, address: str, *, port: int, port_out: int, timeout_ms: float, found: str) -> None:
        self.port = port
        self.found = found
        super().__init__(address, port_out=port_out, timeout_ms=timeout_ms, refused=False)

    def advise(self, advice: Advice) -> str:
        """The message, its advice in the words of ``advice``."""
        address, port_out, _ = self._where
        option, port = advice.option("port_out"), advice.option("port")
        if port_out != self.port + 1:
            default = f"by default {port} + 1 ({self.port + 1})"
        else:
            default = f"{port} + 1 by default, another since the server was started with --port-out"
        return (
            f"the bertserve server at {address} is running, but {option} {port_out} is not its reply port: "
            f"{self.found}. Set {option} to the server's reply port, which its ready line names "
            f'("results on port N"): {default}'
        )


class ProtocolVersionError(BertClientError):
    """The server speaks a version of the wire protocol this client does not."""


class ClientClosedError(BertClientError):
    """The client was used after ``close()``."""


class ConcurrentUseError(BertClientError, RuntimeError):
    """One ``BertClient`` was used from two threads at once."""
