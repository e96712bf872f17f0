"""The import rules between the server's parts (``[tool.importlinter]`` in pyproject.toml) hold:
the policies load without sockets, a model or processes, each process's package imports nothing
of another's, and the client never imports the server."""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_hold(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0
