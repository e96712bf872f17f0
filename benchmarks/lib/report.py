"""What a run prints and writes: progress lines, the run's environment, JSON, markdown, plots."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class Progress:
    """Progress lines on stderr, stamped with the time since the run started."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def __call__(self, message: str) -> None:
        print(f"[{self.elapsed():7.1f} s] {message}", file=sys.stderr, flush=True)


def tagged_log(tag: str) -> Callable[[str], None]:
    """A function printing progress lines ``[tag] message`` on stderr."""

    def log(message: str) -> None:
        print(f"[{tag}] {message}", file=sys.stderr, flush=True)

    return log


def format_load(load: Sequence[float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "packages": {
            name: package_version(name)
            for name in ("bertserve", "tensorflow", "numpy", "torch", "sentence-transformers", "transformers")
        },
    }


def without_nan(data: Any) -> Any:
    """``data`` with every NaN float replaced by None (JSON has no NaN)."""
    if isinstance(data, float) and math.isnan(data):
        return None
    if isinstance(data, dict):
        return {key: without_nan(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [without_nan(value) for value in data]
    return data


def write_json(data: Any, path: Path) -> None:
    """Write ``data`` (plain JSON values; NaN becomes null) to ``path``, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(without_nan(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


def write_report(report: Any, text: str, json_path: Path | None, markdown_path: Path | None) -> None:
    """Print the markdown ``text`` and write it (ending in a newline) and the ``report`` where asked."""
    print(text)
    if json_path:
        write_json(report, json_path)
    if markdown_path:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
        print(f"wrote {markdown_path}", file=sys.stderr)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
