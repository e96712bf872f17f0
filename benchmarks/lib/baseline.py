"""A Python that runs the server of another revision, for a baseline beside this checkout's.

``baseline_python(REV, folder)`` extracts ``REV``'s ``client/`` and ``server/`` (``git
archive``) as a ``bertserve`` package in ``folder``, and makes a venv without pip whose path
holds that folder first and this environment's packages after it: start a server with it
(``start_server(..., python=...)``) and the baseline runs the same model, with the same
libraries, as this checkout.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def baseline_python(revision: str, folder: Path) -> str:
    """A Python that imports ``bertserve`` from ``revision``'s ``client/`` and ``server/``
    (this interpreter, with this environment's packages after them): a folder holding the
    package, put first on its path by a ``.pth`` of a new venv without pip."""
    package = folder / "site" / "bertserve"
    package.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "client", "server"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(package)], input=archive, check=True)
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = _says(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    # Only the first line's folder holds bertserve; this environment's packages come after it (a
    # folder named in a .pth has its own .pth files left unread: not this checkout's editable finder).
    (Path(site) / "baseline.pth").write_text(f"{folder / 'site'}\n{sysconfig.get_paths()['purelib']}\n")
    imported = _says(python, "import bertserve.server; print(bertserve.server.__file__)")
    if not imported.startswith(str(package)):
        raise SystemExit(f"the baseline imports bertserve from {imported}, not from {package}")
    return str(python)


def _says(python: Path, code: str) -> str:
    """What ``code`` prints, run by ``python``."""
    return subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.strip()
