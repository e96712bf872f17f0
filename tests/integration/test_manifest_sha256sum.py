"""A manifest of a model copy is what ``sha256sum -c`` checks: written by bertserve, read by the
coreutils tool itself (a process, so it lives here rather than with the unit tests)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from bertserve.server.model.checksum import MANIFEST, manifest_problems, read_manifest, write_manifest


def test_a_manifest_lists_each_file_as_sha256sum_does(model_files: Path) -> None:
    write_manifest(str(model_files))
    listed = read_manifest(str(model_files))
    assert listed["1_Pooling/config.json"] == hashlib.sha256(b'{"pooling_mode_mean_tokens": true}').hexdigest()
    assert set(listed) == {"config.json", "vocab.txt", "1_Pooling/config.json"}
    assert manifest_problems(str(model_files)) == []
    checked = subprocess.run(["sha256sum", "-c", MANIFEST], cwd=model_files, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
