"""The head's policies load without sockets, a model or processes: what they decide is a
function of what they are shown, and their tests run in milliseconds."""

from __future__ import annotations

import subprocess
import sys

POLICIES = ("restarts", "swap_plan")


def test_the_policies_import_no_sockets_model_or_processes() -> None:
    imports = "; ".join(f"import bertserve.server.serving.{name}" for name in POLICIES)
    code = (
        f"import sys; {imports}; "
        "loaded = [m for m in ('zmq', 'tensorflow', 'multiprocessing') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
