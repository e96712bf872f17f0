"""A model version swapped under load: all-MiniLM-L6-v2 version 1 for a fine-tuned version 2.

A repository holds version 1 (all-MiniLM-L6-v2) and, once the load runs, version 2: the
same model with its last layer's output LayerNorm scaled, as a fine-tune would change it,
so every vector tells which version made it. ``bertserve start --num-worker 2
--poll-interval-s 1`` serves it; eight clients encode continuously (requests of 1 to 100
sentences), and every reply is checked against the in-process ``Encoder`` of the version the
reply names. Meanwhile the server's processes are sampled every 0.1 s: their count and their
summed resident memory, so the peak during the swap can be set against the steady state
before it and against one worker's own memory.

Version 2 is new to the server: its graph and LiteRT model are built during the swap, in
the server's preparing child, as they would be for a real new version (the in-process
references use a graph cache of their own). ``--prebuilt`` puts them in the server's cache
beforehand, to see the swap without that step.

    python benchmarks/hot_swap.py --json benchmarks/report/hot_swap.json --markdown benchmarks/report/hot_swap.md
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bertserve.client import BertClient
from bertserve.server import Encoder
from bertserve.server.testing.launcher import start_server
from lib.inputs import model_dir_or_exit, model_parser, read_corpus
from lib.report import environment, tagged_log, write_report
from lib.rss import RssSampler, largest_child_mib
from swapping.load import Load
from swapping.versions import write_version

CLIENTS = 8
SIZES = (1, 5, 20, 100)


log = tagged_log("hot-swap")


def markdown(report: dict[str, Any]) -> str:
    load, memory = report["load"], report["memory"]
    built = memory["preparing_peak_mib"]
    preparing = "prebuilt, not built" if built is None else f"{built:,.0f} MiB"
    return (
        "\n".join(
            [
                "# A model version swapped under load (all-MiniLM-L6-v2, CPU, 2 workers)",
                "",
                f"{CLIENTS} clients encoding continuously, requests of {', '.join(map(str, SIZES))} sentences. "
                f"The swap took {report['swap_seconds']:.1f} s (from the version appearing to the last old worker gone"
                f"{', its graph prebuilt' if report['version_2_prebuilt'] else ', its graph built on the way'}).",
                "",
                "| | |",
                "| --- | ---: |",
                f"| requests | {load['requests']:,} |",
                f"| failed | {load['failed']} |",
                f"| vectors not those of the version the reply names | {load['wrong']} |",
                f"| replies by version 1 / 2 | {load['by_version'].get('1', 0):,} / "
                f"{load['by_version'].get('2', 0):,} |",
                f"| median request latency before / during the swap | {load['median_ms_before']:.0f} ms / "
                f"{load['median_ms_during']:.0f} ms |",
                f"| processes steady / most during the swap | {memory['processes_steady']} / "
                f"{memory['processes_peak']} |",
                f"| server RSS steady (median) | {memory['steady_mib']:,.0f} MiB |",
                f"| server RSS peak during the swap | {memory['peak_mib']:,.0f} MiB |",
                f"| one worker's RSS, serving (before the swap) | {memory['worker_mib']:,.0f} MiB |",
                f"| the child building version 2's graph, its peak RSS | {preparing} |",
                f"| a new worker's own peak RSS (while it loads) | {memory['new_worker_peak_mib']:,.0f} MiB |",
                f"| peak - steady, in serving workers | {memory['extra_workers']:.2f} |",
                f"| peak - steady, in new processes at their peak | {memory['extra_new_workers']:.2f} |",
            ]
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    parser.add_argument("--steady-s", type=float, default=8.0, help="load before version 2 appears")
    parser.add_argument("--after-s", type=float, default=5.0, help="load after the swap")
    parser.add_argument("--prebuilt", action="store_true", help="build version 2's graph before it appears")
    args = parser.parse_args(argv)
    model_dir = model_dir_or_exit(parser, args.model_dir)
    texts = read_corpus(args.corpus, 1600)
    workdir = Path(tempfile.mkdtemp(prefix="bertserve-swap-"))
    base, graphs = workdir / "models", workdir / "graphs"
    reference_graphs = graphs if args.prebuilt else workdir / "reference-graphs"
    base.mkdir()
    write_version(model_dir, base / "1")
    spare = workdir / "v2"
    write_version(model_dir, spare, scale=1.5)
    log("encoding the references of both versions in process")
    options = {"graph_dir": str(reference_graphs), "max_seq_len": 128}
    references = {v: Encoder(str(path), **options).encode(texts) for v, path in ((1, base / "1"), (2, spare))}
    cosine = np.sum(references[1] * references[2], axis=1)
    log(f"versions 1 and 2 differ: median cosine {np.median(cosine):.4f}")
    server = start_server(
        "--model-dir",
        str(base),
        "--num-worker",
        "2",
        "--cpu",
        "--max-seq-len",
        "128",
        "--graph-dir",
        str(graphs),
        "--poll-interval-s",
        "1",
        echo=False,
    )
    sampler = RssSampler(server, 0.1, count_children=True)
    load = Load(server, texts, references, SIZES, log=log)  # type: ignore[arg-type]
    try:
        sampler.start()
        load.start(CLIENTS)
        time.sleep(args.steady_s)
        worker_mib = largest_child_mib(server)
        appeared = time.monotonic()
        shutil.move(str(spare), str(base / "2"))
        log("version 2 is in the repository")
        preparing_until = appeared  # the last time the status said "preparing": no new worker had started yet
        with BertClient(**server.client_kwargs, timeout=30_000) as control:
            while (state := control.server_status.get("swap", {}).get("state")) != "done":
                if state == "preparing":
                    preparing_until = time.monotonic()
                if time.monotonic() - appeared > 600:
                    raise RuntimeError(f"the swap did not finish: {control.server_status.get('swap')}")
                time.sleep(0.2)
            done = time.monotonic()
            log(f"swap done in {done - appeared:.1f} s")
            time.sleep(args.after_s)
            workers = control.server_status["workers"]
    finally:
        load.finish()
        sampler.stop()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    steady = sampler.between(appeared - args.steady_s + 2, appeared)
    during = sampler.between(appeared, done + 1)
    steady_mib = statistics.median(s.total_mib for s in steady)
    peak_mib = max(s.total_mib for s in during)

    def new_peaks(start: float, end: float) -> list[float]:
        return [mib for pid, mib in sampler.peak_by_pid.items() if start < sampler.first_seen[pid] <= end]

    preparing_peaks = new_peaks(appeared, preparing_until)  # the child that built version 2's graph, if any
    new_peak_mib = max(new_peaks(preparing_until, done))

    def median_ms(start: float, end: float) -> float:
        return 1000 * statistics.median(load.seconds(start, end, ok_only=False) or [0.0])

    report = {
        "environment": environment(),
        "swap_seconds": done - appeared,
        "version_2_prebuilt": args.prebuilt,
        "versions_median_cosine": float(np.median(cosine)),
        "load": {
            "requests": len(load.records),
            "failed": load.count("failed"),
            "wrong": load.count("wrong"),
            "by_version": load.by_version(),
            "median_ms_before": median_ms(appeared - args.steady_s, appeared),
            "median_ms_during": median_ms(appeared, done),
        },
        "memory": {
            "processes_steady": max(s.children or 0 for s in steady),
            "processes_peak": max(s.children or 0 for s in during),
            "steady_mib": steady_mib,
            "peak_mib": peak_mib,
            "worker_mib": worker_mib,
            "extra_workers": (peak_mib - steady_mib) / worker_mib,
            "new_worker_peak_mib": new_peak_mib,
            "preparing_peak_mib": max(preparing_peaks, default=None),
            "extra_new_workers": (peak_mib - steady_mib) / max([new_peak_mib, *preparing_peaks]),
        },
        "workers_after": [{k: w[k] for k in ("index", "version", "jobs_done")} for w in workers],
    }
    write_report(report, markdown(report), args.json, args.markdown)
    clean = report["load"]["failed"] == 0 and report["load"]["wrong"] == 0
    return 0 if clean and report["memory"]["extra_new_workers"] <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
