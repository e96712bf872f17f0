"""The benchmarks' library (``benchmarks/lib``): the one percentile helper and the one RSS
sampler, whose views the scenarios read (startup and serving peaks, growth per process); and
the layout of ``benchmarks/``: commands at the top, their parts in packages."""

from __future__ import annotations

import ast
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from lib.rss import RssSampler
from lib.stats import Percentiles, latency_row, median, percentile_ms, ratio

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
MIB = 2**20


def test_percentiles_are_numpy_s_in_milliseconds() -> None:
    seconds = [0.010, 0.012, 0.011, 0.200, 0.013]
    assert percentile_ms(seconds, 99) == pytest.approx(float(np.percentile(np.asarray(seconds) * 1000, 99)))
    assert percentile_ms(seconds, 50, 1) == 12.0
    assert Percentiles.of(seconds) == Percentiles(12.0, percentile_ms(seconds, 90, 2), percentile_ms(seconds, 99, 2))
    assert latency_row(seconds)["count"] == 5 and latency_row(seconds)["p50_ms"] == pytest.approx(12.0)


def test_nothing_measured_is_nan() -> None:
    assert math.isnan(percentile_ms([], 50)) and math.isnan(Percentiles.of([]).p99)
    assert math.isnan(median([])) and median([3.0, 1.0, 2.0]) == 2.0
    assert math.isnan(ratio(1.0, 0.0)) and math.isnan(ratio(math.nan, 2.0)) and ratio(1.0, 2.0) == 0.5


@dataclass
class _FakeServer:
    """What the sampler reads of a RunningServer: its family's RSS (MiB by pid; the first is
    the server) and its ready line."""

    rss: dict[int, float]
    ready: threading.Event = field(default_factory=threading.Event)

    @property
    def process(self) -> SimpleNamespace:
        return SimpleNamespace(pid=next(iter(self.rss)))

    def family(self) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=pid, memory_info=lambda mib=mib: SimpleNamespace(rss=mib * MIB))
            for pid, mib in self.rss.items()
        ]


def _sampled(rss: RssSampler, total: float) -> None:
    deadline = time.monotonic() + 10
    while not any(s.total_mib == total for s in rss.samples):
        assert time.monotonic() < deadline, f"no sample of {total} MiB"
        time.sleep(0.005)


@pytest.mark.timeout(30)
def test_rss_sampler_peaks_and_growth() -> None:
    server = _FakeServer({1: 100.0, 2: 50.0})
    with RssSampler(server, 0.005) as rss:
        assert rss.samples[0].total_mib == 150.0 and not rss.samples[0].ready  # the first sample at start
        server.rss = {1: 100.0, 2: 200.0}
        _sampled(rss, 300.0)
        server.ready.set()
        server.rss = {1: 120.0, 2: 60.0, 3: 10.0}
        _sampled(rss, 190.0)
        server.rss = {1: 110.0, 2: 55.0}
        _sampled(rss, 165.0)
        rss.reset_serving_peak()
        taken = len(rss.samples)
        while len(rss.samples) == taken:
            time.sleep(0.005)
    assert rss.startup_peak_mib == 300.0
    assert rss.serving_peak_mib == 165.0 and rss.peak_mib == 300.0
    assert rss.growth_by_process([2]) == {"server": 20.0, "worker pid 2": 150.0, "pid 3 (sink or helper)": 10.0}
    assert next(s.at for s in rss.between(rss.first_seen[3], time.monotonic())) == rss.first_seen[3]


def _imported(path: Path) -> set[str]:
    """The top-level names of the modules ``path`` imports (absolute imports only)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_command_imports_another_and_no_package_is_named_like_one() -> None:
    """A command is a file at the top of benchmarks/; what two share lives in a package. A
    package named like a command would hide it (or be hidden) on ``sys.path``."""
    commands = {path.stem for path in BENCHMARKS.glob("*.py")}
    packages = {path.parent.name for path in BENCHMARKS.glob("*/__init__.py")}
    assert commands and packages and commands.isdisjoint(packages)
    importing = {
        str(path.relative_to(BENCHMARKS)): sorted(_imported(path) & commands)
        for path in [*BENCHMARKS.glob("*.py"), *BENCHMARKS.glob("*/*.py")]
    }
    assert {path: names for path, names in importing.items() if names} == {}


def test_no_command_hides_a_standard_library_module() -> None:
    """``benchmarks/`` is first on ``sys.path`` when a command runs: a command named like a
    standard module (``profile.py``) would be imported in its place, by PyTorch for one."""
    hiding = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem in sys.stdlib_module_names)
    hiding += sorted(p.name for p in BENCHMARKS.iterdir() if p.is_dir() and p.name in sys.stdlib_module_names)
    assert hiding == []
