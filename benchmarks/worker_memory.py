"""A worker's memory after a 3,000-sentence request, beside TensorFlow's own, and what it is.

    python benchmarks/worker_memory.py --json benchmarks/report/worker_memory.json \\
        --markdown benchmarks/report/worker_memory.md

For each dtype asked (``--dtypes``; ``auto``, the default server's, and ``fp32``, what auto
picks on a CPU without native bf16), one server of one worker (``--cpu --max-seq-len 128``,
as ``latency.py`` starts it) is started on a warm graph cache, sent one sentence, then
``--sentences`` sentences in one ``BertClient.encode``. The worker's RSS is read at ready
and after the request, each split by ``/proc/PID/smaps_rollup`` into anonymous memory (the
heap, TensorFlow's and LiteRT's buffers) and file-backed pages (the libraries' code, a
mapped model). TensorFlow's own is the RSS of a process that only imported ``psutil`` and
``tensorflow``; the goal is a worker within it + 400 MiB.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from bertserve.client import BertClient
from bertserve.server.testing.launcher import start_server
from lib.inputs import cycle_take, model_dir_or_exit, model_parser, read_corpus
from lib.report import describe_cpu, environment, tagged_log, write_report

SERVER_FLAGS = ("--num-worker", "1", "--cpu", "--max-seq-len", "128")
GOAL_OVER_TF_MIB = 400
SETTLE_S = 2.0  # the worker trims its heap once a bulk burst is over, maybe after the reply
MIB = 2**20
log = tagged_log("worker_memory")


def smaps(pid: int) -> dict[str, float]:
    """RSS, anonymous and file-backed resident memory of ``pid`` in MiB (``smaps_rollup``)."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value) / 1024
    return {"rss": fields["Rss"], "anonymous": fields["Anonymous"], "file": fields["Rss"] - fields["Anonymous"]}


def tensorflow_rss_mib() -> float:
    probe = "import psutil, tensorflow; print(psutil.Process().memory_info().rss)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return int(out) / MIB


def measure(model_dir: Path, graph_dir: Path, dtype: str, texts: list[str], sentences: int) -> dict[str, Any]:
    flags = () if dtype == "auto" else ("--dtype", dtype)
    running = start_server("--model-dir", str(model_dir), *SERVER_FLAGS, "--graph-dir", str(graph_dir), *flags)
    try:
        running.wait_ready()
        with BertClient(**running.client_kwargs, timeout=120_000) as bc:
            (worker,) = (w["pid"] for w in bc.server_status["workers"])
            config = bc.server_config
            bc.encode(texts[:1])
            at_ready = smaps(worker)
            bc.encode(cycle_take(texts, 0, sentences))
            after = smaps(worker)
            time.sleep(SETTLE_S)
            settled = smaps(worker)
            peak = psutil.Process(worker).memory_full_info()
            hwm = _vm_hwm_mib(worker)
    finally:
        running.stop()
    small = config.get("small_run_dtype") or config.get("dtype")
    runtime = f"{config.get('dtype')}, runs of up to {config.get('lite_max_tokens')} tokens in {small} on LiteRT"
    log(f"{dtype}: {runtime}; worker {after['rss']:.0f} MiB after, peak {hwm:.0f}")
    return {
        "runs": runtime,
        "at_ready": at_ready,
        "after": after,
        "settled": settled,
        "peak_mib": hwm,
        "uss_mib": peak.uss / MIB,
    }


def _vm_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def markdown(report: dict[str, Any]) -> str:
    tf = report["tensorflow_rss_mib"]
    lines = ["# A worker's memory", "", f"CPU: {describe_cpu(report['environment'])}.", ""]
    lines += [
        f"TensorFlow's own (`import psutil, tensorflow`): {tf:.0f} MiB; goal: {tf + GOAL_OVER_TF_MIB:.0f} MiB.",
        "",
    ]
    lines += [
        f"| dtype | what runs | RSS at ready | RSS after {report['sentences']:,} sentences | over TF "
        f"| {SETTLE_S:g} s later | of which anonymous | file-backed | peak |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for dtype, row in report["workers"].items():
        after, settled = row["after"], row["settled"]
        lines.append(
            f"| {dtype} | {row['runs']} | {row['at_ready']['rss']:.0f} | {after['rss']:.0f} | {after['rss'] - tf:+.0f} "
            f"| {settled['rss']:.0f} | {settled['anonymous']:.0f} | {settled['file']:.0f} | {row['peak_mib']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = model_parser(__doc__ or "")
    parser.add_argument("--dtypes", nargs="+", default=["auto", "fp32"])
    parser.add_argument("--sentences", type=int, default=3000)
    parser.add_argument("--graph-dir", type=Path, help="a graph cache to keep (default: a new one, filled first)")
    args = parser.parse_args()
    model_dir = model_dir_or_exit(parser, args.model_dir)
    texts = read_corpus(args.corpus)
    with tempfile.TemporaryDirectory(prefix="bertserve-graphs-") as scratch:
        graph_dir = args.graph_dir or Path(scratch)
        workers = {}
        for dtype in args.dtypes:
            # A first start fills the cache: a cold worker's memory is the build's, not a server's.
            measure(model_dir, graph_dir, dtype, texts, 1)
            workers[dtype] = measure(model_dir, graph_dir, dtype, texts, args.sentences)
    report = {
        "command": " ".join(sys.argv),
        "environment": environment(),
        "sentences": args.sentences,
        "tensorflow_rss_mib": tensorflow_rss_mib(),
        "workers": workers,
    }
    text = markdown(report)
    write_report(report, text, args.json, args.markdown)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
