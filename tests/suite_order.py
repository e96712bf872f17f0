"""The order the suite's files are handed to pytest-xdist's workers in (``tests/conftest.py``).

``--dist loadfile`` hands whole files out in the order they are collected (with
``--no-loadscope-reorder``, pyproject.toml), so the files that take longest (each test's setup
and call summed, as ``--durations`` gives them) go first, longest first: no worker is left with
a long file at the end while the other has nothing to do.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent

LONGEST_FILES = (
    "unit/server/model/test_real_models.py",
    "integration/test_doc_examples.py",
    "integration/test_model_swap.py",
    "integration/test_models.py",
    "integration/test_families_served.py",
    "integration/test_server.py",
    "integration/test_tei_clients.py",
    "integration/test_hub_server.py",
    "unit/server/model/test_pair_cuts.py",
    "integration/test_tasks_served.py",
    "security/test_http_bodies.py",
    "security/test_reply_window.py",
    "integration/test_remote_workers.py",
    "integration/test_readme_encoder.py",
    "integration/test_models_client.py",
)


def rank(path: Path) -> int:
    """Where a file of the suite goes: its place in :data:`LONGEST_FILES`, else after them all."""
    name = path.resolve().relative_to(TESTS).as_posix()
    return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)
