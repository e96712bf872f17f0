"""One-sentence requests through a server: where their time goes, and how they fare under
bulk load (``latency.py``'s server parts).

Where the time goes, each hop of a one-sentence request timed on its own:

- **client <-> head**: a control round trip, ``BertClient.server_status`` on an idle server
  (client -> head -> client: no worker, no sink), :func:`control_round_trip`;
- **the plumbing floor**: client -> head -> worker -> sink -> client with a model that costs
  nothing (:class:`lib.instant_model.InstantModel`), served by :func:`start_plumbing_server`;
- **the worker's own job time**: ``server_status["recent_jobs"]["median_seconds"]`` read
  right after an idle one-sentence run (the model run and the worker's packaging of the
  reply; tokenization, in the worker's feed thread, is not in it), :func:`worker_job`;
- the model in process and the server's p50, which the command measures;
- **the fp32 compute floor** of the model's run: the FLOPs of one sentence at a measured fp32
  rate (``comparing/roofline.py`` measures it; :func:`compute_floor` does the arithmetic).

:func:`summary` puts them together and splits the server's p50 into the model in process and
what serving adds, and that into the plumbing floor and the rest; :func:`hops_markdown`
prints both tables. Then :func:`under_bulk`, one-sentence latency while another client keeps
the server busy in bulk (many one-sentence clients at once are :mod:`lib.client_sweep`'s).
"""

from __future__ import annotations

import math
import os
import threading
import time
from functools import partial
from typing import Any

from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer, start_server

from lib.inputs import BENCHMARKS_DIR, cycle_take
from lib.load import timed
from lib.stats import latency_row, ratio

INSTANT_MODEL = "lib.instant_model:InstantModel"
NAN_ROW = {"p50_ms": math.nan, "p90_ms": math.nan, "p99_ms": math.nan, "count": 0}


def start_plumbing_server(*flags: str) -> RunningServer:
    """A server of :class:`lib.instant_model.InstantModel` with ``flags`` (``benchmarks/`` put
    on its ``PYTHONPATH``, where its workers import the model from)."""
    path = os.pathsep.join(filter(None, [str(BENCHMARKS_DIR), os.environ.get("PYTHONPATH")]))
    return start_server("--model-class", INSTANT_MODEL, *flags, env={"PYTHONPATH": path}, echo=False)


def control_round_trip(client: BertClient, repeats: int = 100, warmup: int = 5) -> dict[str, float]:
    """p50, p90 and p99 of ``repeats`` STATUS calls: client -> head -> client."""
    for _ in range(warmup):
        timed(lambda: client.server_status)
    return latency_row([timed(lambda: client.server_status)[0] for _ in range(repeats)])


def worker_job(status: dict[str, Any]) -> dict[str, float]:
    """The workers' median job time (ms) over their last jobs, from ``server_status``."""
    recent = status["recent_jobs"]
    return {
        "median_ms": 1000 * float(recent["median_seconds"]),
        "jobs": int(recent["count"]),
        "median_sentences": float(recent["median_sentences"]),
    }


def compute_floor(flops_per_token: float, tokens: float, roofline: dict[str, Any]) -> dict[str, Any]:
    """The fp32 compute floor of one sentence of ``tokens`` tokens: its FLOPs at the fp32 rate
    of ``roofline`` (a ``comparing.roofline.Roofline`` as a dict); NaN where it has none."""
    gflops = (roofline["rates"].get("fp32") or {}).get("gflops")
    floor_ms = 1000 * flops_per_token * tokens / (gflops * 1e9) if gflops else math.nan
    return {
        "fp32_gflops": gflops,
        "flops_per_token": flops_per_token,
        "mean_tokens": tokens,
        "floor_ms": floor_ms,
        "roofline": roofline,
    }


def floor_markdown(floor: dict[str, Any] | None) -> list[str]:
    if floor is None:
        return ["The fp32 compute floor was not measured (`--no-roofline`, or the model has no config)."]
    roof = floor["roofline"]
    return [
        f"The fp32 compute floor of one sentence: {floor['flops_per_token'] / 1e6:.3g} MFLOP per token x "
        f"{floor['mean_tokens']:.1f} tokens (the timed sentences' mean) at {floor['fp32_gflops']} GFLOP/s (this "
        f"machine's fp32 matrix-product rate at the model's shapes, T {roof['tokens']}, {roof['threads']} threads) "
        f"= {_ms(floor['floor_ms'])} ms." + (f" Not measured: {roof['error']}" if roof["error"] else "")
    ]


