"""Model repositories: numbered versions, each served only when whole, settled and readable."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from bertserve.server.config.model import ModelConfig
from bertserve.server.errors import ModelError
from bertserve.server.model import repository as repository_module
from bertserve.server.model.checksum import write_manifest
from bertserve.server.model.repository import Checker, choose, is_repository, versions

OPTIONS = ModelConfig.of(model_dir="unused")


def settled(directory: Path, age_s: float = 60.0) -> None:
    """Date every file ``age_s`` seconds back, as a copy finished that long ago."""
    then = time.time() - age_s
    for root, _, files in os.walk(directory):
        for name in files:
            os.utime(os.path.join(root, name), (then, then))


@pytest.fixture
def repository(tmp_path: Path, tiny_hf: str) -> Path:
    base = tmp_path / "models"
    for number in (1, 2, 3):
        shutil.copytree(tiny_hf, base / str(number))
        write_manifest(str(base / str(number)))
    with (base / "2" / "vocab.txt").open("ab") as f:
        f.write(b"x")  # one byte more than its manifest says
    (base / "3" / "model.safetensors").unlink()  # half-copied: the weights are not there yet
    (base / "notes").mkdir()  # not a version
    settled(base)
    return base


def test_latest_is_the_newest_whole_version_and_the_others_are_refused_with_reasons(repository: Path) -> None:
    assert is_repository(str(repository)) and not is_repository(str(repository / "1"))
    assert [v.number for v in versions(str(repository))] == [1, 2, 3]
    version, refused = choose(str(repository), "latest", OPTIONS)
    assert version.number == 1
    reasons = {r.version.number: r.reason for r in refused}
    assert "model.safetensors is listed but missing" in reasons[3]
    assert "vocab.txt does not match its sha256" in reasons[2]


def test_a_version_asked_for_by_number_is_served_or_refused_naming_why(repository: Path) -> None:
    assert choose(str(repository), "1", OPTIONS)[0].number == 1
    with pytest.raises(ModelError, match=r"version 2 .* refused: its files do not match"):
        choose(str(repository), 2, OPTIONS)
    with pytest.raises(ModelError, match="has no version 7; it has 1, 2, 3"):
        choose(str(repository), 7, OPTIONS)


def test_a_version_still_being_written_or_without_a_required_manifest_is_refused(repository: Path) -> None:
    (repository / "1" / "bertserve.sha256").unlink()
    assert choose(str(repository), "latest", OPTIONS)[0].number == 1  # no manifest: fine unless required
    with pytest.raises(ModelError, match=r"no bertserve\.sha256"):
        choose(str(repository), "latest", OPTIONS, require_manifest=True)
    (repository / "1" / "vocab.txt").touch()  # a file changed just now: a copy in progress
    assert choose(str(repository), "latest", OPTIONS, settle_s=0.5)[0].number == 1  # served once it settles
    toucher = threading.Timer(0.3, (repository / "1" / "vocab.txt").touch)  # still changing during that wait
    toucher.start()
    with pytest.raises(ModelError, match="1: it is still being written"):
        choose(str(repository), "latest", OPTIONS, settle_s=0.6)
    toucher.join()


def test_a_version_whose_files_are_no_model_is_refused(repository: Path) -> None:
    (repository / "4").mkdir()
    (repository / "4" / "config.json").write_text("{not json")
    settled(repository)
    version, refused = choose(str(repository), "latest", OPTIONS)
    assert version.number == 1
    assert "its model cannot be read" in refused[0].reason and refused[0].version.number == 4


def test_the_checker_looks_above_the_served_version_and_remembers_until_files_change(
    repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checker = Checker(str(repository), OPTIONS, require_manifest=False)
    version, refused = checker.newer(1)
    assert version is None and [r.version.number for r in refused] == [3, 2]
    assert checker.newer(3) == (None, [])  # nothing above the served version; never a step down
    hashed: list[str] = []
    real = repository_module.manifest_problems
    monkeypatch.setattr(repository_module, "manifest_problems", lambda d: hashed.append(d) or real(d))
    checker.newer(1)
    assert hashed == []  # unchanged files: the verdicts are remembered, nothing is hashed again
    shutil.copy(repository / "1" / "vocab.txt", repository / "2" / "vocab.txt")  # the copy is mended...
    version, refused = checker.newer(1)
    assert version is None and refused[-1].settling  # ...just now: it must settle first
    settled(repository / "2")
    version, _ = checker.newer(1)
    assert version is not None and version.number == 2 and hashed
    checker.refuse(version, "it could not load")  # a worker failed on it: refused until its files change
    found, refused = checker.get(2)
    assert found is None and refused[0].reason == "it could not load"
    with pytest.raises(ModelError, match="has no version 7"):
        checker.get(7)
