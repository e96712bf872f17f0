"""What ``pip install .`` installs: ``bertserve`` as a regular package, so a folder named
``bertserve`` in the current directory (a clone of this repository) does not shadow it.

Python puts the current directory first on ``sys.path``, and a folder there named ``bertserve``
without an ``__init__.py`` is a namespace portion; had the installed ``bertserve`` been one too,
the two would merge and ``bertserve.client`` would come from the clone. A regular package on
any entry of ``sys.path`` wins over namespace portions found before it.

This test's interpreter has bertserve installed editable from the checkout, where ``bertserve``
stays a namespace package (setup.py says why), and a clone named ``bertserve`` next to the
checkout would hold the very files the install points at. So the test builds a wheel of the
checkout with pip, installs it into a folder of its own, and runs a Python there with that
folder on its path, from a directory that holds the checkout under the name ``bertserve``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("setup.py", "pyproject.toml", "README.md", "package", "client", "server")  # what setup.py reads


def test_a_clone_named_bertserve_in_the_current_directory_does_not_shadow_the_installed_package(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"  # a copy, so that the build writes nothing into the checkout
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    site = tmp_path / "site"  # where `pip install .` puts the package, as site-packages would hold it
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-compile"]
    subprocess.run([*pip, "--target", str(site), str(source)], check=True, timeout=240)
    assert (site / "bertserve" / "__init__.py").is_file()

    here = tmp_path / "work"
    here.mkdir()
    (here / "bertserve").symlink_to(ROOT, target_is_directory=True)  # the clone, by its name
    code = (
        "import json, sys, bertserve, bertserve.client, bertserve.server.cli.main; "
        "print(json.dumps({'files': [bertserve.__file__, bertserve.client.__file__, "
        "bertserve.server.cli.main.__file__], 'tensorflow': 'tensorflow' in sys.modules}))"
    )
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, ran.stderr
    imported = json.loads(ran.stdout)
    for file in imported["files"]:
        assert Path(file).is_relative_to(site), f"{file} is not the installed one, under {site}"
    assert not imported["tensorflow"]  # the client, and the server's command line, load it only when needed
