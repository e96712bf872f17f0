"""The suite's own layout: ``tests/unit`` mirrors the packages it tests, and the files the
suite runs first are files that exist."""

from __future__ import annotations

from pathlib import Path

import suite_order

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


def test_no_two_test_files_share_a_name() -> None:
    # pytest imports each test file by its name alone (tests/ holds no __init__.py)
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted({name for name in names if names.count(name) > 1})


def test_the_longest_files_run_first_are_files_of_the_suite() -> None:
    tests = ROOT / "tests"
    missing = [name for name in suite_order.LONGEST_FILES if not (tests / name).is_file()]
    assert not missing, f"suite_order.LONGEST_FILES names files that do not exist: {missing}"
