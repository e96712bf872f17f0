"""Several models behind one head: what a second model costs in memory, what a neighbour
does to a model's throughput, and whether a flood on one model slows another's small requests.

Two servers run side by side on all-MiniLM-L6-v2 (CPU, fp32, ``--max-seq-len 128``, one
worker per model, ``--threads-per-worker 1``, so every worker has one thread whatever its
neighbours): ``one``, serving ``--model a=DIR``, and ``two``, serving ``--model a=DIR --model
b=DIR,pooling_strategy=CLS_TOKEN`` (the same weights under another pooling, so that a reply of
the wrong model is seen). Every reply is checked against the in-process ``Encoder``'s vector
of its sentence under the options of the model asked (cosine >= 0.99999).

1. memory: each server's settled RSS after a warm-up, split into head (the server process and
   its helpers) and workers; the second model's cost is ``two`` minus ``one``;
2. throughput with a neighbour: ``--clients`` clients on a of ``one`` (alone), then as many on
   each of a and b of ``two`` at once, in turns for ``--rounds``; each model's sentences/s
   against a alone (target >= 0.8), and against what the machine itself gives two one-thread
   processes at once, measured each round;
3. flood isolation: on ``two``, one-sentence requests to a one after another, idle, then while
   ``--flood-clients`` processes keep bulk requests to b in flight, then idle again; the growth
   of a's p50 against one model run of b (b's bulk jobs' median run time from STATUS).

    python benchmarks/models.py --json benchmarks/report/models.json --markdown benchmarks/report/models.md
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bertserve.server.testing.launcher import RunningServer, ServerStartError, start_server
from cohosting import summary
from cohosting.load import Flood, References, client, drive, machine_pair, one_at_a_time
from lib.inputs import default_model_dir, model_dir_or_exit, model_parser, read_corpus
from lib.report import Progress, describe_cpu, environment, format_load, write_report
from lib.rss import family_pss, settled_rss_by_pid
from lib.stats import median, percentile_ms, ratio

MODELS = {"a": {}, "b": {"pooling_strategy": "CLS_TOKEN"}}  # the same weights, two poolings

progress = Progress()


def model_flag(name: str, model_dir: Path) -> str:
    options = "".join(f",{key}={value}" for key, value in MODELS[name].items())
    return f"{name}={model_dir}{options}"


def references(model_dir: Path, corpus: list[str], args: argparse.Namespace) -> References:
    """Each model's vector of every sentence, from the in-process ``Encoder`` with its options."""
    from bertserve.server import Encoder

    vectors = {}
    for name, options in MODELS.items():
        started = time.perf_counter()
        encoder = Encoder(model_dir, max_seq_len=args.max_seq_len, dtype="fp32", **options, **_graph_dir(args))
        vectors[name] = np.asarray(encoder.encode(corpus))
        del encoder
        gc.collect()
        progress(f"references of model {name}: {len(corpus)} sentences in {time.perf_counter() - started:.1f} s")
    return References(vectors)


def _graph_dir(args: argparse.Namespace) -> dict[str, str]:
    return {} if args.graph_dir is None else {"graph_dir": str(args.graph_dir)}


def start_servers(model_dir: Path, args: argparse.Namespace, log_dir: Path) -> dict[str, RunningServer]:
    common = [
        "--cpu",
        "--dtype",
        "fp32",
        "--max-seq-len",
        str(args.max_seq_len),
        "--num-worker",
        "1",
        "--threads-per-worker",
        "1",
    ]
    if args.graph_dir is not None:
        common += ["--graph-dir", str(args.graph_dir)]
    models = {"one": ["a"], "two": list(MODELS)}
    servers: dict[str, RunningServer] = {}
    try:
        for name, served in models.items():
            flags = [flag for model in served for flag in ("--model", model_flag(model, model_dir))]
            servers[name] = start_server(
                *common, *flags, expect_ready=False, echo=False, log_path=log_dir / f"{name}.log"
            )
        for name, server in servers.items():
            seconds = server.wait_ready(args.start_timeout)
            progress(f"server {name} ({', '.join(models[name])}) ready in {seconds:.1f} s")
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: dict[str, RunningServer]) -> list[str]:
    for server in servers.values():
        server.terminate()
    return [f"server {name}: {problem}" for name, server in servers.items() for problem in server.wait_stopped()]


