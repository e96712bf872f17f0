"""The import rules between the server's parts (``[tool.importlinter]`` in pyproject.toml) hold:
the policies load without sockets, a model or processes, each process's package imports nothing
of another's, and the client never imports the server."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[3]


def test_the_import_contracts_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    # lint_imports configures logging with disable_existing_loggers, which would silence the
    # server's loggers for every later test in this process (test_sink reads what they say).
    for logger in logging.Logger.manager.loggerDict.values():
        if isinstance(logger, logging.Logger):
            monkeypatch.setattr(logger, "disabled", logger.disabled)
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0
