"""Reading the JSON files of a model directory."""

from __future__ import annotations

import json

from ..errors import ModelFileError


def read_json(path: str) -> dict:
    """A JSON object from ``path``; :class:`ModelFileError` naming the file if it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFileError(f"{path} should hold a JSON object")
    return data
