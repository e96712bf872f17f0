"""docker/try_image.py where podman is absent: it says it skipped and why, and exits 0.

The script builds and runs the image with podman, which takes minutes and which CI machines
do not have: no test here builds an image. These run it with a PATH that holds only Python.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

SCRIPT = Path(__file__).resolve().parents[2] / "docker" / "try_image.py"


# A podman that answers questions but whose containers fail to start, as runc does where it may
# not set the default rlimits.
FAKE_PODMAN = """#!{python}
import sys
args = [arg for arg in sys.argv[1:] if not arg.startswith("--") and arg not in ("runc", "cgroupfs")]
if args[0] == "version":
    print("4.3.1")
elif args[0] == "info":
    print("runc version 1.1.5|netavark")
elif args[0] == "run":
    sys.exit("Error: runc: runc create failed: error setting rlimit type 7: operation not permitted")
"""


def _run(tmp_path: Path, *args: str, podman: bool = False) -> subprocess.CompletedProcess[str]:
    """The script with only ``python`` on PATH (no podman, runc, debootstrap or podman-compose),
    or with ``podman`` a stand-in that cannot start a container."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    python = bin_dir / "python"
    if not python.exists():
        python.symlink_to(sys.executable)
    if podman:
        fake = bin_dir / "podman"
        fake.write_text(FAKE_PODMAN.format(python=sys.executable), encoding="utf-8")
        fake.chmod(0o755)
    env = {**os.environ, "PATH": str(bin_dir)}
    return subprocess.run(
        [str(python), str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=50, check=False
    )


def test_without_podman_it_skips_saying_what_to_install(tmp_path: Path) -> None:
    report = tmp_path / "container.md"
    done = _run(tmp_path, "--report", str(report))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "skipped: podman is not installed (apt-get install podman runc debootstrap)"
    assert not report.exists()


def test_without_podman_skip_build_skips_too(tmp_path: Path) -> None:
    done = _run(tmp_path, "--skip-build", "--no-compose", "--report", str(tmp_path / "container.md"))
    assert (done.returncode, done.stdout.strip().split(":")[0]) == (0, "skipped")


def test_help_names_the_flags(tmp_path: Path) -> None:
    done = _run(tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    for flag in ("--base-image", "--skip-build", "--report", "--http-port", "--compose-http-port", "--no-compose"):
        assert flag in done.stdout


def test_where_podman_cannot_start_a_container_it_skips_saying_what_failed(tmp_path: Path) -> None:
    done = _run(tmp_path, "--skip-build", "--report", str(tmp_path / "container.md"), podman=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("skipped: podman cannot run a container here: `podman ")
    assert "operation not permitted" in done.stdout
