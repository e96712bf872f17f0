"""gRPC against HTTP: one server, the same sentences through TEI's ``tei.v1`` gRPC API and the HTTP API.

One ``bertserve start --http-port P --grpc-port G`` server (all-MiniLM-L6-v2 by default, one CPU
worker, ``--max-seq-len 128``) answers every path, the paths taking turns so that the machine's
noise falls on all alike:

- one sentence at a time: gRPC ``Embed`` on a sync ``grpc`` channel
  (``bertserve.client.tei.tei_pb2_grpc.EmbedStub``), ``POST /embed`` with a kept-alive ``httpx``
  client, and ``POST /v1/embeddings`` on a kept-alive ``http.client`` connection, rotating which
  goes first for each sentence; p50 and p90;
- bulk: ``--bulk-sentences`` (10,000) through one ``EmbedStream`` (its requests generated lazily,
  every reply read), against ``POST /embed`` in requests of ``--bulk-size`` (1,000, JSON), one after
  another; ``--bulk-rounds`` rounds, the median sentences/s of each, the worker's jobs, busy
  seconds and padding (from STATUS), and the CPU each process of the server and the client spent
  per 1,000 sentences;
- concurrent callers: ``--callers`` (32) threads each sending one-sentence requests back to back
  for ``--seconds``: gRPC ``Embed`` on one channel shared by all the threads, gRPC with a channel
  (and so a connection) per thread, and HTTP ``/embed`` with an ``httpx.Client`` per thread;
  ``--concurrent-rounds`` rounds, the median requests/s and p50 of each, requests per worker job,
  the worker's busy share and the CPU per request of each process;
- the numbers: ``--check`` (64) sentences one by one, gRPC ``Embed``'s vectors against
  ``/embed``'s (``np.array_equal`` on float32).

The targets: gRPC one-sentence p50 / HTTP's <= 1.0 (against each HTTP path), gRPC bulk
sentences/s / HTTP's >= 1.0, gRPC requests/s of the concurrent callers / HTTP's >= 1.0 (shared
channel, and a channel per thread), and the vectors identical.

    python benchmarks/grpc_vs_http.py --json benchmarks/report/grpc.json --markdown benchmarks/report/grpc.md
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import httpx
import numpy as np
import psutil
from bertserve.client import BertClient
from bertserve.client.tei import tei_pb2 as pb, tei_pb2_grpc as tei_grpc
from bertserve.server.testing.launcher import RunningServer, free_ports, start_server
from lib.inputs import cycle_take, model_dir_or_exit, model_parser, read_corpus
from lib.load import take_turns
from lib.report import environment, tagged_log, write_report
from lib.stats import median, percentile_ms, ratio

SERVER_FLAGS = ("--num-worker", "1", "--cpu")  # and --max-seq-len, 128 unless told
TARGETS = {"one": 1.0, "bulk": 1.0, "concurrent": 1.0}
GRPC_ONE, HTTPX_ONE, PLAIN_ONE = "gRPC Embed", "HTTP /embed, httpx", "HTTP /v1/embeddings, http.client"
GRPC_BULK, HTTP_BULK = "gRPC EmbedStream", "HTTP /embed"
GRPC_SHARED, GRPC_OWN, HTTP_OWN = "gRPC Embed, one shared channel", "gRPC Embed, a channel per thread", "HTTP /embed"
Caller = tuple[Callable[[str], Any], Callable[[], None]]
"""A concurrent caller's call of one sentence, and what closes its client."""
SEPARATE_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # else channels to one address share a connection

