"""One sentence at a time: how fast bertserve answers a single query, beside its peers, and
where that time goes.

    python benchmarks/latency.py --json benchmarks/report/latency.json \\
        --markdown benchmarks/report/latency.md --plot benchmarks/report/latency.png

In one run, on the same corpus and model (all-MiniLM-L6-v2 by default):

1. **The fp32 compute floor** of one sentence, first and alone (``--no-roofline`` leaves it
   out): the model's FLOPs per token x the timed sentences' mean tokens, at this machine's
   fp32 matrix-product rate at the model's shapes on 2 threads (``comparing/roofline.py``).
2. **In process**, one sentence per call: sentence-transformers (when installed), the
   ``Encoder`` at its default dtype (``auto``), at fp32 (and at fp32 with every run on
   TensorFlow, ``lite_max_tokens=0``), bf16 and int8, each in a process of its own, in two
   rounds that take turns, so noise on a shared machine falls on all of them alike
   (``lib/in_process.py``).
3. **Through a server** (one worker, ``--cpu``): the default (no ``--dtype``: auto), fp32,
   bf16 and int8, and a server of a model that costs nothing (the plumbing floor):
   ``BertClient.encode([s])``, the servers taking turns sentence by sentence. Each server's
   ``dtype`` and ``small_run_dtype`` (``server_config``) go in the report; a contender or
   server that cannot run here is left out, with its reason.
4. **Where one sentence's time goes** through the default server (``lib/one_sentence.py``): a
   client <-> head control round trip, the plumbing floor, the worker's own job time, the
   model in process (Encoder auto), and the server's p50 split into the model and what
   serving adds (the plumbing floor and the rest).
5. **Under bulk load**: the one-sentence latency while another client keeps the default
   server busy with bulk requests, against the server's own median bulk mini-job time.
6. **One paced query** (``lib/paced.py``; ``--no-paced`` leaves it out): one query, then a
   pause of ``--pause-ms`` (50), as users send them, at exactly 16, 64, 128 and 256 tokens:
   the default server (alone, with its HTTP port, ``--max-seq-len 256``) over ZeroMQ and over
   HTTP, against ``Encoder`` auto and ONNX Runtime fp32 in process, paced the same.
7. **Many one-sentence clients** (``lib/client_sweep.py``; ``--no-sweep``): 1 to 128 clients
   at once (``--sweep-clients``) on that server, over ZeroMQ and over HTTP, spread over up to 8
   processes so that the benchmark's own GIL does not cap the load; per level sentences/s,
   p50 and p99, the machine's idle share and each server process's CPU; and one bulk client.
8. **Start and memory**: time to ready with an empty graph cache (cold) and a filled one
   (warm), the first request after ready, and the worker's RSS (default dtype) after a
   3,000-sentence bulk request next to the RSS of a process that only imported TensorFlow.
9. **Targets**, PASS or MISS (n/a where not measured): the default server against server
   fp32, the compute floor and Encoder auto; int8 against fp32; RSS; the paced query against
   Encoder auto + 1.5 ms and ONNX Runtime fp32 at each length; 32 clients against one bulk
   client, and the idle share under them, over each protocol.

Every latency is a median (p50) with p90 and p99 over ``--sentences`` different sentences,
after ``--warmup`` sentences of warm-up. ``--idle-only`` keeps to 1 to 4 and 6 (and the
targets they decide): for a large model, where the bulk requests of 5, 7 and 8 take minutes.
``--quick`` is a smoke run of every section: few sentences and queries, three short levels.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import subprocess
import sys
import tempfile
import time
from argparse import Namespace
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer, ServerStartError, start_server
from comparing.roofline import RooflineRun, Shapes
from comparing.targets import Target, target, targets_markdown
from lib import client_sweep, in_process, one_sentence, paced
from lib.in_process import ST
from lib.inputs import cycle_take, mean_tokens, model_dir_or_exit, model_parser, read_corpus
from lib.load import take_turns, timed
from lib.protocols import start_default_server
from lib.report import describe_cpu, environment, last_line, pyplot, tagged_log, write_report
from lib.rss import max_rss_mib
from lib.stats import ratio

MAX_SEQ_LEN = 128
SERVER_FLAGS = ("--num-worker", "1", "--cpu", "--max-seq-len", str(MAX_SEQ_LEN))
SERVER_DTYPES = ("auto", "fp32", "bf16", "int8")  # auto: no --dtype flag, the server's default
DEFAULT = "server auto"
PLUMBING = "server of a model that costs nothing"
CONFIG_KEYS = ("dtype", "dtype_requested", "small_run_dtype", "lite_max_tokens")
RSS_GOAL = "default dtype; the TensorFlow-only process's RSS + 400 MiB"
ROOFLINE_TOKENS = 1536  # T of the timed products, as suite.py compare: a bulk batch, 64 sentences x 24 tokens

log = tagged_log("latency")


def fp32_floor(model_dir: Path, texts: list[str]) -> dict[str, Any] | None:
    """The fp32 compute floor of one of ``texts`` (:func:`lib.one_sentence.compute_floor`) at
    the rate ``comparing/roofline.py`` measures on 2 threads; None when the model has no config."""
    shapes = Shapes.of_model(model_dir)
    if shapes is None:
        return None
    tokens = mean_tokens(model_dir, texts, MAX_SEQ_LEN)
    log(f"matmul rates at the model's shapes (T {ROOFLINE_TOKENS}, 2 threads)")
    run = RooflineRun(shapes, tokens_per_sentence=tokens, tokens=ROOFLINE_TOKENS, threads=2, repeats=10)
    try:
        floor = one_sentence.compute_floor(shapes.flops_per_token(), tokens, asdict(run.result()))
    finally:
        run.stop()
    log(f"fp32 {floor['fp32_gflops']} GFLOP/s: {tokens:.1f} tokens take at least {floor['floor_ms']:.2f} ms")
    return floor


def server(model_dir: Path, graph_dir: Path | None, *flags: str) -> RunningServer:
    extra = ("--graph-dir", str(graph_dir)) if graph_dir is not None else ()
    return start_server("--model-dir", str(model_dir), *SERVER_FLAGS, *extra, *flags, echo=False)


def server_starts(args: Namespace, model_dir: Path) -> dict[str, Callable[[], RunningServer]]:
    """How to start each server, by name: one per dtype (auto with no flag), and the plumbing floor."""
    starts: dict[str, Callable[[], RunningServer]] = {
        f"server {dtype}": partial(server, model_dir, args.graph_dir, *(() if dtype == "auto" else ("--dtype", dtype)))
        for dtype in SERVER_DTYPES
    }
    return starts | {PLUMBING: partial(one_sentence.start_plumbing_server, *SERVER_FLAGS)}


def through_servers(args: Namespace, model_dir: Path, texts: list[str]) -> dict[str, Any]:
    """The servers up at once, taking turns sentence by sentence; then the default server's
    hops, and (without ``--idle-only``) its latency under bulk load."""
    with contextlib.ExitStack() as stack:
        running: dict[str, RunningServer] = {}
        left_out: dict[str, str] = {}
        for name, start in server_starts(args, model_dir).items():
            log(f"starting {name}")
            try:
                running[name] = start()
            except ServerStartError as exc:
                left_out[name] = last_line(str(exc))
                log(f"{name} left out: {left_out[name]}")
                continue
            stack.callback(running[name].stop)
        if DEFAULT not in running:
            raise SystemExit(f"the default server did not start: {left_out[DEFAULT]}")
        clients = {n: stack.enter_context(BertClient(**s.client_kwargs, timeout=60_000)) for n, s in running.items()}
        configs = {n: {k: c.server_config.get(k) for k in CONFIG_KEYS} for n, c in clients.items() if n != PLUMBING}
        log(f"{', '.join(running)}: {len(texts)} sentences each")
        latency = take_turns({name: c.encode for name, c in clients.items()}, texts, args.warmup)
        hops = {
            "plumbing": latency.pop(PLUMBING, None),
            "job": one_sentence.worker_job(clients[DEFAULT].server_status),  # its jobs so far: the idle run's
            "control": one_sentence.control_round_trip(clients[DEFAULT]),
        }
        result = {"latency": latency, "servers": configs, "left_out": left_out, "hops": hops}
        if not args.idle_only:
            log(f"{DEFAULT} under bulk load: {args.loaded_sentences} sentences")
            result["under_bulk_load"] = one_sentence.under_bulk(
                clients[DEFAULT], running[DEFAULT], texts, args.loaded_sentences
            )
    return result


def paced_and_sweep(args: Namespace, model_dir: Path, corpus: list[str]) -> dict[str, Any]:
    """The paced queries and the client sweep on one default server with its HTTP port, up
    alone (the servers above are stopped), at ``--max-seq-len 256`` for the longest input."""
    pacing, sweep = paced.Pacing.of(args), client_sweep.Sweep.of(args)
    found: dict[str, Any] = {"paced": None, "sweep": None}
    if pacing is None and sweep is None:
        return found
    log(f"starting the default server with its HTTP port, --max-seq-len {paced.MAX_SEQ_LEN}")
    running, doors = start_default_server(model_dir, args.graph_dir, paced.MAX_SEQ_LEN)
    try:
        if pacing is not None:
            found["paced"] = paced.measure(doors, model_dir, args.graph_dir, corpus, pacing, log)
        if sweep is not None:
            found["sweep"] = client_sweep.measure(running, doors, corpus, sweep, log)
    finally:
        running.stop()
    return found


def start_and_memory(model_dir: Path, texts: list[str]) -> dict[str, Any]:
    """Time to ready cold and warm, the first request after ready, and the worker's RSS after
    a 3,000-sentence request: the default server (no ``--dtype``)."""
    with tempfile.TemporaryDirectory(prefix="bertserve-graphs-") as graphs:
        ready, first_ms = {}, {}
        for kind in ("cold", "warm"):
            running = server(model_dir, Path(graphs))
            try:
                ready[kind] = running.wait_ready()
                with BertClient(**running.client_kwargs, timeout=60_000) as bc:
                    first_ms[kind] = 1000 * timed(partial(bc.encode, [texts[0]]))[0]
                    steady = [timed(partial(bc.encode, [text]))[0] for text in texts[1:41]]
                    if kind == "warm":
                        bc.encode(cycle_take(texts, 0, 3000))
                        worker_rss = max_rss_mib(w["pid"] for w in bc.server_status["workers"])
            finally:
                running.stop()
            log(f"{kind} start: ready in {ready[kind]:.1f} s, first request {first_ms[kind]:.1f} ms")
    probe = "import psutil, tensorflow; print(psutil.Process().memory_info().rss)"
    tf_rss = int(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    return {
        "ready_cold_s": ready["cold"],
        "ready_warm_s": ready["warm"],
        "warm_over_cold": ready["warm"] / ready["cold"],
        "first_request_ms": first_ms,
        "steady_p50_ms": 1000 * statistics.median(steady),
        "worker_rss_mib": worker_rss,
        "import_tensorflow_rss_mib": tf_rss / 2**20,
    }


def targets(report: dict[str, Any]) -> list[Target]:
    """Each goal against what this run measured; n/a where it did not (``--idle-only``, a
    contender left out, ``--no-roofline``)."""

    def p50(name: str) -> float:
        return report["latency"].get(name, {}).get("p50_ms", math.nan)

    auto, fp32, floor = p50(DEFAULT), p50("server fp32"), (report["compute_floor"] or {}).get("floor_ms", math.nan)
    start = report["start"] or {}
    rss_goal = start.get("import_tensorflow_rss_mib", math.nan) + 400
    goals = [
        ("default server p50 <= server fp32 p50, ms", auto, "<=", fp32, "one sentence, idle, in turns"),
        ("default server p50 <= 2.5 x the fp32 compute floor, ms", auto, "<=", 2.5 * floor, "the floor: above"),
        ("default server p50 <= Encoder auto p50 + 1.5 ms, ms", auto, "<=", p50("Encoder auto") + 1.5, "idle"),
        ("server int8 p50 / server fp32 p50", ratio(p50("server int8"), fp32), "<=", 0.6, "one sentence, idle"),
        ("Encoder int8 p50 / Encoder fp32 p50", ratio(p50("Encoder int8"), p50("Encoder fp32")), "<=", 0.6, ""),
        ("worker RSS after 3,000 sentences, MiB", start.get("worker_rss_mib", math.nan), "<=", rss_goal, RSS_GOAL),
    ]
    found = [target(name, measured, op, round(bound, 2), detail) for name, measured, op, bound, detail in goals]
    return found + paced.targets(report["paced"]) + client_sweep.targets(report["sweep"])


def markdown(report: dict[str, Any]) -> str:
    lines = ["# bertserve: one sentence at a time", "", f"Command: `{report['command']}`", ""]
    lines += [f"CPU: {describe_cpu(report['environment'])}.", "", report["setup"], "", *_server_lines(report), ""]
    lines += ["| path | p50 ms | p90 ms | p99 ms |", "| --- | ---: | ---: | ---: |"]
    for name, row in report["latency"].items():
        lines.append(f"| {name} | {row['p50_ms']:.1f} | {row['p90_ms']:.1f} | {row['p99_ms']:.1f} |")
    lines += ["", "## Where one sentence's time goes", "", "Through the default server (no `--dtype`: auto).", ""]
    lines += [*one_sentence.hops_markdown(report["hops"]), "", *one_sentence.floor_markdown(report["compute_floor"])]
    lines += [] if report["start"] is None else _loaded_lines(report)
    lines += [*paced.markdown(report["paced"]), *client_sweep.markdown(report["sweep"])]
    lines += ["", "## Targets", "", targets_markdown(report["targets"])]
    ratio_rows = [f"| {name} | {value:.2f} |" for name, value in report["ratios"].items()]
    lines += ["", "| ratio | measured |", "| --- | ---: |", *ratio_rows] if ratio_rows else []
    return "\n".join(lines) + "\n"


def _server_lines(report: dict[str, Any]) -> list[str]:
    """What each server runs (``server_config``), and what was left out and why."""
    runs = []
    for name, config in report["servers"].items():
        small = config.get("small_run_dtype")
        lite = f", runs of up to {config.get('lite_max_tokens')} tokens in {small} on LiteRT" if small else ""
        runs.append(f"{name}: {config.get('dtype')} (asked {config.get('dtype_requested')}){lite}")
    lines = [f"What the servers run (`server_config`): {'; '.join(runs)}."]
    return lines + [line for name, why in report["left_out"].items() for line in ("", f"Left out: {name}: {why}")]


def _loaded_lines(report: dict[str, Any]) -> list[str]:
    """The paragraphs on bulk load, start and memory (not with ``--idle-only``)."""
    loaded, start = report["under_bulk_load"], report["start"]
    return [
        "",
        f"Under a saturating bulk client (the default server, {report['servers'][DEFAULT].get('dtype')}): p50 "
        f"{loaded['p50_ms']:.0f} ms, p99 {loaded['p99_ms']:.0f} ms; the server's median bulk mini-job took "
        f"{loaded['bulk_job_median_ms']:.0f} ms.",
        "",
        f"Start (the default server): ready in {start['ready_cold_s']:.1f} s cold, {start['ready_warm_s']:.1f} s warm "
        f"({start['warm_over_cold']:.2f}); first request after ready {start['first_request_ms']['warm']:.0f} ms "
        f"(steady p50 {start['steady_p50_ms']:.0f} ms). Worker RSS after a 3,000-sentence bulk request "
        f"{start['worker_rss_mib']:.0f} MiB; a process that only imported TensorFlow "
        f"{start['import_tensorflow_rss_mib']:.0f} MiB.",
    ]


def ratios(report: dict[str, Any]) -> dict[str, float]:
    lat, start = report["latency"], report["start"]
    out: dict[str, float] = {}
    if ST in lat:
        out |= {f"{n} p50 / {ST} p50": lat[n]["p50_ms"] / lat[ST]["p50_ms"] for n in lat if n != ST}
    if start is None:  # --idle-only
        return out
    loaded = report["under_bulk_load"]
    bound = lat[DEFAULT]["p50_ms"] + 1.5 * loaded["bulk_job_median_ms"]
    out["loaded p99 / (idle p50 + 1.5 x bulk mini-job), default server"] = loaded["p99_ms"] / bound
    out["ready warm / cold"] = start["warm_over_cold"]
    out["first request after ready / steady p50"] = ratio(start["first_request_ms"]["warm"], start["steady_p50_ms"])
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    names = list(report["latency"])
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(names)), 4))
    x = np.arange(len(names))
    for offset, key in ((-0.2, "p50_ms"), (0.2, "p99_ms")):
        ax.bar(x + offset, [report["latency"][n][key] for n in names], width=0.4, label=key.replace("_ms", ""))
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("ms per one-sentence request")
    ax.set_title("One sentence at a time (lower is better)")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    add = parser.add_argument
    add("--graph-dir", type=Path, help="graph cache of the idle runs (default: the user's)")
    add("--sentences", type=int, default=300, help="timed sentences per contender")
    add("--warmup", type=int, default=60)
    add("--loaded-sentences", type=int, default=100)
    add("--idle-only", action="store_true", help="the idle latencies, hops and paced queries: no load, no start")
    paced.add_options(parser)
    client_sweep.add_options(parser)
    add("--quick", action="store_true", help="a smoke run: 20 sentences, 6 paced queries, 1, 8, 32 clients for 2 s")
    add("--no-sentence-transformers", action="store_true")
    add("--no-roofline", action="store_true", help="leave out the fp32 compute floor (the machine's matmul rate)")
    add("--plot", type=Path)
    args = parser.parse_args(argv)
    if args.quick:  # every section, briefly: it shows that each runs, not what it measures
        args.sentences, args.warmup, args.loaded_sentences = 20, 4, 8
    model_dir = model_dir_or_exit(parser, args.model_dir)
    corpus = read_corpus(args.corpus)
    texts = corpus[: args.warmup + args.sentences]
    started = time.perf_counter()
    floor = None if args.no_roofline else fp32_floor(model_dir, texts[args.warmup :])  # first, with nothing else up
    latency, left_out = in_process.measure(
        model_dir,
        args.graph_dir,
        texts,
        warmup=args.warmup,
        max_seq_len=MAX_SEQ_LEN,
        st=not args.no_sentence_transformers,
        log=log,
    )
    served = through_servers(args, model_dir, texts)
    latency |= served["latency"]
    alone = paced_and_sweep(args, model_dir, corpus)
    report: dict[str, Any] = {
        "command": "python benchmarks/latency.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "latency": latency,
        "servers": served["servers"],
        "left_out": left_out | served["left_out"],
        "hops": one_sentence.summary(
            served["hops"], ("Encoder auto", latency.get("Encoder auto")), (DEFAULT, latency[DEFAULT])
        ),
        "compute_floor": floor,
        "under_bulk_load": served.get("under_bulk_load"),
        "paced": alone["paced"],
        "sweep": alone["sweep"],
        "start": None if args.idle_only else start_and_memory(model_dir, corpus),
    }
    report["setup"] = (
        f"Machine: {psutil.cpu_count()} cores, load average {psutil.getloadavg()[0]:.2f} at the end; model "
        f"{model_dir}; corpus {args.corpus.name}, {args.sentences} timed sentences after {args.warmup} of warm-up; "
        f"servers `{' '.join(SERVER_FLAGS)}`, the default one with no `--dtype` (auto). "
        f"Total {time.perf_counter() - started:.0f} s."
    )
    report["targets"], report["ratios"] = targets(report), ratios(report)
    text = markdown(report)
    write_report({**report, "targets": [asdict(t) for t in report["targets"]]}, text, args.json, args.markdown)
    if args.plot:
        plot(report, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
