"""The suite's own layout: ``tests/unit`` mirrors the packages it tests, and the files the
suite runs first are files that exist."""

from __future__ import annotations

from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parents[3]
UNIT = ROOT / "tests" / "unit"
PACKAGES = ("server", "client")


def test_each_unit_test_sits_in_the_folder_of_the_package_it_tests() -> None:
    strays = []
    for path in sorted(UNIT.rglob("test_*.py")):
        folder = path.parent.relative_to(UNIT)
        if folder.parts[:1] == ("project",):
            continue  # the project's own checks: imports, packaging, deployment files
        if folder.parts[:1] not in {(name,) for name in PACKAGES} or not (ROOT / folder).is_dir():
            strays.append(path.relative_to(UNIT).as_posix())
    assert not strays, f"unit tests outside a folder of server/ or client/: {strays}"


def test_the_longest_files_run_first_are_files_of_the_suite() -> None:
    tests = ROOT / "tests"
    missing = [name for name in conftest.LONGEST_FILES if not (tests / name).is_file()]
    assert not missing, f"conftest.LONGEST_FILES names files that do not exist: {missing}"
