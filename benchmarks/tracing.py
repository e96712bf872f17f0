"""What tracing costs: one sentence at a time and bulk, through servers with traces off and
on, side by side in one run, and against the code of another revision (before traces).

    python benchmarks/tracing.py --baseline 4f5300a \\
        --json benchmarks/report/tracing.json --markdown benchmarks/report/tracing.md

Three servers of the same model (all-MiniLM-L6-v2 by default, one worker, its default dtype)
are up at once:

- **baseline**: the server of ``--baseline REV`` (its ``client/`` and ``server/``, from
  ``git archive``, run by this interpreter with this environment's packages);
- **traces off**: this checkout's server, as it starts by default;
- **traces on**: this checkout's server with ``--otlp-endpoint``, every request sampled, its
  spans sent in batches every ``--export-every-ms`` (the SDK's 5 s by default) to a real
  OTLP/HTTP receiver in this process (``bertserve.server.testing.otlp_receiver``, which
  decodes them only at the end). Between the one-sentence and the bulk phase of a round the
  servers rest that long and 0.5 s more, so the bulk phase does not pay for sending the other's
  spans; with batches every 5 s, some of the one-sentence spans leave in that rest, and
  ``--export-every-ms 200`` shows the other bound (each phase pays for all its own).

In each of ``--rounds`` rounds, the servers take turns sentence by sentence
(``BertClient.encode([s])``, ``--sentences`` of them), then the same over HTTP (a POST to
``/v1/embeddings`` with ``httpx``, where the HTTP process's span is made too), then each
encodes ``--bulk`` sentences in one call, the order rotated per round. The report gives each
server's one-sentence p50s and bulk sentences/s (medians over the rounds) and their ratios,
the targets (traces off within noise of the baseline; traces on at most 5% slower for one
sentence and 2% for bulk), and how many traces the receiver got. The noise between two rounds
of the same server is reported too: a difference smaller than it is none.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from bertserve.server.testing.otlp_receiver import otlp_receiver
from lib.baseline import baseline_python
from lib.inputs import cycle_take, model_dir_or_exit, model_parser, read_corpus
from lib.load import take_turns
from lib.report import describe_cpu, environment, tagged_log, write_report
from lib.stats import fmt

log = tagged_log("tracing")
BASELINE, OFF, ON = "baseline", "traces off", "traces on"
EXPORT_EVERY_MS = 5000  # OpenTelemetry SDK's default OTEL_BSP_SCHEDULE_DELAY


def bulk_rate(client: BertClient, texts: list[str]) -> float:
    started = time.perf_counter()
    client.encode(texts)
    return len(texts) / (time.perf_counter() - started)


def http_call(client: httpx.Client, port: int) -> Callable[[list[str]], Any]:
    def call(texts: list[str]) -> Any:
        answer = client.post(f"http://127.0.0.1:{port}/v1/embeddings", json={"input": texts, "truncate": True})
        answer.raise_for_status()
        return answer

    return call


def measure(
    args: Any, clients: dict[str, BertClient], http: dict[str, Callable[[list[str]], Any]], corpus: list[str]
) -> dict[str, dict[str, list[float]]]:
    """Per server: each round's one-sentence p50 (ms) over ZeroMQ and HTTP, and bulk sentences/s."""
    results: dict[str, dict[str, list[float]]] = {
        name: {"one_p50_ms": [], "http_p50_ms": [], "bulk_per_s": []} for name in clients
    }
    names = list(clients)
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        order = names[shift:] + names[:shift]
        texts = cycle_take(corpus, round_ * args.sentences, args.warmup + args.sentences)
        turns = take_turns({name: clients[name].encode for name in order}, texts, args.warmup)
        over_http = take_turns({name: http[name] for name in order}, texts, args.warmup)
        bulk = cycle_take(corpus, round_ * args.bulk, args.bulk)
        time.sleep(args.export_every_ms / 1000 + 0.5)  # the one-sentence requests' spans leave before bulk is timed
        for name in order:
            results[name]["one_p50_ms"].append(turns[name]["p50_ms"])
            results[name]["http_p50_ms"].append(over_http[name]["p50_ms"])
            results[name]["bulk_per_s"].append(bulk_rate(clients[name], bulk))
        log(
            f"round {round_ + 1}/{args.rounds}: "
            + ", ".join(
                f"{name} {results[name]['one_p50_ms'][-1]:.2f} ms (HTTP {results[name]['http_p50_ms'][-1]:.2f}), "
                f"{results[name]['bulk_per_s'][-1]:.0f}/s"
                for name in names
            )
        )
    return results


def spread(values: list[float]) -> float:
    """How far a server's rounds are from their median, relatively (median absolute deviation)."""
    middle = statistics.median(values)
    return statistics.median(abs(v - middle) for v in values) / middle if middle else float("nan")


def paired(results: dict[str, dict[str, list[float]]], key: str, slower: str, faster: str) -> float:
    """How much more ``slower`` takes than ``faster``, relatively: the median over the rounds of
    the two servers' ratio in the same round (a round's noise falls on both alike)."""
    a, b = results[slower][key], results[faster][key]
    ratios = (
        [y / x for x, y in zip(a, b, strict=True)]
        if key == "bulk_per_s"
        else [x / y for x, y in zip(a, b, strict=True)]
    )
    return statistics.median(ratios) - 1


