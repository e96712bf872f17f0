"""The public names stay put. (That the client imports without TensorFlow is checked in a
fresh interpreter: tests/integration/test_fresh_imports.py.)"""

from __future__ import annotations

import bertserve.client
import bertserve.server


def test_public_names() -> None:
    assert sorted(bertserve.client.__all__) == [
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
    for name in bertserve.client.__all__:
        assert getattr(bertserve.client, name) is not None
    assert sorted(bertserve.server.__all__) == [
        "BertServeError",
        "ConfigError",
        "Encoder",
        "ModelConfig",
        "ModelError",
        "ModelFileError",
        "ModelShapeError",
        "PoolingStrategy",
        "StartupError",
    ]
    for name in bertserve.server.__all__:
        assert getattr(bertserve.server, name) is not None
