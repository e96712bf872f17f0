"""Smoke test of benchmarks/soak.py: 4 open-loop clients for six seconds against one worker
serving ``HashingModel`` (``--model-class``: the plumbing, not a model's speed, so no
TensorFlow in the soak or the server), on 200 sentences of the corpus.

The soak runs as a subprocess, exactly as a user runs it; it starts its own server on free
ports, times the bulk sizes alone, measures the capacity, then offers 1.5 times it. This
checks that it finishes in bounded time, that every request is accounted for and correct,
and that its JSON and markdown hold what they should (not the latency figures: the machine
running the tests decides those). It starts a server: ``slow``, run in a pass of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SOAK = BENCHMARKS / "soak.py"
OUTCOMES = ("ok", "wrong", "crossed", "busy", "expired", "timeout", "lost", "other")
BULK_SIZES = {"256", "512", "1024", "2000"}
HASHING_MODEL = "bertserve.server.model.interface:HashingModel"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_soak_quick(tiny_google: str, tmp_path: Path) -> None:
    corpus = (BENCHMARKS / "data" / "corpus.txt").read_text(encoding="utf-8").splitlines()[:200]
    (tmp_path / "corpus.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")  # 200 expected vectors, not 2,500
    args = [
        sys.executable,
        str(SOAK),
        "--clients",
        "4",
        "--minutes",
        "0.1",
        "--load",
        "1.5",
        "--model-dir",
        tiny_google,
        "--model-class",
        HASHING_MODEL,
        "--max-seq-len",
        "32",
        "--corpus",
        str(tmp_path / "corpus.txt"),
        "--num-worker",
        "1",
        "--capacity-seconds",
        "1",
        "--repeats",
        "1",
        "--timeout-ms",
        "20000",
        "--grace-ms",
        "5000",
        "--json",
        str(tmp_path / "soak.json"),
        "--markdown",
        str(tmp_path / "soak.md"),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=170, cwd=tmp_path)
    assert done.returncode == 0, f"exit code {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    report = json.loads((tmp_path / "soak.json").read_text(encoding="utf-8"))

    assert report["kind"] == "soak" and report["passed"] is True and report["failures"] == []
    assert report["clients"] == 4 and report["load"] == 1.5 and 5 < report["seconds"] < 100
    assert report["capacity"]["sentences_per_second"] > 0 and report["offered_sentences_per_second"] > 0
    assert set(report["unloaded"]["median_seconds"]) == {"8", *BULK_SIZES}
    assert report["unloaded"]["wrong_replies"] == 0

    outcomes = report["outcomes"]
    total = outcomes["total"]
    assert report["sent"] == total["sent"] > 0 and total["ok"] > 0 and report["unrecorded"] == 0
    assert total["wrong"] == total["crossed"] == total["lost"] == total["timeout"] == 0, total
    assert total["sent"] == sum(total[name] for name in OUTCOMES), total  # every request ended once
    assert sum(outcomes[name]["sent"] for name in ("small", "medium", "bulk")) == total["sent"]
    assert set(report["bulk"]["by_size"]) == BULK_SIZES
    assert report["expiry"]["client_timeouts"] == report["expiry"]["client_lost"] == 0
    assert report["stuck_clients"] == [] and report["crashes"] == [] and report["stop_problems"] == []

    targets = report["targets"]
    assert len(targets) == 5 and all(set(t) == {"target", "measured", "passed"} for t in targets)
    assert targets[0]["passed"] is True and targets[4]["passed"] is True

    rss = report["rss"]
    assert 0 < rss["start_mib"] <= rss["peak_mib"] and 0 < rss["end_mib"] <= rss["peak_mib"]
    assert rss["growth_percent"] is not None and len(rss["samples"]) >= 3

    markdown = (tmp_path / "soak.md").read_text(encoding="utf-8")
    assert "| outcome | total | small | medium | bulk |" in markdown and "**PASS**" in markdown
    assert "| target | measured | |" in markdown
    assert markdown.strip() in done.stdout
