"""Model-file digests: what a remote worker's model is compared by, and manifests of copies."""

from __future__ import annotations

from pathlib import Path

import pytest
from bertserve.server.cli import main as cli
from bertserve.server.model.checksum import MANIFEST, manifest_problems, tree_sha256, write_manifest


@pytest.fixture
def model(tmp_path: Path) -> Path:
    root = tmp_path / "model"
    (root / "1_Pooling").mkdir(parents=True)
    (root / "config.json").write_text('{"hidden_size": 8}')
    (root / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    (root / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    return root


def test_the_digest_covers_every_model_file_and_nothing_else(model: Path) -> None:
    digest = tree_sha256(str(model))
    (model / "__pycache__").mkdir()
    (model / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (model / ".DS_Store").write_bytes(b"\1")
    write_manifest(str(model))
    assert tree_sha256(str(model)) == digest  # litter and the manifest do not count
    (model / "vocab.txt").write_text("[PAD]\n[UNK]\nhellp\n")  # one byte
    assert tree_sha256(str(model)) != digest
    (model / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    (model / "1_Pooling" / "config.json").rename(model / "1_Pooling" / "other.json")  # same bytes, other name
    assert tree_sha256(str(model)) != digest


def test_a_copy_that_differs_from_its_manifest_is_described(model: Path) -> None:
    write_manifest(str(model))
    with (model / "vocab.txt").open("ab") as f:
        f.write(b"x")
    (model / "config.json").unlink()
    (model / "extra.bin").write_bytes(b"\0" * 10)
    assert manifest_problems(str(model)) == [
        "config.json is listed but missing",
        "extra.bin is not listed",
        "vocab.txt does not match its sha256",
    ]
    (model / MANIFEST).write_text("not a manifest\n")
    assert manifest_problems(str(model)) == [f"{MANIFEST} line 1 is not '<sha256>  <path>'"]


def test_the_manifest_command_writes_and_checks(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["manifest", "--check", str(model)]) == 2  # none yet
    assert "has no manifest" in capsys.readouterr().err
    assert cli.main(["manifest", str(model)]) == 0
    assert cli.main(["manifest", "--check", str(model)]) == 0
    (model / "vocab.txt").write_text("changed")
    assert cli.main(["manifest", "--check", str(model)]) == 1
    assert "vocab.txt does not match its sha256" in capsys.readouterr().err
