"""Smoke test of benchmarks/soak.py: 4 clients for half a minute against a tiny BERT.

The soak runs as a subprocess, exactly as a user runs it; it starts its own server on free
ports. This checks that it finishes in bounded time, that every request is accounted for
and correct, and that its JSON and markdown hold what they should.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"
OUTCOMES = ("ok", "wrong", "crossed", "lost", "busy", "error")


@pytest.mark.timeout(180)
def test_soak_quick(tiny_google: str, session_graph_dir: str, tmp_path: Path) -> None:
    args = [
        sys.executable, str(SOAK), "--clients", "4", "--minutes", "0.17", "--model-dir", tiny_google,
        "--graph-dir", session_graph_dir, "--max-seq-len", "32", "--timeout-ms", "60000",
        "--json", str(tmp_path / "soak.json"), "--markdown", str(tmp_path / "soak.md"),
    ]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=170, cwd=tmp_path)
    assert done.returncode == 0, f"exit code {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    report = json.loads((tmp_path / "soak.json").read_text(encoding="utf-8"))

    assert report["kind"] == "soak" and report["passed"] is True and report["failures"] == []
    assert report["clients"] == 4 and 9 < report["seconds"] < 100
    total = report["total"]
    assert total["sent"] > 0 and total["answered"] > 0
    assert total["wrong"] == total["crossed"] == total["lost"] == total["in_flight_at_end"] == 0, total
    assert total["sent"] == sum(total[name] for name in OUTCOMES), total  # every request ended once
    assert set(report["by_size"]) == {"small", "medium", "bulk"}
    assert sum(size["sent"] for size in report["by_size"].values()) == total["sent"]
    assert report["stuck_clients"] == [] and report["crashes"] == [] and report["stop_problems"] == []

    rss = report["rss"]
    assert 0 < rss["start_mib"] <= rss["peak_mib"] and 0 < rss["end_mib"] <= rss["peak_mib"]
    assert rss["growth_percent"] is not None and len(rss["samples"]) >= 3

    markdown = (tmp_path / "soak.md").read_text(encoding="utf-8")
    assert "| counter | total | small | medium | bulk |" in markdown and "**PASS**" in markdown
    assert markdown.strip() in done.stdout
