"""Many small requests, against a baseline revision: this checkout's server beside the server of
``--baseline REV``, in each dtype, side by side in one run.

    python benchmarks/small_requests.py --baseline a0edbe7 \\
        --json benchmarks/report/small_requests.json --markdown benchmarks/report/small_requests.md

For each dtype (``auto``: no ``--dtype`` flag, the default; ``fp32``; ``int8``) the two servers
(all-MiniLM-L6-v2 by default, ``--num-worker 1 --cpu --max-seq-len 128``, each at its own
defaults) are up at once, the baseline run by this interpreter from ``git archive REV``
(:mod:`lib.baseline`), and take turns, the order swapped every round:

- **bulk**: one client, requests of ``--bulk`` sentences, sentences/s (what the issue holds to
  within 5% of the baseline);
- **32 clients**: ``--clients`` one-sentence ZeroMQ clients at once, spread over up to 8
  processes (:mod:`lib.client_sweep`), sentences/s and its ratio to the bulk client, the
  worker's busy share and the whole machine's idle share over the window;
- **one paced sentence**: ``BertClient.encode([s])`` after a pause of ``--pause-ms``, p50.

Each figure is the median of ``--rounds`` rounds; the report gives each server's, and this
checkout's over the baseline's.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from comparing.targets import target, targets_markdown
from lib.baseline import baseline_python
from lib.client_sweep import Sweep, level, server_roles
from lib.inputs import cycle_take, model_dir_or_exit, model_parser, read_corpus
from lib.load import timed
from lib.protocols import ZMQ, Doors
from lib.report import describe_cpu, environment, tagged_log, write_report

log = tagged_log("small")
DTYPES = ("auto", "fp32", "int8")
BASELINE, CURRENT = "baseline", "this checkout"
FLAGS = ("--num-worker", "1", "--cpu", "--max-seq-len", "128")


def start(model_dir: Path, dtype: str, python: str | None) -> tuple[RunningServer, Doors]:
    http = free_port()
    flags = (*FLAGS, "--http-port", str(http), *(() if dtype == "auto" else ("--dtype", dtype)))
    options = {"python": python} if python else {}
    running = start_server("--model-dir", str(model_dir), *flags, echo=False, **options)
    return running, Doors(running.port, running.port_out, f"http://127.0.0.1:{http}")


def paced_p50(client: BertClient, texts: list[str], pause_s: float) -> float:
    times = []
    for text in texts:
        time.sleep(pause_s)
        times.append(timed(lambda text=text: client.encode([text]))[0])
    return 1000 * statistics.median(times)


def one_round(
    name: str, running: RunningServer, doors: Doors, texts: list[str], args: Any, sweep: Sweep
) -> dict[str, Any]:
    bulk = cycle_take(texts, 0, args.bulk)
    with BertClient(port=doors.port, port_out=doors.port_out, timeout=120_000) as client:
        client.encode(bulk[:300])
        bulk_per_s = len(bulk) / timed(lambda: client.encode(bulk))[0]
        roles = server_roles(running, doors, client.server_status)
        loaded = level(ZMQ, args.clients, doors, roles, texts, sweep, client)
        paced = paced_p50(client, texts[: args.paced], args.pause_ms / 1000)
        config = client.server_config
    log(f"{name}: bulk {bulk_per_s:.0f}/s, {args.clients} clients {loaded['per_s']:.0f}/s, paced p50 {paced:.2f} ms")
    return {
        "bulk_per_s": bulk_per_s,
        "clients_per_s": loaded["per_s"],
        "worker_busy": loaded["worker_busy"],
        "idle_share": loaded["idle_share"],
        "paced_p50_ms": paced,
        "dtype": config.get("dtype"),
    }


def measure(args: Any, model_dir: Path, texts: list[str], python: str) -> dict[str, Any]:
    sweep = Sweep(levels=(args.clients,), seconds=args.seconds, warmup_s=2.0)
    found: dict[str, Any] = {}
    for dtype in args.dtypes:
        with contextlib.ExitStack() as stack:
            servers = {}
            for name, interpreter in ((BASELINE, python), (CURRENT, None)):
                log(f"{dtype}: starting {name}")
                servers[name] = start(model_dir, dtype, interpreter)
                stack.callback(servers[name][0].stop)
            rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
            for index in range(args.rounds):
                order = list(servers) if index % 2 == 0 else list(servers)[::-1]
                for name in order:
                    rounds[name].append(one_round(f"{dtype}, {name}", *servers[name], texts, args, sweep))
        found[dtype] = {name: _medians(runs) for name, runs in rounds.items()}
    return found


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [key for key, value in runs[0].items() if isinstance(value, float)]
    return {key: statistics.median(run[key] for run in runs) for key in keys} | {"dtype": runs[0]["dtype"]}


def report_targets(found: dict[str, Any]) -> list[Any]:
    rows = []
    for dtype, servers in found.items():
        now, then = servers[CURRENT], servers[BASELINE]
        bulk = now["bulk_per_s"] / then["bulk_per_s"]
        rows.append(target(f"{dtype}: bulk, this checkout / baseline", bulk, ">=", 0.95, "within 5%: at least 0.95"))
    return rows


def markdown(report: dict[str, Any]) -> str:
    lines = ["# bertserve: many small requests against a baseline", "", f"Command: `{report['command']}`", ""]
    lines += [f"CPU: {describe_cpu(report['environment'])}.", "", report["setup"], ""]
    lines += [
        "| dtype | server | runs | bulk sentences/s | 32 clients sentences/s | / bulk | worker busy | machine idle "
        "| paced p50 ms |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for dtype, servers in report["servers"].items():
        for name, row in servers.items():
            lines.append(
                f"| {dtype} | {name} | {row['dtype']} | {row['bulk_per_s']:.0f} | {row['clients_per_s']:.0f} | "
                f"{row['clients_per_s'] / row['bulk_per_s']:.2f} | {row['worker_busy']:.2f} | "
                f"{row['idle_share']:.0%} | {row['paced_p50_ms']:.2f} |"
            )
    lines += ["", "| dtype | bulk | 32 clients | paced p50 |", "| --- | ---: | ---: | ---: |"]
    for dtype, servers in report["servers"].items():
        now, then = servers[CURRENT], servers[BASELINE]
        cells = [now[key] / then[key] for key in ("bulk_per_s", "clients_per_s", "paced_p50_ms")]
        lines.append(f"| {dtype}: this checkout / baseline | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    lines += ["", "## Targets", "", targets_markdown(report["targets"])]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = model_parser(__doc__ or "")
    add = parser.add_argument
    add("--baseline", required=True, help="the revision to compare with (a commit, tag or branch)")
    add("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    add("--rounds", type=int, default=3)
    add("--bulk", type=int, default=2000, help="sentences of a bulk request")
    add("--clients", type=int, default=32, help="one-sentence clients at once")
    add("--seconds", type=float, default=8.0, help="their window, after 2 s of warm-up")
    add("--paced", type=int, default=60, help="paced sentences per round")
    add("--pause-ms", type=float, default=50.0)
    args = parser.parse_args()
    model_dir = model_dir_or_exit(parser, args.model_dir)
    texts = read_corpus(args.corpus)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bertserve-baseline-") as folder:
        found = measure(args, model_dir, texts, baseline_python(args.baseline, Path(folder)))
    report = {
        "command": "python benchmarks/small_requests.py " + " ".join(sys.argv[1:]),
        "environment": environment(),
        "setup": (
            f"Model {model_dir}; servers `{' '.join(FLAGS)}`, each at its own defaults; baseline {args.baseline}; "
            f"{args.rounds} rounds, medians; bulk requests of {args.bulk}; {args.clients} clients for "
            f"{args.seconds:g} s; {args.paced} paced sentences ({args.pause_ms:g} ms pause). "
            f"Total {time.perf_counter() - started:.0f} s."
        ),
        "servers": found,
        "targets": report_targets(found),
    }
    text = markdown(report)
    write_report({**report, "targets": [asdict(t) for t in report["targets"]]}, text, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
