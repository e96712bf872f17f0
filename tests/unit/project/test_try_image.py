"""docker/try_image.py where podman is absent: it says it skipped and why, and exits 0.

The script builds and runs the image with podman, which takes minutes and which CI machines
do not have: no test here builds an image. These run it with a PATH that holds only Python.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(60)

SCRIPT = Path(__file__).resolve().parents[3] / "docker" / "try_image.py"


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
    hint = "apt-get install podman runc debootstrap podman-compose"
    assert done.stdout.strip() == f"skipped: podman is not installed ({hint})"
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


def _script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """docker/try_image.py as a module, its podman build stood in for by ``streamed``."""
    spec = importlib.util.spec_from_file_location("try_image", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "try_image", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


INDEX = "https://builder:t0ken-of-the-mirror@mirror.example/simple"


@pytest.mark.parametrize("status", [0, 1])
def test_pip_index_goes_to_the_build_as_a_secret_file_only_its_owner_reads(
    status: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    try_image = _script(monkeypatch)
    seen: dict[str, object] = {}

    def build(argv: list[str], **_: object) -> tuple[int, str]:
        seen["argv"] = list(argv)
        secrets = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--secret"]
        fields = dict(field.split("=", 1) for field in secrets[0].split(",")) if secrets else {}
        if "src" in fields:
            path = Path(fields["src"])
            seen.update(path=path, mode=stat.S_IMODE(path.stat().st_mode), content=path.read_text())
        seen["id"] = fields.get("id")
        return status, "STEP 1/1: RUN true"

    monkeypatch.setattr(try_image, "streamed", build)
    findings = try_image.Findings()
    podman = try_image.Podman("runc", "cgroupfs", findings)
    with contextlib.suppress(try_image.Failed):
        try_image.build_image(podman, try_image.parse_args(["--pip-index-url", INDEX]), findings)
    argv = seen["argv"]
    assert isinstance(argv, list)
    assert not [arg for arg in argv if "INDEX_URL" in arg or INDEX in arg], argv  # no --build-arg
    assert seen["id"] == "pip_index_url"  # the id docker/Dockerfile mounts
    assert (seen["mode"], seen["content"]) == (0o600, INDEX)
    assert isinstance(seen["path"], Path) and not seen["path"].exists()  # removed, the build done or failed
    assert INDEX not in "\n".join(findings.commands) + capsys.readouterr().out


def test_without_an_index_the_build_has_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    try_image = _script(monkeypatch)
    podman = try_image.Podman("runc", "cgroupfs", try_image.Findings())
    argv = try_image.build_argv(podman, try_image.parse_args(["--pip-index-url", ""]), None)
    assert "--secret" not in argv and not [arg for arg in argv if "INDEX" in arg]
