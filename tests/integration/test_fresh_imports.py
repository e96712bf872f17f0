"""What a fresh interpreter loads: the client without TensorFlow, the admission policy with
neither ZeroMQ nor TensorFlow. Each check starts its own Python, as the modules are already
loaded in this one."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_client_does_not_import_tensorflow() -> None:
    code = (
        "import sys, bertserve.client, bertserve.client.cli, bertserve.server.cli, bertserve.server.security; "
        "assert 'tensorflow' not in sys.modules, 'tf'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_admission_imports_neither_zmq_nor_tensorflow() -> None:
    code = (
        "import sys; import bertserve.server.serving.policy.admission; "
        "assert not {'zmq', 'tensorflow'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
