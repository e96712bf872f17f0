"""One model's version swapped while another model of the same server is under load: does
the other model notice?

One server (``--cpu --max-seq-len 128 --num-worker 1 --threads-per-worker 1``) serves two
models: ``stable``, all-MiniLM-L6-v2, and ``rolling``, a repository that holds version 1 (the
same weights) and, once the load runs, version 2 (its last LayerNorm scaled, as in
``hot_swap.py``, so every vector tells which version made it). ``--clients`` clients
encode on ``stable``, one request (1, 5 or 20 sentences) after another with a pause between
them (exponential, mean ``--think-ms``), and ``--rolling-clients`` on ``rolling`` alike:
a load, not a flood, so the build of version 2 has the idle time a server under load has.
Every reply is checked against the in-process ``Encoder`` of its model and version.

Version 2 is new to the server: its graph and LiteRT model are built during the swap (by
the preparing child), then a worker of version 2 starts beside the old one, which drains and
leaves. ``stable``'s latency is compared in three periods: before version 2 appears, during
the swap (appearing to the last old worker gone), and after it. Its noise is measured too:
the steady periods are cut into windows as long as the swap (at most a third of each), and
the p99 of each window gives the range that ``stable``'s p99 takes without a swap.

    python benchmarks/swap_neighbour.py --json benchmarks/report/swap_neighbour.json \\
        --markdown benchmarks/report/swap_neighbour.md
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bertserve.client import BertClient
from bertserve.server import Encoder
from bertserve.server.testing.launcher import start_server
from lib.inputs import model_dir_or_exit, model_parser, read_corpus
from lib.report import describe_cpu, environment, format_load, tagged_log, write_report
from lib.stats import percentile_ms
from swapping.load import Load
from swapping.versions import write_version

SIZES = (1, 5, 20)

log = tagged_log("swap-neighbour")


def stable_busy_s(server: Any) -> float:
    """Seconds stable's worker has spent on jobs, as STATUS counts them."""
    with BertClient(**server.client_kwargs, timeout=30_000) as control:
        return sum(w["busy_s"] for w in control.server_status["workers"] if w["model"] == "stable")


def period(load: Load, start: float, end: float) -> dict[str, Any]:
    seconds = load.seconds(start, end)
    return {
        "requests": len(seconds),
        "p50_ms": percentile_ms(seconds, 50, 1),
        "p99_ms": percentile_ms(seconds, 99, 1),
        "seconds": round(end - start, 1),
    }


def window_p99s(load: Load, start: float, end: float, width: float) -> list[float]:
    """The p99 of ``load``'s latency in each window of ``width`` seconds from ``start`` to ``end``."""
    found = []
    while start + width <= end:
        seconds = load.seconds(start, start + width)
        if len(seconds) >= 20:
            found.append(percentile_ms(seconds, 99, 1))
        start += width
    return found