def summarize(results: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    medians = {name: {key: statistics.median(values) for key, values in r.items()} for name, r in results.items()}
    noise = max(spread(values) for r in results.values() for values in r.values())
    summary: dict[str, Any] = {"medians": medians, "noise": noise, "ratios": {}, "targets": []}
    cost = {key: paired(results, key, ON, OFF) for key in ("one_p50_ms", "http_p50_ms", "bulk_per_s")}
    summary["ratios"]["on_vs_off"] = cost
    summary["targets"] += [
        ("traces on: one sentence's p50 at most 5% over traces off", cost["one_p50_ms"], cost["one_p50_ms"] <= 0.05),
        ("traces on: one sentence over HTTP, p50 at most 5% over", cost["http_p50_ms"], cost["http_p50_ms"] <= 0.05),
        ("traces on: bulk time at most 2% over traces off", cost["bulk_per_s"], cost["bulk_per_s"] <= 0.02),
    ]
    if BASELINE in results:
        drift = {key: paired(results, key, OFF, BASELINE) for key in ("one_p50_ms", "http_p50_ms", "bulk_per_s")}
        summary["ratios"]["off_vs_baseline"] = drift
        within = max(noise, 0.02)
        summary["targets"] += [
            (f"traces off: {what} within noise of the baseline", drift[key], abs(drift[key]) <= within)
            for key, what in (
                ("one_p50_ms", "one sentence"),
                ("http_p50_ms", "one sentence over HTTP"),
                ("bulk_per_s", "bulk"),
            )
        ]
    return summary


def markdown(report: dict[str, Any]) -> str:
    summary = report["summary"]
    lines = [
        "# What tracing costs",
        "",
        f"`{report['command']}`",
        "",
        f"CPU: {describe_cpu(report['environment'])}. Model {report['model_dir']}, one worker, its default dtype. "
        f"{report['rounds']} rounds; in each, {report['sentences']} sentences one at a time (the servers "
        f"taking turns) and {report['bulk']} in one call per server.",
        "",
        "| server | one sentence p50 (ms) | over HTTP p50 (ms) | bulk (sentences/s) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, m in summary["medians"].items():
        lines.append(f"| {name} | {fmt(m['one_p50_ms'], 2)} | {fmt(m['http_p50_ms'], 2)} | {fmt(m['bulk_per_s'], 0)} |")
    lines += [
        "",
        f"Noise: the largest spread of one server's rounds around their median is {summary['noise']:.1%}. "
        "A ratio below is the median over the rounds of the two servers' ratio in the same round.",
        f"The receiver got {report['traces']} traces ({report['spans']} spans) from the server with traces on, "
        f"which sent them every {report['export_every_ms']} ms.",
        "",
        "| target | measured | result |",
        "| --- | ---: | --- |",
    ]
    for name, value, passed in summary["targets"]:
        lines.append(f"| {name} | {value:+.1%} | {'PASS' if passed else 'MISS'} |")
    if report.get("baseline"):
        lines += ["", f"Baseline: revision `{report['baseline']}`, the code before traces."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    add = parser.add_argument
    add("--baseline", metavar="REV", help="also a server of this git revision's code (before traces)")
    add("--rounds", type=int, default=5)
    add("--sentences", type=int, default=200, help="timed one-sentence requests per server and round")
    add("--warmup", type=int, default=20)
    add("--bulk", type=int, default=2000, help="sentences of each server's bulk call per round")
    add("--model-class", metavar="MODULE:NAME", help="serve this model class instead (a smoke test's fast model)")
    add(
        "--export-every-ms",
        type=int,
        default=EXPORT_EVERY_MS,
        help="how often the traced server sends its spans (OTEL_BSP_SCHEDULE_DELAY; the SDK's default 5000)",
    )
    args = parser.parse_args(argv)
    model_dir = model_dir_or_exit(parser, args.model_dir)
    corpus = read_corpus(args.corpus)
    flags: tuple[str, ...] = ("--model-dir", str(model_dir), "--num-worker", "1")
    if args.model_class:
        flags += ("--model-class", args.model_class)
    ports = {name: free_port() for name in (BASELINE, OFF, ON)}
    with otlp_receiver() as (receiver, url), contextlib.ExitStack() as stack:  # the receiver outlives the servers
        running: dict[str, RunningServer] = {}
        if args.baseline:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bertserve-baseline-")))
            log(f"the baseline: {args.baseline}")
            python = baseline_python(args.baseline, folder)
            running[BASELINE] = start_server(
                *flags, "--http-port", str(ports[BASELINE]), python=python, expect_ready=False
            )
            stack.callback(running[BASELINE].stop)
        running[OFF] = start_server(*flags, "--http-port", str(ports[OFF]), expect_ready=False)
        stack.callback(running[OFF].stop)
        traced = ("--http-port", str(ports[ON]), "--otlp-endpoint", url)
        traced_env = {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_BSP_SCHEDULE_DELAY": str(args.export_every_ms)}
        running[ON] = start_server(*flags, *traced, env=traced_env, expect_ready=False)
        stack.callback(running[ON].stop)
        for server in running.values():  # started together: each builds or loads its graph meanwhile
            server.wait_ready(600)
        clients = {n: stack.enter_context(BertClient(**s.client_kwargs, timeout=600_000)) for n, s in running.items()}
        session = stack.enter_context(httpx.Client(timeout=600))
        http = {name: http_call(session, ports[name]) for name in running}
        results = measure(args, clients, http, corpus)
        time.sleep(args.export_every_ms / 1000 + 1)  # the batched spans' last export
        traces, spans = len({span.trace_id for span in receiver.spans}), len(receiver.spans)
    report = {
        "command": "python benchmarks/tracing.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "model_dir": str(model_dir),
        "baseline": args.baseline,
        "rounds": args.rounds,
        "sentences": args.sentences,
        "bulk": args.bulk,
        "export_every_ms": args.export_every_ms,
        "results": results,
        "summary": summarize(results),
        "traces": traces,
        "spans": spans,
    }
    write_report(report, markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
