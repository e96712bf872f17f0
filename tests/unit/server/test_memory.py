from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from bertserve.server import memory

# Each check runs in a process of its own: the settings are the process's for good.
_PROBE = """
import json, os
from bertserve.server import memory
memory.prepare_worker_process(bf16={bf16})
print(json.dumps({{name: os.environ.get(name) for name in ("TF_ONEDNN_USE_SYSTEM_ALLOCATOR", memory.FROZEN_WEIGHTS)}}
    | {{"frozen": memory.weights_frozen(), "bounded": memory.bound_arenas(4)}}))
"""


def _prepared(bf16: bool, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TF_ONEDNN_", "MALLOC_", "GLIBC_TUNABLES"))}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(bf16=bf16)], env=clean | env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_bf16_worker_takes_malloc_and_frozen_weights() -> None:
    found = _prepared(True)
    assert found["TF_ONEDNN_USE_SYSTEM_ALLOCATOR"] == "1"
    assert found[memory.FROZEN_WEIGHTS] == "1" and found["frozen"]
    assert found["bounded"]  # no bound of the user's: the worker's own can be set again


def test_an_fp32_worker_leaves_its_weights_unfrozen() -> None:
    found = _prepared(False)
    assert found["TF_ONEDNN_USE_SYSTEM_ALLOCATOR"] == "1"
    assert found[memory.FROZEN_WEIGHTS] is None and not found["frozen"]


def test_the_users_settings_are_kept() -> None:
    found = _prepared(True, TF_ONEDNN_USE_SYSTEM_ALLOCATOR="0", TF_ONEDNN_ASSUME_FROZEN_WEIGHTS="0")
    assert found["TF_ONEDNN_USE_SYSTEM_ALLOCATOR"] == "0" and not found["frozen"]
    assert not _prepared(True, MALLOC_ARENA_MAX="8")["bounded"]
    assert not _prepared(True, GLIBC_TUNABLES="glibc.malloc.arena_max=8")["bounded"]


def test_trim_heap_is_harmless() -> None:
    assert memory.trim_heap() in (True, False)
