"""The bertserve client: talks to a bertserve server; needs no TensorFlow.

    from bertserve.client import BertClient

    with BertClient("localhost", 5555, 5556, timeout=10_000) as bc:
        vectors = bc.encode(["First do it", "then do it right"])   # (2, D) float32

``ConcurrentBertClient`` shares one server between threads; ``AsyncBertClient`` serves
the tasks of an asyncio event loop (``vectors = await client.encode(texts)``). Against a
server that uses CURVE, pass ``server_key="server.key"`` and ``client_cert="me.key_secret"``
(see ``bertserve keygen``). A server of several models serves each client the one it names
(``BertClient(model="fast")``), or its default model.
"""

from ._version import __version__
from .aio.client import AsyncBertClient
from .core.results import EncodeResult
from .errors import (
    AuthenticationError,
    BertClientError,
    ClientClosedError,
    ConcurrentUseError,
    NoServerError,
    ProtocolVersionError,
    ServerBusyError,
    ServerError,
    ServerTimeoutError,
    UnknownModelError,
    WrongPortError,
    WrongReplyPortError,
)
from .sync.client import BertClient
from .sync.pool import ConcurrentBertClient

__all__ = [
    "AsyncBertClient",
    "AuthenticationError",
    "BertClient",
    "BertClientError",
    "ClientClosedError",
    "ConcurrentBertClient",
    "ConcurrentUseError",
    "EncodeResult",
    "NoServerError",
    "ProtocolVersionError",
    "ServerBusyError",
    "ServerError",
    "ServerTimeoutError",
    "UnknownModelError",
    "WrongPortError",
    "WrongReplyPortError",
    "__version__",
]