def status(server: RunningServer) -> dict[str, Any]:
    with client(server, "a", timeout_ms=60_000) as control:
        return control.server_status


def workers_by_model(status_: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each model's one local worker, as STATUS lists it."""
    return {w["model"]: w for w in status_["workers"] if not w.get("remote")}


def warm_up(servers: dict[str, RunningServer], corpus: list[str]) -> None:
    """A request of 64 sentences and a few of one to every model, so each worker has run both paths."""
    for server in servers.values():
        for model in workers_by_model(status(server)):
            with client(server, model) as bert:
                bert.encode(corpus[:64])
                for text in corpus[64:72]:
                    bert.encode([text])


def memory(servers: dict[str, RunningServer]) -> dict[str, Any]:
    """Each server's settled RSS split into head and workers, and the second model's cost."""
    worker_pids = {
        name: {w["pid"] for w in workers_by_model(status(server)).values()} for name, server in servers.items()
    }
    by_pid = dict(zip(servers, settled_rss_by_pid(list(servers.values())), strict=True))
    split: dict[str, dict[str, Any]] = {}
    for name, rss in by_pid.items():
        pss = family_pss(servers[name])
        split[name] = {
            **_by_role(rss, worker_pids[name], "mib"),
            **_by_role(pss, worker_pids[name], "pss_mib"),
            "each_worker_mib": [round(mib, 1) for pid, mib in rss.items() if pid in worker_pids[name]],
            "processes": len(rss),
        }
    sums = [f"{role}_{unit}" for unit in ("mib", "pss_mib") for role in ("head", "workers", "total")]
    return {**split, "extra_model": {key: round(split["two"][key] - split["one"][key], 1) for key in sums}}


def _by_role(by_pid: dict[int, float], workers: set[int], unit: str) -> dict[str, float]:
    """``by_pid`` summed into head (the server process and its helpers), workers and total."""
    head = sum(mib for pid, mib in by_pid.items() if pid not in workers)
    work = sum(mib for pid, mib in by_pid.items() if pid in workers)
    return {f"head_{unit}": round(head, 1), f"workers_{unit}": round(work, 1), f"total_{unit}": round(head + work, 1)}


def neighbours(
    servers: dict[str, RunningServer], corpus: list[str], refs: References, args: argparse.Namespace
) -> dict[str, Any]:
    """Rounds of a alone on ``one`` and a and b at once on ``two``, the order alternating."""
    rounds = []
    for round_ in range(args.rounds):
        steps: dict[str, Any] = {"load_average": list(os.getloadavg()), "machine": machine_pair(args.machine_seconds)}
        progress(
            f"round {round_ + 1}, the machine: two one-thread processes at once each run "
            f"{steps['machine']['ratio']:.2f} of one alone"
        )
        order = ("alone", "neighbour") if round_ % 2 == 0 else ("neighbour", "alone")
        for step in order:
            server, clients = (
                (servers["one"], {"a": args.clients})
                if step == "alone"
                else (servers["two"], {model: args.clients for model in MODELS})
            )
            steps[step] = drive(server, clients, corpus, args.request_size, args.seconds, refs)
            rates = ", ".join(f"{m} {r['sentences_per_s']:.0f}" for m, r in steps[step].items())
            progress(f"round {round_ + 1}, {step}: sentences/s {rates}")
        alone = steps["alone"]["a"]["sentences_per_s"]
        steps["ratio"] = {m: round(ratio(r["sentences_per_s"], alone), 3) for m, r in steps["neighbour"].items()}
        rounds.append(steps)
    alone = median([r["alone"]["a"]["sentences_per_s"] for r in rounds])
    with_neighbour = {m: median([r["neighbour"][m]["sentences_per_s"] for r in rounds]) for m in MODELS}
    machine = median([r["machine"]["ratio"] for r in rounds])
    ratios = {m: round(ratio(rate, alone), 3) for m, rate in with_neighbour.items()}
    return {
        "rounds": rounds,
        "alone_sentences_per_s": alone,
        "neighbour_sentences_per_s": with_neighbour,
        "ratio": ratios,
        "ratio_by_round": {m: [r["ratio"][m] for r in rounds] for m in MODELS},
        "machine_pair_ratio": machine,
        "ratio_of_machine": {m: round(ratio(value, machine), 3) for m, value in ratios.items()},
    }


def _b_counters(server: RunningServer) -> tuple[dict[str, Any], float]:
    snapshot = status(server)
    return {**workers_by_model(snapshot)["b"], "recent_jobs": snapshot["recent_jobs"]}, time.monotonic()


def flood(server: RunningServer, corpus: list[str], refs: References, args: argparse.Namespace) -> dict[str, Any]:
    """a's one-sentence latency idle, then while processes keep bulk requests to b in flight,
    then idle again (the idle figures pool both, so a drift of the machine falls on both sides)."""
    starts = [1000 + 37 * i for i in range(args.small_requests)]
    _, warm_tally = one_at_a_time(server, "a", corpus, [7 * i for i in range(20)], refs)  # untimed
    idle_before, idle_tally = one_at_a_time(server, "a", corpus, starts, refs)
    idle_tally.merge(warm_tally)
    progress(
        f"a idle: one-sentence p50 {percentile_ms(idle_before, 50):.1f} ms, p99 {percentile_ms(idle_before, 99):.1f} ms"
    )
    bulk = Flood(server, "b", corpus, refs, args.bulk_size, args.flood_clients)
    bulk.start()
    try:
        deadline = time.monotonic() + 300
        while workers_by_model(status(server))["b"]["jobs_in_flight"] == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(args.flood_ramp)  # every flood process has sent its first request
        before, began = _b_counters(server)
        loaded, loaded_tally = one_at_a_time(server, "a", corpus, starts, refs)
        after, ended = _b_counters(server)
    finally:
        flood_tally = bulk.stop()
    progress(
        f"a under the flood on b: one-sentence p50 {percentile_ms(loaded, 50):.1f} ms, "
        f"p99 {percentile_ms(loaded, 99):.1f} ms"
    )
    idle_after, after_tally = one_at_a_time(server, "a", corpus, starts, refs)
    idle_tally.merge(after_tally)
    idle = idle_before + idle_after
    jobs = after["jobs_done"] - before["jobs_done"]
    busy_s = after["busy_s"] - before["busy_s"]
    sentences = after["sentences"] - before["sentences"]
    job_s = after["recent_jobs"]["bulk_median_seconds"]
    replies = {"a_idle": idle_tally, "a_flood": loaded_tally, "b_flood": flood_tally}
    p50 = {"idle": percentile_ms(idle, 50), "flood": percentile_ms(loaded, 50)}
    p99 = {"idle": percentile_ms(idle, 99), "flood": percentile_ms(loaded, 99)}
    growth_ms = p50["flood"] - p50["idle"]
    progress(
        f"a idle again: one-sentence p50 {percentile_ms(idle_after, 50):.1f} ms; b's bulk jobs: median "
        f"{job_s * 1000:.0f} ms"
    )
    return {
        "small_requests": args.small_requests,
        "bulk_size": args.bulk_size,
        "flood_clients": args.flood_clients,
        "a_ms": {
            "idle": {
                "p50": p50["idle"],
                "p99": p99["idle"],
                "count": len(idle),
                "p50_before": percentile_ms(idle_before, 50),
                "p50_after": percentile_ms(idle_after, 50),
            },
            "flood": {"p50": p50["flood"], "p99": p99["flood"], "count": len(loaded)},
        },
        "p50_growth_ms": growth_ms,
        "p99_growth_ms": p99["flood"] - p99["idle"],
        "b_job_ms": {
            "status_bulk_median": job_s * 1000,  # STATUS recent_jobs: only b ran bulk jobs
            "window_mean": 1000 * busy_s / jobs if jobs else None,  # b's worker's counters over the window
            "window_jobs": jobs,
            "window_sentences_per_job": sentences / jobs if jobs else None,
            "window_busy_fraction": busy_s / (ended - began) if ended > began else None,
        },
        "growth_over_b_job": ratio(growth_ms, job_s * 1000),
        "replies": {name: tally.as_dict() for name, tally in replies.items()},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = model_parser(__doc__)
    parser.add_argument("--graph-dir", type=Path, help="graph cache of the Encoder and the servers")
    parser.add_argument("--max-seq-len", type=int, default=128)
    parser.add_argument("--limit", type=int, help="the first N corpus sentences only")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each throughput step")
    parser.add_argument("--clients", type=int, default=16, help="clients per model in the throughput steps")
    parser.add_argument("--request-size", type=int, default=16, help="sentences a request in the throughput steps")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alone / with a neighbour")
    parser.add_argument(
        "--machine-seconds",
        type=float,
        default=4.0,
        help="seconds of each step of the machine's own two-process check, each round",
    )
    parser.add_argument("--small-requests", type=int, default=300, help="a's timed one-sentence requests, each way")
    parser.add_argument("--bulk-size", type=int, default=1000, help="sentences in each flood request to b")
    parser.add_argument("--flood-clients", type=int, default=3, help="flood processes, one request in flight each")
    parser.add_argument("--flood-ramp", type=float, default=2.0, help="seconds of flood before a is timed")
    parser.add_argument("--start-timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    args.model_dir = model_dir_or_exit(parser, args.model_dir)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    corpus = read_corpus(args.corpus, args.limit)
    env = environment()
    progress(f"{describe_cpu(env)}; load average {format_load(list(os.getloadavg()))}")
    load_start = list(os.getloadavg())
    refs = references(args.model_dir, corpus, args)
    log_dir = Path(tempfile.mkdtemp(prefix="bertserve-models-"))
    try:
        servers = start_servers(args.model_dir, args, log_dir)
    except ServerStartError as exc:
        print(f"a server did not start (logs in {log_dir}): {exc}", file=sys.stderr)
        return 2
    problems: list[str] = []
    try:
        warm_up(servers, corpus)
        progress("warmed up; reading the settled RSS")
        mem = memory(servers)
        progress(
            f"RSS one {mem['one']['total_mib']:.0f} MiB, two {mem['two']['total_mib']:.0f} MiB: the second "
            f"model {mem['extra_model']['head_mib']:+.0f} MiB head, {mem['extra_model']['workers_mib']:+.0f} "
            "MiB workers"
        )
        throughput = neighbours(servers, corpus, refs, args)
        problems += stop_servers({"one": servers.pop("one")})
        isolation = flood(servers["two"], corpus, refs, args)
    except BaseException:
        print(f"server logs kept in {log_dir}", file=sys.stderr)
        raise
    finally:
        problems += stop_servers(servers)
    for problem in problems:
        progress(problem)
    report: dict[str, Any] = {
        "kind": "models",
        "environment": env,
        "load_average": {"start": load_start, "end": list(os.getloadavg())},
        "seconds_total": round(progress.elapsed(), 1),
        "model_dir": str(args.model_dir),
        "model_name": "all-MiniLM-L6-v2" if args.model_dir == default_model_dir() else args.model_dir.name,
        "models": {name: {"options": options} for name, options in MODELS.items()},
        "max_seq_len": args.max_seq_len,
        "corpus_sentences": len(corpus),
        "cross_model_cosine": refs.cross_model_cosine(),
        "clients": args.clients,
        "request_size": args.request_size,
        "seconds": args.seconds,
        "memory": mem,
        "throughput": throughput,
        "flood": isolation,
        "stop_problems": problems,
    }
    report["replies_total"] = summary.summed(summary.all_replies(report))
    report["targets"], bad = summary.verdict(report)
    write_report(report, summary.markdown(report), args.json, args.markdown)
    if problems:
        print(f"server logs kept in {log_dir}", file=sys.stderr)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 1 if bad or problems else 0


if __name__ == "__main__":
    sys.exit(main())
