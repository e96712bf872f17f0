"""The bertserve client: talks to a bertserve server; needs no TensorFlow.

    from bertserve.client import BertClient

    with BertClient("localhost", 5555, 5556, timeout=10_000) as bc:
        vectors = bc.encode(["First do it", "then do it right"])   # (2, D) float32

``ConcurrentBertClient`` shares one server between threads.
"""

from ._version import __version__
from .client import BertClient, EncodeResult
from .errors import (
    BertClientError,
    ClientClosedError,
    ConcurrentUseError,
    ProtocolVersionError,
    ServerError,
    ServerTimeoutError,
)
from .pool import ConcurrentBertClient

__all__ = [
    "BertClient",
    "BertClientError",
    "ClientClosedError",
    "ConcurrentBertClient",
    "ConcurrentUseError",
    "EncodeResult",
    "ProtocolVersionError",
    "ServerError",
    "ServerTimeoutError",
    "__version__",
]
