"""HTTP against ZeroMQ: one server, the same sentences through both front ends.

One ``bertserve start --http-port`` server (all-MiniLM-L6-v2 by default, one CPU worker)
answers, in turns so that the machine's noise falls on both alike:

- one sentence at a time: ``BertClient.encode([s])`` over ZeroMQ, and ``POST /v1/embeddings``
  on a kept-alive connection with the standard library's ``http.client`` (the least a
  Python client adds, as ``BertClient`` is a bare socket), with ``httpx``, and with the
  official ``openai`` package;
- bulk: requests of 1,000 sentences, over ZeroMQ and over HTTP (JSON floats, and base64).

The targets: HTTP bulk throughput / ZeroMQ >= 0.9; HTTP one-sentence p50 / ZeroMQ <= 1.3.

    python benchmarks/http_vs_zmq.py --json benchmarks/report/http.json --markdown benchmarks/report/http.md
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import psutil
from bertserve.client import BertClient
from bertserve.server.testing.launcher import free_port, start_server
from lib.inputs import cycle_take, model_dir_or_exit, model_parser, read_corpus
from lib.load import take_turns
from lib.report import environment, tagged_log, write_report

SERVER_FLAGS = ("--num-worker", "1", "--cpu", "--max-seq-len", "128")
TARGETS = {"bulk": 0.9, "one": 1.3}


log = tagged_log("http")


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    parser.add_argument("--sentences", type=int, default=300, help="timed one-sentence requests per path")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--bulk-size", type=int, default=1000)
    parser.add_argument("--bulk-rounds", type=int, default=7)
    args = parser.parse_args(argv)
    model_dir = model_dir_or_exit(parser, args.model_dir)
    corpus = read_corpus(args.corpus)
    started = time.perf_counter()
    port = free_port()
    server = start_server("--model-dir", str(model_dir), *SERVER_FLAGS, "--http-port", str(port), echo=False)
    url = f"http://127.0.0.1:{port}"
    try:
        with (
            BertClient(**server.client_kwargs, timeout=120_000) as bc,
            httpx.Client(base_url=url, timeout=120) as session,
        ):
            from openai import OpenAI

            openai = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

            plain = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            plain_headers = {"content-type": "application/json"}

            def over_plain_http(texts: list[str]) -> Any:
                plain.request(
                    "POST", "/v1/embeddings", body=json.dumps({"input": texts, "truncate": True}), headers=plain_headers
                )
                response = plain.getresponse()
                body = response.read()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
                return json.loads(body)

            def over_http(texts: list[str], encoding: str = "float") -> Any:
                reply = session.post(
                    "/v1/embeddings", json={"input": texts, "encoding_format": encoding, "truncate": True}
                )
                reply.raise_for_status()
                return reply.json()

            calls: dict[str, Callable[[list[str]], Any]] = {
                "ZeroMQ, BertClient": bc.encode,
                "HTTP, http.client": over_plain_http,
                "HTTP, httpx": over_http,
                "HTTP, openai package": lambda texts: openai.embeddings.create(
                    model="all-MiniLM-L6-v2", input=texts, extra_body={"truncate": True}
                ),
            }
            texts = corpus[: args.warmup + args.sentences]
            log(f"one sentence at a time: {len(texts)} sentences per path, in turns")
            one = take_turns(calls, texts, args.warmup)
            bulk = bulk_rounds(bc.encode, over_http, corpus, args)
            check = np.abs(np.array([d["embedding"] for d in over_http(corpus[:64])["data"]]) - bc.encode(corpus[:64]))
    finally:
        server.stop()
    ratios = {
        "HTTP bulk / ZeroMQ bulk, JSON floats": bulk["HTTP, JSON floats"]["per_s"] / bulk["ZeroMQ"]["per_s"],
        "HTTP bulk / ZeroMQ bulk, base64": bulk["HTTP, base64"]["per_s"] / bulk["ZeroMQ"]["per_s"],
        "HTTP one-sentence p50 / ZeroMQ p50, http.client": (
            one["HTTP, http.client"]["p50_ms"] / one["ZeroMQ, BertClient"]["p50_ms"]
        ),
        "HTTP one-sentence p50 / ZeroMQ p50, httpx": one["HTTP, httpx"]["p50_ms"] / one["ZeroMQ, BertClient"]["p50_ms"],
    }
    load = psutil.getloadavg()
    report = {
        "command": "python benchmarks/http_vs_zmq.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "setup": (
            f"Machine: {psutil.cpu_count()} cores, load average {load[0]:.2f} at the end; model {model_dir}; corpus "
            f"{args.corpus.name}; server `{' '.join(SERVER_FLAGS)} --http-port P`; {args.sentences} one-sentence "
            f"requests per path after {args.warmup} of warm-up; {args.bulk_rounds} rounds of {args.bulk_size}-sentence "
            f"requests. Largest difference between HTTP and ZeroMQ vectors: {check.max():.2e}. "
            f"Total {time.perf_counter() - started:.0f} s."
        ),
        "one_sentence": one,
        "bulk": bulk,
        "ratios": ratios,
    }
    text = markdown(report)
    write_report(report, text, args.json, args.markdown)
    return 0


def bulk_rounds(zmq_encode: Callable, over_http: Callable, corpus: list[str], args: argparse.Namespace) -> dict:
    """Sentences per second of ``--bulk-size`` requests, the paths taking turns each round."""
    texts = cycle_take(corpus, 0, args.bulk_size)
    paths: dict[str, Callable[[], Any]] = {
        "ZeroMQ": lambda: zmq_encode(texts),
        "HTTP, JSON floats": lambda: over_http(texts),
        "HTTP, base64": lambda: over_http(texts, "base64"),
    }
    for call in paths.values():
        call()  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for round_ in range(args.bulk_rounds):
        log(f"bulk round {round_ + 1} of {args.bulk_rounds}")
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            paths[name]()
            seconds[name].append(time.perf_counter() - started)
    return {
        name: {"per_s": len(texts) / statistics.median(values), "seconds": values} for name, values in seconds.items()
    }


def markdown(report: dict[str, Any]) -> str:
    lines = ["# bertserve: HTTP against ZeroMQ", "", f"Command: `{report['command']}`", "", report["setup"], ""]
    lines += ["| one sentence | p50 ms | p90 ms | p99 ms |", "| --- | ---: | ---: | ---: |"]
    for name, row in report["one_sentence"].items():
        lines.append(f"| {name} | {row['p50_ms']:.1f} | {row['p90_ms']:.1f} | {row['p99_ms']:.1f} |")
    lines += ["", "| bulk requests | sentences/s (median) |", "| --- | ---: |"]
    for name, row in report["bulk"].items():
        lines.append(f"| {name} | {row['per_s']:.0f} |")
    lines += ["", "| ratio | measured | target |", "| --- | ---: | ---: |"]
    for name, value in report["ratios"].items():
        target = f"<= {TARGETS['one']}" if "p50" in name else f">= {TARGETS['bulk']}"
        lines.append(f"| {name} | {value:.2f} | {target} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
