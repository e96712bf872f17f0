"""What this machine's CPU can do, and the dtype ``--dtype auto`` picks from it.

No TensorFlow here: the head, which never loads it, resolves ``auto`` as its workers do.

The rule, for the device a model runs on (``ModelConfig.device``: a worker learns its own from
TensorFlow, ``serving.worker.devices.configure_device``, before it loads the model; anything else that
resolves options, the head included, has none and counts as the CPU):

- a GPU (a device naming ``GPU``, as ``/GPU:0``): fp16, which its tensor cores run;
- a CPU with native bf16 matrix instructions (``amx_bf16``, or ``avx512_bf16``): bf16, faster
  than fp32 there, and the bf16 the reference tests hold to a min cosine of 0.999 against fp32
  on all-MiniLM-L6-v2;
- any other CPU, or one whose flags cannot be read: fp32, since bf16 emulated in AVX2 runs
  slower than fp32 and fp16 is never faster than fp32 on a CPU.

``auto`` never picks int8: int8 trades accuracy for speed, a trade only the user may make.
``BERTSERVE_CPU_FLAGS`` (``"avx2 fma"``) stands in for the CPU's own flags, for a container
or VM whose ``/proc/cpuinfo`` hides what the CPU has, and for tests.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Collection
from dataclasses import dataclass

FLAGS_ENV = "BERTSERVE_CPU_FLAGS"
UNKNOWN = "unknown"

#: CPU flags of native bf16 matrix instructions, best first, with the name a reason gives.
BF16_FLAGS = {"amx_bf16": "AMX", "avx512_bf16": "AVX-512 bf16"}

ASKED = "asked for with --dtype"
"""The reason of a dtype the user named."""

#: CPU flags of int8 matrix instructions, which LiteRT's XNNPACK int8 kernels use, with their names.
INT8_FLAGS = {"amx_int8": "AMX-int8", "avx512_vnni": "AVX-512 VNNI", "avx_vnni": "AVX-VNNI"}


@dataclass(frozen=True)
class CpuInfo:
    """A CPU's model name and flags; ``flags`` is None where they cannot be read."""

    model: str = UNKNOWN
    flags: frozenset[str] | None = None


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor of a ``/proc/cpuinfo`` text: x86's ``model name`` and ``flags``,
    or ARM's ``Features`` (where a model name may be missing)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough: they are alike
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    model = fields.get("model name") or fields.get("cpu model") or UNKNOWN
    flags = fields.get("flags", fields.get("features"))
    return CpuInfo(model=model, flags=None if flags is None else frozenset(flags.split()))


@functools.lru_cache(maxsize=1)
def _read_cpuinfo(path: str = "/proc/cpuinfo") -> CpuInfo:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_cpuinfo(f.read())
    except OSError:  # not Linux
        return CpuInfo()


def cpu() -> CpuInfo:
    """This machine's CPU, with ``BERTSERVE_CPU_FLAGS`` (space or comma separated) in place
    of its flags when set."""
    info = _read_cpuinfo()
    fake = os.environ.get(FLAGS_ENV)
    if fake is not None:
        return CpuInfo(model=info.model, flags=frozenset(fake.replace(",", " ").split()))
    return info


def on_gpu(device: str | None) -> bool:
    """Whether a TensorFlow device name (``/GPU:0``, ``/device:GPU:1``) is a GPU."""
    return device is not None and "GPU" in device.upper()


def choose_dtype(cpu_flags: Collection[str] | None, on_gpu: bool) -> tuple[str, str]:
    """The dtype ``auto`` runs, and why: the text before the first ``;`` of the reason is
    its short form (:func:`short_reason`). ``cpu_flags`` None: the flags are unknown."""
    if on_gpu:
        return "fp16", "fp16: the model runs on a GPU; its tensor cores run fp16 matrix products"
    if cpu_flags is None:
        return "fp32", "fp32: this CPU's flags are unknown (no /proc/cpuinfo); fp32 runs well on every CPU"
    for flag, name in BF16_FLAGS.items():
        if flag in cpu_flags:
            return "bf16", (
                f"bf16: this CPU has {name} ({flag}); bf16 matrix products run faster than fp32's there, and the "
                "reference tests hold bf16 to a min cosine of 0.999 against fp32"
            )
    return "fp32", (
        "fp32: this CPU has no bf16 matrix instructions; without amx_bf16 or avx512_bf16, bf16 would run "
        "slower than fp32"
    )


def int8_note(cpu_flags: Collection[str] | None) -> str:
    """What int8 (on LiteRT) makes of a CPU with ``cpu_flags``."""
    if cpu_flags is None:
        return "this CPU's flags are unknown: int8 may run no faster than fp32"
    units = [name for flag, name in INT8_FLAGS.items() if flag in cpu_flags]
    if not units:
        return (
            "this CPU has no int8 matrix instructions (VNNI, AMX-int8): LiteRT's int8 kernels run no faster "
            "than fp32 here, and fp32 is exact"
        )
    bf16 = [name for flag, name in BF16_FLAGS.items() if flag in cpu_flags]
    also = (
        f"; it has {bf16[0]} too, and which of the two runs bulk faster depends on the CPU: LiteRT keeps "
        "attention, softmax and layer norm in fp32 and runs one batch at a time (measured with all-MiniLM-L6-v2 "
        "through a server, int8 bulk was 1.47x bf16 on an AMD EPYC with AVX-512 bf16 and VNNI, 1.18x in process, "
        "and 0.85x on a Xeon with AMX, where bf16 is faster): compare the two with benchmarks/small_requests.py"
        if bf16
        else ""
    )
    return f"this CPU has {' and '.join(units)}, which LiteRT's int8 kernels use{also}"


def resolve_dtype(requested: str, device: str | None) -> tuple[str, str]:
    """The dtype a model asked for with ``requested`` runs on ``device``, and why."""
    if requested == "int8" and not on_gpu(device):
        return requested, f"{ASKED}; {int8_note(cpu().flags)}"
    flags = cpu().flags
    if requested == "bf16" and not on_gpu(device) and flags is not None and not set(BF16_FLAGS) & flags:
        return requested, (
            f"{ASKED}; this CPU has no bf16 matrix instructions (amx_bf16, avx512_bf16): bf16 is emulated here, "
            "slower than fp32 and further from it"
        )
    if requested != "auto":
        return requested, ASKED
    return choose_dtype(None if on_gpu(device) else cpu().flags, on_gpu(device))


def short_reason(reason: str) -> str:
    """What the ready line says of a reason: its first clause, without the dtype it names."""
    clause = reason.split(";", 1)[0]
    dtype, sep, rest = clause.partition(": ")
    return rest if sep and " " not in dtype else clause