def markdown(report: dict[str, Any]) -> str:
    stable, periods, noise = report["stable"], report["periods"], report["noise"]
    rows = [
        f"| {name} | {p['seconds']} | {p['requests']} | {p['p50_ms']} | {p['p99_ms']} |" for name, p in periods.items()
    ]
    verdict = "PASS" if report["p99_within_noise"] else "MISS"
    return (
        "\n".join(
            [
                "# One model's version swapped while its neighbour is under load (all-MiniLM-L6-v2, CPU, fp32)",
                "",
                f"Machine: {describe_cpu(report['environment'])}; load average {format_load(report['load_average'])} "
                f"at the start. One server, `--model stable=DIR --model rolling=REPO,poll_interval_s=1 --num-worker 1 "
                f"--threads-per-worker 1 --cpu --max-seq-len 128`; {report['clients']} clients on stable and "
                f"{report['rolling_clients']} on rolling, each one request after another of "
                f"{', '.join(map(str, SIZES))} "
                f"sentences with pauses of {report['think_ms']:.0f} ms on average between them; "
                "stable's worker was busy "
                f"{report['stable_busy']:.0%} of the time before the swap. Version 2 of rolling appeared after "
                f"{report['steady_s']:.0f} s; the swap (its graph and LiteRT model built at the lowest CPU priority, a "
                "version 2 worker started, the version 1 worker drained and gone) took "
                f"{report['swap_seconds']:.1f} s.",
                "",
                "| stable, ok replies | seconds | requests | p50 ms | p99 ms |",
                "| --- | ---: | ---: | ---: | ---: |",
                *rows,
                "",
                f"Noise: stable's p99 in the {len(noise['window_p99_ms'])} windows of "
                f"{noise['width_s']:.1f} s (the swap's "
                f"length, at most a third of a steady period) before and after the swap: "
                f"{', '.join(f'{v:.0f}' for v in noise['window_p99_ms'])} ms "
                f"(range {noise['low_ms']:.0f} to {noise['high_ms']:.0f} ms).",
                "",
                "| target | measured | result |",
                "| --- | --- | --- |",
                f"| stable: 0 failed, 0 wrong | {stable['failed']} failed, {stable['wrong']} wrong of "
                f"{stable['requests']} "
                f"| {'PASS' if stable['failed'] == stable['wrong'] == 0 else 'MISS'} |",
                f"| stable's p99 during the swap within the steady windows' range | {periods['during']['p99_ms']} ms "
                f"against {noise['low_ms']:.0f} to {noise['high_ms']:.0f} ms | {verdict} |",
                f"| rolling: 0 failed, 0 wrong, both versions served | {report['rolling']['failed']} failed, "
                f"{report['rolling']['wrong']} wrong; replies by version {report['rolling']['by_version']} | |",
            ]
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    parser.add_argument("--clients", type=int, default=2, help="clients on the stable model (default 2)")
    parser.add_argument("--rolling-clients", type=int, default=1, help="clients on the swapped model (default 1)")
    parser.add_argument("--think-ms", type=float, default=300.0, help="mean pause between requests (default 300)")
    parser.add_argument("--steady-s", type=float, default=90.0, help="load before version 2 appears (default 90)")
    parser.add_argument("--after-s", type=float, default=90.0, help="load after the swap (default 90)")
    args = parser.parse_args(argv)
    model_dir = model_dir_or_exit(parser, args.model_dir)
    texts = read_corpus(args.corpus, 1600)
    workdir = Path(tempfile.mkdtemp(prefix="bertserve-swap-neighbour-"))
    try:
        return run(args, model_dir, texts, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run(args: Any, model_dir: Path, texts: list[str], workdir: Path) -> int:
    repo, graphs = workdir / "rolling", workdir / "graphs"
    repo.mkdir()
    write_version(model_dir, repo / "1")
    spare = workdir / "v2"
    write_version(model_dir, spare, scale=1.5)
    log("encoding the references in process")
    options = {"graph_dir": str(workdir / "reference-graphs"), "max_seq_len": 128}
    stable_ref = Encoder(str(model_dir), **options).encode(texts)
    rolling_refs = {v: Encoder(str(path), **options).encode(texts) for v, path in ((1, repo / "1"), (2, spare))}
    load_average = list(os.getloadavg())
    server = start_server(
        "--model",
        f"stable={model_dir}",
        "--model",
        f"rolling={repo},poll_interval_s=1",
        "--num-worker",
        "1",
        "--threads-per-worker",
        "1",
        "--cpu",
        "--max-seq-len",
        "128",
        "--graph-dir",
        str(graphs),
        echo=False,
    )
    think_s = args.think_ms / 1000
    stable = Load(server, texts, {None: stable_ref}, SIZES, model="stable", think_s=think_s, log=log)
    rolling = Load(server, texts, rolling_refs, SIZES, model="rolling", think_s=think_s, log=log)  # type: ignore[arg-type]
    try:
        stable.start(args.clients)
        rolling.start(args.rolling_clients)
        time.sleep(5)  # warm-up, left out
        began, busy_began = time.monotonic(), stable_busy_s(server)
        time.sleep(args.steady_s)
        appeared = time.monotonic()
        busy_before = (stable_busy_s(server) - busy_began) / (appeared - began)
        shutil.move(str(spare), str(repo / "2"))
        log("version 2 is in the repository")
        with BertClient(**server.client_kwargs, timeout=30_000) as control:
            while control.server_status["models"]["rolling"].get("swap", {}).get("state") != "done":
                if time.monotonic() - appeared > 900:
                    raise RuntimeError(f"the swap did not finish: {control.server_status['models']['rolling']}")
                time.sleep(0.2)
        done = time.monotonic()
        log(f"swap done in {done - appeared:.1f} s")
        time.sleep(args.after_s)
        ended = time.monotonic()
    finally:
        stable.finish()
        rolling.finish()
        server.stop()
    width = min(done - appeared, args.steady_s / 3, args.after_s / 3)  # at least three windows on each side
    windows = window_p99s(stable, began, appeared, width) + window_p99s(stable, done, ended, width)
    periods = {
        "before": period(stable, began, appeared),
        "during": period(stable, appeared, done),
        "after": period(stable, done, ended),
    }
    noise = {
        "width_s": round(width, 1),
        "window_p99_ms": windows,
        "low_ms": min(windows, default=float("nan")),
        "high_ms": max(windows, default=float("nan")),
    }
    within = bool(windows) and periods["during"]["p99_ms"] <= noise["high_ms"]
    report = {
        "kind": "swap_neighbour",
        "environment": environment(),
        "load_average": load_average,
        "clients": args.clients,
        "rolling_clients": args.rolling_clients,
        "think_ms": args.think_ms,
        "stable_busy": busy_before,
        "steady_s": args.steady_s,
        "swap_seconds": round(done - appeared, 1),
        "periods": periods,
        "noise": noise,
        "stable": {"requests": len(stable.records), "failed": stable.count("failed"), "wrong": stable.count("wrong")},
        "rolling": {
            "requests": len(rolling.records),
            "failed": rolling.count("failed"),
            "wrong": rolling.count("wrong"),
            "by_version": rolling.by_version(),
        },
        "p99_within_noise": within,
    }
    write_report(report, markdown(report), args.json, args.markdown)
    clean = stable.count("failed") + stable.count("wrong") + rolling.count("failed") + rolling.count("wrong") == 0
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
