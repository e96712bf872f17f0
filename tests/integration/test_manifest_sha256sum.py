"""A manifest of a model copy is what ``sha256sum -c`` checks: written by bertserve, read by the
coreutils tool itself (a process, so it lives here rather than with the unit tests)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from bertserve.server.model.checksum import MANIFEST, manifest_problems, read_manifest, write_manifest


@pytest.fixture
def model(tmp_path: Path) -> Path:
    root = tmp_path / "model"
    (root / "1_Pooling").mkdir(parents=True)
    (root / "config.json").write_text('{"hidden_size": 8}')
    (root / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    (root / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    return root


def test_a_manifest_lists_each_file_as_sha256sum_does(model: Path) -> None:
    write_manifest(str(model))
    listed = read_manifest(str(model))
    assert listed["1_Pooling/config.json"] == hashlib.sha256(b'{"pooling_mode_mean_tokens": true}').hexdigest()
    assert set(listed) == {"config.json", "vocab.txt", "1_Pooling/config.json"}
    assert manifest_problems(str(model)) == []
    checked = subprocess.run(["sha256sum", "-c", MANIFEST], cwd=model, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
