"""bert-as-service's own client against ours, on one bertserve server, all-MiniLM-L6-v2.

One server (``--cpu --max-seq-len 128``, one worker) and two clients, measured in turns
(so the machine's noise falls on both alike): bert-as-service 1.x's ``BertClient``
(``bert-serving-client`` 1.10.0, its own wire format) and bertserve's, each encoding the
corpus in bulk requests of ``--request-size`` sentences. The report gives the median
sentences/s of each, the ratio legacy / ours (target >= 0.95), and how far apart their
vectors are (they must be the same).

    python benchmarks/legacy_client.py --json benchmarks/report/legacy_client.json \\
        --markdown benchmarks/report/legacy_client.md
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from bert_serving.client import BertClient as OldClient
from bertserve.client import BertClient
from bertserve.server.testing.launcher import start_server
from lib.inputs import model_dir_or_exit, model_parser, read_corpus
from lib.report import environment, tagged_log, write_report
from lib.stats import cosine_rows

TARGET = 0.95


log = tagged_log("legacy")


def bulk_rate(encode: Callable[[list[str]], Any], texts: list[str], size: int) -> tuple[float, np.ndarray]:
    """Sentences/s of ``encode`` over ``texts`` in requests of ``size``, one after another."""
    began = time.perf_counter()
    vectors = np.concatenate([encode(texts[i : i + size]) for i in range(0, len(texts), size)])
    return len(texts) / (time.perf_counter() - began), vectors


def markdown(report: dict[str, Any]) -> str:
    rates = report["sentences_per_s"]
    every = {name: ", ".join(f"{rate:.0f}" for rate in values) for name, values in report["all_rates"].items()}
    return (
        "\n".join(
            [
                "# bert-as-service's own client against bertserve's (all-MiniLM-L6-v2, CPU)",
                "",
                f"One server, one worker, `--max-seq-len 128`. Corpus: {report['sentences']} "
                "sentences, bulk requests of "
                f"{report['request_size']}, {report['rounds']} rounds of each client, in turns.",
                "",
                "| client | sentences/s (median) | every round |",
                "| --- | ---: | --- |",
                f"| bertserve `BertClient` | {rates['ours']:,.0f} | {every['ours']} |",
                f"| bert-serving-client 1.10.0 `BertClient` | {rates['legacy']:,.0f} | {every['legacy']} |",
                "",
                f"Ratio legacy / ours: {report['ratio']:.3f} (target >= {TARGET}). Vectors: max |difference| "
                f"{report['max_abs_diff']:.2e}, min cosine {report['min_cosine']:.6f}.",
            ]
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--request-size", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    model_dir = model_dir_or_exit(parser, args.model_dir)
    texts = read_corpus(args.corpus, args.sentences)
    warnings.simplefilter("ignore")  # both clients warn of sentences past max_seq_len; the same for both
    server = start_server(
        "--model-dir", str(model_dir), "--cpu", "--max-seq-len", "128", "--num-worker", "1", echo=False
    )
    try:
        with BertClient(**server.client_kwargs, timeout=600_000) as ours:
            old = OldClient(port=server.port, port_out=server.port_out, timeout=600_000)
            try:
                clients = {"ours": ours.encode, "legacy": old.encode}
                for encode in clients.values():
                    bulk_rate(encode, texts[:200], 100)  # warm-up
                rates: dict[str, list[float]] = {name: [] for name in clients}
                vectors: dict[str, np.ndarray] = {}
                for round_ in range(args.rounds):
                    order = list(clients) if round_ % 2 == 0 else list(reversed(clients))
                    for name in order:
                        rate, vectors[name] = bulk_rate(clients[name], texts, args.request_size)
                        rates[name].append(rate)
                        log(f"round {round_ + 1}: {name} {rate:.0f} sentences/s")
            finally:
                old.close()
    finally:
        server.stop()
    medians = {name: statistics.median(values) for name, values in rates.items()}
    report = {
        "environment": environment(),
        "sentences": len(texts),
        "request_size": args.request_size,
        "rounds": args.rounds,
        "sentences_per_s": medians,
        "all_rates": rates,
        "ratio": medians["legacy"] / medians["ours"],
        "target": TARGET,
        "max_abs_diff": float(np.abs(vectors["legacy"] - vectors["ours"]).max()),
        "min_cosine": float(cosine_rows(vectors["legacy"], vectors["ours"]).min()),
    }
    write_report(report, markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