log = tagged_log("grpc")


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    parser.add_argument("--model-class", metavar="MODULE:NAME", help="serve this model class instead (a smoke test's)")
    parser.add_argument("--max-seq-len", type=int, default=128, help="the server's (a small model's may be less)")
    parser.add_argument("--sentences", type=int, default=300, help="timed one-sentence requests per path")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--bulk-sentences", type=int, default=10_000, help="sentences of each bulk round, per path")
    parser.add_argument("--bulk-size", type=int, default=1000, help="sentences of one HTTP bulk request")
    parser.add_argument("--bulk-rounds", type=int, default=3)
    parser.add_argument("--callers", type=int, default=32, help="concurrent threads, each one request at a time")
    parser.add_argument("--seconds", type=float, default=10.0, help="of concurrent callers, per path and round")
    parser.add_argument("--concurrent-rounds", type=int, default=3)
    parser.add_argument("--check", type=int, default=64, help="sentences whose vectors are compared")
    args = parser.parse_args(argv)
    model_dir = model_dir_or_exit(parser, args.model_dir)
    corpus = read_corpus(args.corpus)
    started = time.perf_counter()
    http_port, grpc_port = free_ports(2)
    served = (*SERVER_FLAGS, "--max-seq-len", str(args.max_seq_len))
    if args.model_class:
        served += ("--model-class", args.model_class)
    flags = (*served, "--http-port", str(http_port), "--grpc-port", str(grpc_port))
    server = start_server("--model-dir", str(model_dir), *flags, echo=False)
    url, target = f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    try:
        with (
            grpc.insecure_channel(target) as channel,
            httpx.Client(base_url=url, timeout=300) as session,
            BertClient(**server.client_kwargs, timeout=60_000) as control,
        ):
            grpc.channel_ready_future(channel).result(timeout=60)
            stub = tei_grpc.EmbedStub(channel)
            plain = http.client.HTTPConnection("127.0.0.1", http_port, timeout=300)
            roles = process_roles(server, control, http_port, grpc_port)
            calls: dict[str, Callable[[list[str]], Any]] = {
                GRPC_ONE: lambda texts: grpc_embed(stub, texts[0]),
                HTTPX_ONE: lambda texts: http_embed(session, texts),
                PLAIN_ONE: lambda texts: plain_embeddings(plain, texts),
            }
            texts = corpus[: args.warmup + args.sentences]
            log(f"one sentence at a time: {len(texts)} sentences per path, in turns")
            one = take_turns(calls, texts, args.warmup)
            bulk = bulk_rounds(stub, session, corpus, args, Meter(roles, control))
            concurrent = concurrent_rounds(channel, target, url, corpus, args, Meter(roles, control))
            log(f"the numbers: {args.check} sentences one by one through gRPC and HTTP /embed")
            check = compare_vectors(stub, session, corpus[: args.check])
    finally:
        server.stop()
    targets = judged(one, bulk, concurrent, check)
    load = psutil.getloadavg()
    report = {
        "command": "python benchmarks/grpc_vs_http.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "setup": (
            f"Machine: {psutil.cpu_count()} cores, load average {load[0]:.2f} at the end; model {model_dir}; corpus "
            f"{args.corpus.name}; server `{' '.join(served)} --http-port P --grpc-port G`; {args.sentences} "
            f"one-sentence requests per path after {args.warmup} of warm-up; {args.bulk_rounds} bulk rounds of "
            f"{args.bulk_sentences} sentences per path (HTTP in requests of {args.bulk_size}); "
            f"{args.concurrent_rounds} rounds of {args.callers} concurrent callers for {args.seconds:g} s per path. "
            f"Total {time.perf_counter() - started:.0f} s."
        ),
        "one_sentence": one,
        "bulk": bulk,
        "concurrent": concurrent,
        "identical": check,
        "targets": targets,
    }
    write_report(report, markdown(report), args.json, args.markdown)
    return 0


def grpc_embed(stub: tei_grpc.EmbedStub, text: str) -> np.ndarray:
    return np.asarray(stub.Embed(pb.EmbedRequest(inputs=text, truncate=True), timeout=300).embeddings, np.float32)


def http_embed(session: httpx.Client, texts: list[str]) -> np.ndarray:
    reply = session.post("/embed", json={"inputs": texts, "truncate": True})
    reply.raise_for_status()
    return np.asarray(reply.json(), np.float32)


def plain_embeddings(plain: http.client.HTTPConnection, texts: list[str]) -> Any:
    body = json.dumps({"input": texts, "truncate": True})
    plain.request("POST", "/v1/embeddings", body=body, headers={"content-type": "application/json"})
    response = plain.getresponse()
    answer = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {answer[:200]!r}")
    return json.loads(answer)


def grpc_stream(stub: tei_grpc.EmbedStub, texts: Sequence[str]) -> np.ndarray:
    """Every text one message of one ``EmbedStream``, sent as the stream asks for them; every reply read."""
    requests = (pb.EmbedRequest(inputs=text, truncate=True) for text in texts)
    rows = [list(reply.embeddings) for reply in stub.EmbedStream(requests, timeout=3600)]
    return np.asarray(rows, np.float32)


def http_bulk(session: httpx.Client, texts: Sequence[str], size: int) -> np.ndarray:
    """``texts`` in requests of ``size`` to ``/embed``, one after another."""
    rows = [http_embed(session, list(texts[i : i + size])) for i in range(0, len(texts), size)]
    return np.concatenate(rows)


# -- the server's processes, for the CPU each spends --


