"""The client installs and imports without TensorFlow; the public names stay put."""

from __future__ import annotations

import subprocess
import sys

import bertserve.client
import bertserve.server


def test_importing_the_client_does_not_import_tensorflow() -> None:
    code = (
        "import sys, bertserve.client, bertserve.client.cli, bertserve.server.cli, bertserve.server.security; "
        "assert 'tensorflow' not in sys.modules, 'tf'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


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
