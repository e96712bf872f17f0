"""Model-file digests: what a remote worker's model is compared by, and manifests of copies."""

from __future__ import annotations

from pathlib import Path

import pytest
from bertserve.server.cli import main as cli
from bertserve.server.model.checksum import MANIFEST, manifest_problems, tree_sha256, write_manifest


def test_the_digest_covers_every_model_file_and_nothing_else(model_files: Path) -> None:
    digest = tree_sha256(str(model_files))
    (model_files / "__pycache__").mkdir()
    (model_files / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (model_files / ".DS_Store").write_bytes(b"\1")
    write_manifest(str(model_files))
    assert tree_sha256(str(model_files)) == digest  # litter and the manifest do not count
    (model_files / "vocab.txt").write_text("[PAD]\n[UNK]\nhellp\n")  # one byte
    assert tree_sha256(str(model_files)) != digest
    (model_files / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    (model_files / "1_Pooling" / "config.json").rename(
        model_files / "1_Pooling" / "other.json"
    )  # same bytes, other name
    assert tree_sha256(str(model_files)) != digest


def test_a_copy_that_differs_from_its_manifest_is_described(model_files: Path) -> None:
    write_manifest(str(model_files))
    with (model_files / "vocab.txt").open("ab") as f:
        f.write(b"x")
    (model_files / "config.json").unlink()
    (model_files / "extra.bin").write_bytes(b"\0" * 10)
    assert manifest_problems(str(model_files)) == [
        "config.json is listed but missing",
        "extra.bin is not listed",
        "vocab.txt does not match its sha256",
    ]
    (model_files / MANIFEST).write_text("not a manifest\n")
    assert manifest_problems(str(model_files)) == [f"{MANIFEST} line 1 is not '<sha256>  <path>'"]


def test_the_manifest_command_writes_and_checks(model_files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["manifest", "--check", str(model_files)]) == 2  # none yet
    assert "has no manifest" in capsys.readouterr().err
    assert cli.main(["manifest", str(model_files)]) == 0
    assert cli.main(["manifest", "--check", str(model_files)]) == 0
    (model_files / "vocab.txt").write_text("changed")
    assert cli.main(["manifest", "--check", str(model_files)]) == 1
    assert "vocab.txt does not match its sha256" in capsys.readouterr().err