def process_roles(
    server: RunningServer, control: BertClient, http_port: int, grpc_port: int
) -> dict[str, list[psutil.Process]]:
    """The server's processes by role (the HTTP and gRPC processes by the port each listens on, the
    workers as STATUS lists them, the head and its helpers the rest), and this client's."""
    workers = {w["pid"] for w in control.server_status["workers"] if not w.get("remote")}
    roles: dict[str, list[psutil.Process]] = {"client": [psutil.Process()], "HTTP": [], "gRPC": [], "worker": []}
    roles["head and helpers"] = []
    for process in server.family():
        try:
            ports = {c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue
        role = "HTTP" if http_port in ports else "gRPC" if grpc_port in ports else None
        role = role or ("worker" if process.pid in workers else "head and helpers")
        roles[role].append(process)
    return roles


def cpu_seconds(roles: dict[str, list[psutil.Process]]) -> dict[str, float]:
    """User and system CPU seconds each role's processes have spent so far."""
    spent: dict[str, float] = {}
    for role, processes in roles.items():
        total = 0.0
        for process in processes:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        spent[role] = total
    return spent


def work_counters(control: BertClient) -> dict[str, float]:
    """The local workers' cumulative counters from STATUS: jobs done, seconds busy, the tokens of
    the inputs and the token slots the model computed (the tokens and their padding)."""
    workers = [w for w in control.server_status["workers"] if not w.get("remote")]
    return {key: float(sum(w.get(key, 0) for w in workers)) for key in ("jobs_done", "busy_s", "tokens", "token_slots")}


class Meter:
    """What a piece of work cost the server and the client: the CPU seconds each role's processes
    spent (:func:`cpu_seconds`) and the growth of the workers' counters (:func:`work_counters`)."""

    def __init__(self, roles: dict[str, list[psutil.Process]], control: BertClient) -> None:
        self.roles, self.control = roles, control

    def __call__(self, work: Callable[..., Any], *args: Any) -> tuple[Any, float, dict[str, float], dict[str, float]]:
        """``work(*args)``'s result, the seconds it took, the CPU seconds by role, the counters' growth."""
        cpu, counted = cpu_seconds(self.roles), work_counters(self.control)
        began = time.perf_counter()
        result = work(*args)
        seconds = time.perf_counter() - began
        cpu_after, counted_after = cpu_seconds(self.roles), work_counters(self.control)
        return (
            result,
            seconds,
            {role: cpu_after[role] - cpu[role] for role in cpu},
            {key: counted_after[key] - counted[key] for key in counted},
        )


# -- bulk --


def bulk_rounds(
    stub: tei_grpc.EmbedStub,
    session: httpx.Client,
    corpus: list[str],
    args: argparse.Namespace,
    meter: Meter,
) -> dict[str, Any]:
    """Sentences per second of ``--bulk-sentences`` through each path, the paths taking turns each
    round; the CPU seconds per 1,000 sentences of each process role, and the worker's jobs, busy
    seconds per 1,000 sentences and padding (each the median over the rounds)."""
    texts = cycle_take(corpus, 0, args.bulk_sentences)
    paths: dict[str, Callable[[Sequence[str]], np.ndarray]] = {
        GRPC_BULK: lambda chunk: grpc_stream(stub, chunk),
        HTTP_BULK: lambda chunk: http_bulk(session, chunk, args.bulk_size),
    }
    log("bulk warm-up")
    for call in paths.values():
        call(texts[: args.bulk_size])
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    cpu: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
    work: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
    names = list(paths)
    for round_ in range(args.bulk_rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            log(f"bulk round {round_ + 1} of {args.bulk_rounds}: {name}, {len(texts)} sentences")
            vectors, took, spent, done = meter(paths[name], texts)
            if vectors.shape[0] != len(texts):
                raise RuntimeError(f"{name} answered {vectors.shape[0]} vectors for {len(texts)} sentences")
            seconds[name].append(took)
            cpu[name].append({role: value * 1000 / len(texts) for role, value in spent.items()})
            work[name].append(
                {
                    "jobs": done["jobs_done"],
                    "worker_busy_s_per_1000": done["busy_s"] * 1000 / len(texts),
                    "padding_fraction": 1 - ratio(done["tokens"], done["token_slots"]),
                }
            )
    return {
        name: {
            "per_s": len(texts) / statistics.median(values),
            "seconds": values,
            "cpu_s_per_1000": {role: statistics.median(r[role] for r in cpu[name]) for role in meter.roles},
            **{
                key: median([r[key] for r in work[name]])
                for key in ("jobs", "worker_busy_s_per_1000", "padding_fraction")
            },
        }
        for name, values in seconds.items()
    }


# -- concurrent callers --


def concurrent_rounds(
    channel: grpc.Channel, target: str, url: str, corpus: list[str], args: argparse.Namespace, meter: Meter
) -> dict[str, Any]:
    """``--callers`` threads on each path for ``--seconds``, the paths taking turns each round: per
    path the medians over the rounds of requests/s, latency, requests per worker job, the worker's
    busy share of the time, and the CPU milliseconds each process role spent per request."""

    def shared(_: int) -> Caller:
        stub = tei_grpc.EmbedStub(channel)
        return (lambda text: grpc_embed(stub, text)), (lambda: None)

    def own_channel(_: int) -> Caller:
        mine = grpc.insecure_channel(target, options=SEPARATE_CONNECTION)
        stub = tei_grpc.EmbedStub(mine)
        return (lambda text: grpc_embed(stub, text)), mine.close

    def own_client(_: int) -> Caller:
        client = httpx.Client(base_url=url, timeout=300)
        return (lambda text: http_embed(client, [text])), client.close

    paths = {GRPC_SHARED: shared, GRPC_OWN: own_channel, HTTP_OWN: own_client}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
    names = list(paths)
    for round_ in range(args.concurrent_rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            log(f"concurrent round {round_ + 1} of {args.concurrent_rounds}: {name}, {args.callers} callers")
            made, took, spent, done = meter(callers, paths[name], corpus, args.callers, args.seconds)
            requests = max(made["requests"], 1)
            made["requests_per_job"] = ratio(made["requests"], done["jobs_done"])
            made["worker_busy_share"] = done["busy_s"] / took
            made["cpu_ms_per_request"] = {role: value * 1000 / requests for role, value in spent.items()}
            rounds[name].append(made)
    keys = ("requests_per_s", "p50_ms", "p90_ms", "requests_per_job", "worker_busy_share")
    return {
        name: {
            **{key: median([r[key] for r in values]) for key in keys},
            "cpu_ms_per_request": {
                role: median([r["cpu_ms_per_request"][role] for r in values]) for role in meter.roles
            },
            "errors": sum((Counter(r["errors"]) for r in values), Counter()),
            "rounds": values,
        }
        for name, values in rounds.items()
    }


def callers(make: Callable[[int], Caller], corpus: list[str], count: int, seconds: float) -> dict[str, Any]:
    """``count`` threads, each with the call ``make(i)`` gives it, sending one corpus sentence at a
    time from a start they share until ``seconds`` have passed; requests/s, latency and errors."""
    connected, go = threading.Barrier(count + 1), threading.Event()
    latencies: list[list[float]] = [[] for _ in range(count)]
    errors: list[Counter[str]] = [Counter() for _ in range(count)]
    window: dict[str, float] = {}

    def caller(index: int) -> None:
        call, close = make(index)
        try:
            try:
                call(corpus[index % len(corpus)])  # the connection made before the clock starts
            except (grpc.RpcError, httpx.HTTPError) as exc:
                errors[index][describe_error(exc)] += 1
            connected.wait()
            go.wait()
            position = index * 97
            while time.perf_counter() < window["end"]:
                began = time.perf_counter()
                try:
                    call(corpus[position % len(corpus)])
                except (grpc.RpcError, httpx.HTTPError) as exc:
                    errors[index][describe_error(exc)] += 1
                    continue
                latencies[index].append(time.perf_counter() - began)
                position += 1
        finally:
            close()

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    connected.wait(timeout=300)
    window["start"] = time.perf_counter()
    window["end"] = window["start"] + seconds
    go.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - window["start"]
    every = [latency for mine in latencies for latency in mine]
    return {
        "requests": len(every),
        "seconds": elapsed,
        "requests_per_s": len(every) / elapsed,
        **{f"p{q}_ms": percentile_ms(every, q) for q in (50, 90, 99)},
        "errors": dict(sum(errors, Counter())),
    }


def describe_error(exc: Exception) -> str:
    if isinstance(exc, grpc.RpcError):
        return f"{exc.code().name}: {exc.details()}"  # type: ignore[attr-defined]
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}: {exc.response.text[:120]}"
    return f"{type(exc).__name__}: {exc}"


# -- the numbers --


def compare_vectors(stub: tei_grpc.EmbedStub, session: httpx.Client, texts: list[str]) -> dict[str, Any]:
    """Each text alone through gRPC ``Embed`` and HTTP ``/embed``: identical float32 vectors?"""
    over_grpc = np.stack([grpc_embed(stub, text) for text in texts])
    over_http = np.concatenate([http_embed(session, [text]) for text in texts])
    return {
        "sentences": len(texts),
        "identical": bool(np.array_equal(over_grpc, over_http)),
        "rows_differing": int(np.sum(np.any(over_grpc != over_http, axis=1))),
        "largest_difference": float(np.abs(over_grpc - over_http).max()),
    }


# -- the report --


def judged(one: dict, bulk: dict, concurrent: dict, check: dict) -> list[dict[str, Any]]:
    """Each target: its name, the measured value, the goal, and whether it is met."""

    def row(name: str, measured: float | bool, goal: str, passed: bool) -> dict[str, Any]:
        return {"name": name, "measured": measured, "goal": goal, "passed": passed}

    rows = []
    for http_path in (HTTPX_ONE, PLAIN_ONE):
        value = one[GRPC_ONE]["p50_ms"] / one[http_path]["p50_ms"]
        rows.append(
            row(f"one sentence: gRPC p50 / {http_path} p50", value, f"<= {TARGETS['one']}", value <= TARGETS["one"])
        )
    value = bulk[GRPC_BULK]["per_s"] / bulk[HTTP_BULK]["per_s"]
    rows.append(
        row(
            "bulk: gRPC EmbedStream / HTTP /embed sentences/s", value, f">= {TARGETS['bulk']}", value >= TARGETS["bulk"]
        )
    )
    for grpc_path in (GRPC_SHARED, GRPC_OWN):
        value = concurrent[grpc_path]["requests_per_s"] / concurrent[HTTP_OWN]["requests_per_s"]
        name = f"concurrent callers: {grpc_path} / HTTP /embed requests/s"
        rows.append(row(name, value, f">= {TARGETS['concurrent']}", value >= TARGETS["concurrent"]))
    rows.append(row("gRPC vectors == HTTP /embed vectors", check["identical"], "true", check["identical"]))
    return rows


def markdown(report: dict[str, Any]) -> str:
    lines = ["# bertserve: gRPC against HTTP", "", f"Command: `{report['command']}`", "", report["setup"], ""]
    lines += ["| one sentence | p50 ms | p90 ms | p99 ms |", "| --- | ---: | ---: | ---: |"]
    for name, row in report["one_sentence"].items():
        lines.append(f"| {name} | {row['p50_ms']:.1f} | {row['p90_ms']:.1f} | {row['p99_ms']:.1f} |")
    lines += ["", "| bulk | sentences/s (median) | worker jobs | worker busy s / 1,000 | padding |"]
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    for name, row in report["bulk"].items():
        lines.append(
            f"| {name} | {row['per_s']:.0f} | {row['jobs']:.0f} | {row['worker_busy_s_per_1000']:.2f} "
            f"| {row['padding_fraction']:.3f} |"
        )
    roles = list(next(iter(report["bulk"].values()))["cpu_s_per_1000"])
    lines += ["", "| bulk: CPU s / 1,000 sentences | " + " | ".join(roles) + " |"]
    lines.append("| --- |" + " ---: |" * len(roles))
    for name, row in report["bulk"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row['cpu_s_per_1000'][r]:.3f}" for r in roles) + " |")
    lines += [
        "",
        "| concurrent callers | requests/s (median) | p50 ms | p90 ms | requests per job | worker busy | errors |",
    ]
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in report["concurrent"].items():
        lines.append(
            f"| {name} | {row['requests_per_s']:.1f} | {row['p50_ms']:.1f} | {row['p90_ms']:.1f} "
            f"| {row['requests_per_job']:.1f} | {row['worker_busy_share']:.0%} | {sum(row['errors'].values())} |"
        )
    lines += ["", "| concurrent callers: CPU ms / request | " + " | ".join(roles) + " |"]
    lines.append("| --- |" + " ---: |" * len(roles))
    for name, row in report["concurrent"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row['cpu_ms_per_request'][r]:.2f}" for r in roles) + " |")
    for name, row in report["concurrent"].items():
        for message, count in row["errors"].items():
            lines.append(f"\n{name}: {count} x `{message}`")
    check = report["identical"]
    lines += [
        "",
        f"The numbers: {check['sentences']} sentences one by one, gRPC against HTTP /embed: identical "
        f"{str(check['identical']).lower()} ({check['rows_differing']} rows differ, largest difference "
        f"{check['largest_difference']:.2e}).",
    ]
    lines += ["", "| target | measured | goal | result |", "| --- | ---: | ---: | --- |"]
    for target in report["targets"]:
        value = target["measured"]
        shown = str(value).lower() if isinstance(value, bool) else f"{value:.2f}"
        lines.append(f"| {target['name']} | {shown} | {target['goal']} | {'met' if target['passed'] else 'MISSED'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