def summary(
    measured: dict[str, Any], model: tuple[str, dict[str, float] | None], server: tuple[str, dict[str, float]]
) -> dict[str, Any]:
    """Every hop, and the split of the server's p50. ``measured``: the hops timed through the
    server, ``control`` (:func:`control_round_trip`), ``plumbing`` (the plumbing floor's row,
    None if it did not run) and ``job`` (:func:`worker_job`); ``model`` and ``server``: the
    name and latency row of the model in process and of the server. The split: the model in
    process (its p50), what serving adds (the rest), and of that the plumbing floor and the rest."""
    (model_name, model_row), (server_name, server_row) = model, server
    control, job = measured["control"], measured["job"]
    plumbing, model_row = measured["plumbing"] or NAN_ROW, model_row or NAN_ROW
    server_ms, model_ms, floor_ms = server_row["p50_ms"], model_row["p50_ms"], plumbing["p50_ms"]
    adds = server_ms - model_ms
    parts = {
        f"the model in process ({model_name} p50)": model_ms,
        "what serving adds": adds,
        "of which the plumbing floor": floor_ms,
        "of which the rest": adds - floor_ms,
        f"{server_name} p50": server_ms,
    }
    return {
        "control_round_trip": control,
        "plumbing_floor": plumbing,
        "worker_job": job,
        "model": {"name": model_name, **model_row},
        "server": {"name": server_name, **server_row},
        "split": {name: {"ms": ms, "share": ratio(ms, server_ms)} for name, ms in parts.items()},
    }


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}"


def hops_markdown(hops: dict[str, Any]) -> list[str]:
    """The hops table and the split of the server's p50, as markdown lines."""
    model, server, job = hops["model"], hops["server"], hops["worker_job"]
    rows = [
        ("client <-> head: STATUS round trip, idle", "client -> head -> client", hops["control_round_trip"]["p50_ms"]),
        (
            "the plumbing floor: a server of a model that costs nothing",
            "client -> head -> worker -> sink -> client",
            hops["plumbing_floor"]["p50_ms"],
        ),
        (
            f"the worker's own job time (`recent_jobs` median of {job['jobs']} jobs)",
            "the model run and the reply's packaging in the worker, not tokenization",
            job["median_ms"],
        ),
        (f"the model in process: {model['name']}", "tokenization and the model run", model["p50_ms"]),
        (f"through the server: {server['name']}", "everything", server["p50_ms"]),
    ]
    lines = ["| hop | covers | p50 ms |", "| --- | --- | ---: |"]
    lines += [f"| {name} | {covers} | {_ms(ms)} |" for name, covers, ms in rows]
    lines += ["", f"| {server['name']} p50, split | ms | share |", "| --- | ---: | ---: |"]
    for name, part in hops["split"].items():
        share = "n/a" if math.isnan(part["share"]) else f"{part['share']:.0%}"
        lines.append(f"| {name} | {_ms(part['ms'])} | {share} |")
    return lines


def under_bulk(client: BertClient, running: RunningServer, texts: list[str], sentences: int) -> dict[str, float]:
    """One-sentence latency (``sentences`` of ``texts``, through ``client``) while another
    client keeps the server busy with bulk requests, and the server's median bulk mini-job."""
    stop = threading.Event()
    bulk = cycle_take(texts, 0, 1000)

    def flood() -> None:
        with BertClient(**running.client_kwargs, timeout=120_000) as bulk_client:
            while not stop.is_set():
                bulk_client.encode(bulk)

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    time.sleep(2.0)  # the bulk client's first jobs are running
    times = []
    try:
        for text in texts[:sentences]:
            times.append(timed(partial(client.encode, [text]))[0])
            time.sleep(0.05)  # arrive at random points of the bulk jobs
        status = client.server_status
    finally:
        stop.set()
        thread.join(120)
    return {**latency_row(times), "bulk_job_median_ms": 1000 * float(status["recent_jobs"]["bulk_median_seconds"])}
