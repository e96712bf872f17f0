"""Key files and directories a local user could change.

``bertserve keygen`` writes key directories 0700, secrets 0600 and public keys 0644 whatever
the umask (0 here, the worst case). A server refuses to start, naming the path and the fix,
when its key directory, ``clients/``, ``admins/`` or ``workers/``, or a key file in them, is
writable by group or others (a local user could add an admin key), or when its secret is
readable by them.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bertserve.client.security import keygen
from bertserve.server.testing.launcher import free_port, start_server
from faulty_model import pythonpath_env

pytestmark = pytest.mark.timeout(120)

MODEL = "faulty_model:FaultyModel"


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_keygen_writes_private_directories_and_files_under_any_umask(tmp_path: Path, open_umask: None) -> None:
    public, secret = keygen(tmp_path / "curve" / "clients", "alice")
    assert mode(tmp_path / "curve" / "clients") == 0o700 and mode(tmp_path / "curve") == 0o700
    assert mode(secret) == 0o600 and mode(public) == 0o644


def test_bertserve_keygen_does_too(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bertserve.server.cli", "keygen", str(tmp_path / "keys"), "--name", "server"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, preexec_fn=lambda: os.umask(0))
    assert done.returncode == 0, done.stderr
    assert mode(tmp_path / "keys") == 0o700
    assert mode(tmp_path / "keys" / "server.key_secret") == 0o600
    assert mode(tmp_path / "keys" / "server.key") == 0o644


def _curve_dir(root: Path) -> Path:
    keygen(root, "server")
    keygen(root / "clients", "alice")
    keygen(root / "admins", "ops")
    (root / "clients" / "ops.key").write_bytes((root / "admins" / "ops.key").read_bytes())
    (root / "clients" / "ops.key").chmod(0o644)
    keygen(root / "workers", "far")
    return root


def _loosen(relative: str, bits: int) -> Callable[[Path], Path]:
    def loosen(root: Path) -> Path:
        path = root / relative
        path.chmod(mode(path) | bits)
        return path

    return loosen


@pytest.mark.parametrize(
    ("loosen", "fix"),
    [
        (_loosen(".", stat.S_IWOTH), "chmod 700"),
        (_loosen("clients", stat.S_IWGRP), "chmod 700"),
        (_loosen("admins", stat.S_IWOTH), "chmod 700"),
        (_loosen("workers", stat.S_IWGRP | stat.S_IWOTH), "chmod 700"),
        (_loosen("admins/ops.key", stat.S_IWGRP), "chmod 644"),
        (_loosen("clients/alice.key", stat.S_IWOTH), "chmod 644"),
        (_loosen("server.key_secret", stat.S_IRGRP), "chmod 600"),
        (_loosen("server.key_secret", stat.S_IROTH), "chmod 600"),
    ],
    ids=[
        "root-o+w",
        "clients-g+w",
        "admins-o+w",
        "workers-go+w",
        "admin-key-g+w",
        "client-key-o+w",
        "secret-g+r",
        "secret-o+r",
    ],
)
def test_a_start_refuses_keys_others_could_change_or_read(
    tiny_google: str, tmp_path: Path, loosen: Callable[[Path], Path], fix: str
) -> None:
    path = loosen(_curve_dir(tmp_path / "curve"))
    server = start_server(
        "--model-dir",
        tiny_google,
        "--model-class",
        MODEL,
        "--num-worker",
        "1",
        "--curve-dir",
        str(tmp_path / "curve"),
        env=pythonpath_env(),
        expect_ready=False,
    )
    try:
        deadline = time.monotonic() + 60
        while server.process.poll() is None and not server.ready.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not server.ready.is_set(), f"the server started with {path} at mode {oct(mode(path))}"
        assert server.process.wait(30) != 0
    finally:
        if server.process.poll() is None:
            server.stop()
        server.wait_stopped()
    said = server.tail(40)
    assert str(path) in said and fix in said, said


@pytest.mark.parametrize("loose", [0o640, 0o604, 0o620])
def test_a_start_refuses_an_api_key_file_group_or_others_may_read_or_change(
    tiny_google: str, tmp_path: Path, loose: int
) -> None:
    """Before, only other users' read bit was looked at, and only warned of."""
    keys = tmp_path / "api-keys"
    keys.write_text("alice alice-key-0123456789\n")
    keys.chmod(loose)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertserve.server.cli",
            "start",
            "--model-dir",
            tiny_google,
            "--model-class",
            MODEL,
            "--http-port",
            str(free_port()),
            "--api-keys",
            str(keys),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **pythonpath_env()},
    )
    assert done.returncode != 0
    assert f"chmod 600 {keys}" in done.stderr and "alice-key-0123456789" not in done.stderr, done.stderr
