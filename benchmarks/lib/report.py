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


def last_line(output: str) -> str:
    """The last non-empty line of a process's output (at most 300 characters): why it stopped."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


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


CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")


def cpu_flags() -> list[str]:
    """Which of ``CPU_FLAGS`` (the ones that decide fp32, bf16 and int8 speed) this CPU has."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                present = set(line.split(":", 1)[1].split())
                return [flag for flag in CPU_FLAGS if flag in present]
    except OSError:
        pass
    return []


def native_bf16(flags: Sequence[str]) -> bool:
    """Whether the CPU multiplies bf16 natively (``--dtype auto`` then picks bf16)."""
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def int8_units(flags: Sequence[str]) -> bool:
    """Whether the CPU has int8 matrix instructions (VNNI, AMX-int8), which LiteRT's int8 kernels use."""
    return any(flag in flags for flag in INT8_FLAGS)


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    packages = (
        "bertserve",
        "tensorflow",
        "ai-edge-litert",
        "numpy",
        "torch",
        "sentence-transformers",
        "transformers",
        "onnxruntime",
        "onnx",
    )
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpus": os.cpu_count(),
        "packages": {name: package_version(name) for name in packages},
    }


def describe_cpu(env: dict[str, Any]) -> str:
    """``AMD EPYC, 2 CPUs, flags avx2 fma`` from :func:`environment`'s answer."""
    flags = " ".join(env.get("cpu_flags") or []) or "none of " + " ".join(CPU_FLAGS)
    return f"{env.get('cpu', 'unknown CPU')}, {env.get('cpus')} CPUs, flags {flags}"


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
    """Print the markdown ``text`` and write it (ending in a newline) and the ``report`` where asked.

    A report whose text does not name the CPU gets a last line that does: numbers on a CPU
    with bf16 or int8 matrix units do not carry to one without."""
    if "CPU:" not in text:
        env = report.get("environment") if isinstance(report, dict) else getattr(report, "environment", None)
        text = text.rstrip("\n") + f"\n\nCPU: {describe_cpu(env if isinstance(env, dict) else environment())}.\n"
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
