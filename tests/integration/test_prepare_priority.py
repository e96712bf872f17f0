"""The child that builds a model's graph runs at the CPU priority it is given: while other
workers serve (a version swap), the lowest, so the serving workers keep the CPU."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from bertserve.server.config.model import ModelConfig
from bertserve.server.config.telemetry import Telemetry
from bertserve.server.model.prepare import BACKGROUND_NICE, Preparation, missing_steps

pytestmark = pytest.mark.timeout(180)


def nice_of(pid: int) -> int | None:
    """The nice value of process ``pid`` (field 19 of /proc/PID/stat), or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the priority from /proc")
def test_a_build_while_workers_serve_runs_at_the_lowest_priority_and_still_builds(
    tiny_google: str, tmp_path: Path
) -> None:
    config = ModelConfig.of(model_dir=tiny_google, graph_dir=str(tmp_path))
    steps = missing_steps(config)
    assert "graph" in steps  # a fresh cache: there is something to build
    ours = os.nice(0)
    preparation = Preparation(
        config, ["graph"], cpu_only=True, threads=1, telemetry=Telemetry(logging.WARNING), nice=BACKGROUND_NICE
    )
    seen: set[int] = set()
    deadline = time.monotonic() + 150
    while (done := preparation.poll()) is None:
        assert time.monotonic() < deadline, "the build did not finish"
        if (nice := nice_of(preparation.process.pid)) is not None:  # type: ignore[arg-type]
            seen.add(nice)
        time.sleep(0.02)
    assert done, preparation.failure
    assert min(19, ours + BACKGROUND_NICE) in seen  # it lowered its own priority before the work
    assert "graph" not in missing_steps(config)  # and still built the graph
    assert os.nice(0) == ours  # the server's own priority is untouched
