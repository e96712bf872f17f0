"""What the scripts that write reference outputs share: id rows padded into an array, and the
CPU they ran on (named in each reference's meta)."""

from __future__ import annotations

import platform

import numpy as np


def padded(rows: list[list[int]], width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.asarray([len(r) for r in rows], np.int32)
    out = np.zeros((len(rows), width or int(lengths.max())), np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out, lengths


def cpu() -> tuple[str, list[str]]:
    """The CPU's name and those of its flags that change which kernels torch runs."""
    name, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
    except OSError:
        return name, flags
    info = {k.strip(): v.strip() for k, v in info.items()}
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    return info.get("model name", name), [f for f in wanted if f in info.get("flags", "").split()]
