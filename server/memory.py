"""A worker's memory: freed heap given back to the system, and the settings a worker process
starts with.

glibc's malloc keeps memory that TensorFlow freed (the copies made while a graph is
optimized, the activations of a large batch) in its arenas, where it still counts as the
process's RSS: measured with all-MiniLM-L6-v2 on a 2-core CPU, a worker held 1.95 GiB after
a 3,000-sentence request and 1.64 GiB after ``malloc_trim(0)``. Elsewhere this does nothing.

:func:`prepare_worker_process` runs first in a worker process, before TensorFlow loads. What
it sets, measured with all-MiniLM-L6-v2 on a 2-core AMD EPYC with AVX-512 and bf16, RSS after
3,000 sentences and ``malloc_trim``, in process (the Encoder, mini-jobs of 256):

- ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1``: TensorFlow's oneDNN allocator keeps a pool of the
  largest batches' activations that no trim gives back; with malloc, fp32 held 1,103 MiB
  against 1,156.
- at most two malloc arenas (``M_ARENA_MAX``), with malloc: fp32 held 1,085 MiB, bf16 (its
  weights captured) 1,031 against 1,065. Arenas alone measured nothing (fp32 1,150), nor did
  oneDNN's primitive cache bounded (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``).
- ``TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1``: oneDNN keeps its reordered copy of a matrix weight
  that is not a graph constant, so a bf16 graph's weights are held once, captured (see
  :func:`.model.graph.load_function`), at the speed of constants. True of a served graph,
  whose weights never change; not set for an ``Encoder`` in a user's own process, where
  TensorFlow may train. A bf16 worker's only: an fp32 worker's captured weights run as fast
  without it, and it held their reorders too (40 MiB more once ready).

Through the server (``benchmarks/worker_memory.py``), with all of it the default (bf16)
worker held 989 MiB after the 3,000 sentences against 1,210 without, and an fp32 worker
1,063 against 1,156 (its peak 1,186 against 1,156: malloc's, given back by the trim);
TensorFlow's own 656-673 MiB.

Each is left as the user set it (an environment variable, or ``glibc.malloc.arena_max`` in
``GLIBC_TUNABLES``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

FROZEN_WEIGHTS = "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"
WORKER_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt's parameter, from glibc's malloc.h


@functools.cache
def _libc() -> Any | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim, libc.mallopt  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    return libc


def trim_heap() -> bool:
    """Return the heap's free memory to the system; False where the C library cannot."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def prepare_worker_process(*, bf16: bool) -> None:
    """Set up this process, a worker about to load TensorFlow, for a smaller RSS (see above);
    ``bf16``: its graph's matrix products run in bf16."""
    os.environ.setdefault("TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "1")
    if bf16:
        os.environ.setdefault(FROZEN_WEIGHTS, "1")
    bound_arenas(WORKER_ARENAS)


def bound_arenas(arenas: int) -> bool:
    """At most ``arenas`` malloc arenas from now on, unless the user bounded them already;
    whether this set the bound (False where the C library is not glibc)."""
    if "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = _libc()
    return libc is not None and bool(libc.mallopt(_M_ARENA_MAX, arenas))


def weights_frozen() -> bool:
    """Whether oneDNN keeps its reordered copy of a matrix weight that is not a constant."""
    return os.environ.get(FROZEN_WEIGHTS, "").lower() in ("1", "true")
