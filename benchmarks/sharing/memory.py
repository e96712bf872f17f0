"""Resident memory at the edges: ``unread`` (a client that never reads its 1,000 x 100-sentence
replies) and ``bigframe`` (one 400 MB request frame); each against a growth of 64 MiB."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import zmq
from lib.load import timed, wait_until
from lib.rss import RssSampler, settled_rss
from lib.stats import median

from sharing.bench import RSS_LIMIT_MIB, Bench, log

RSS_SAMPLE_S = 0.2


def unread(bench: Bench) -> dict[str, Any]:
    with bench.server("unread") as server, bench.client(server) as reader, bench.client(server) as watcher:
        # The control: the same 1,000 x 100 from a client that reads every reply. A worker's
        # memory grows over its first ~20,000 sentences (TensorFlow's and oneDNN's caches for
        # the shapes it meets) whoever reads, so the baseline is taken after the same load.
        started = settled_rss(server)
        for i in range(1000):
            reader.encode(bench.texts(100, i * 100), blocking=False)
        reader.fetch_all()
        baseline = settled_rss(server)
        served = watcher.server_status["requests_served"]
        log(
            f"unread: {started:.0f} MiB at start, {baseline:.0f} MiB after the same load read by its client; "
            "now a client sends 1,000 x 100 and never reads"
        )
        with RssSampler(server, RSS_SAMPLE_S) as rss, bench.client(server) as deaf:
            for i in range(1000):
                deaf.encode(bench.texts(100, i * 100), blocking=False)

            def all_served() -> bool:
                status = watcher.server_status
                return status["requests_served"] >= served + 1000 or (
                    status["requests_received"] > 1000
                    and status["queued_sentences"] == 0
                    and status["jobs_in_flight"] == 0
                    and status["requests_pending"] == 0
                )

            serve_s, done = timed(lambda: wait_until(all_served, 600, interval=1.0))
            log(f"unread: served all in {serve_s:.0f} s: {done}; sampling 10 s more")
            end_samples_from = len(rss.samples)
            time.sleep(10)
        end = median([s.total_mib for s in rss.samples[end_samples_from:]])
        status = watcher.server_status
        by_process = rss.growth_by_process([w["pid"] for w in status["workers"]])
    return {
        "start_mib": started,
        "control_growth_mib": baseline - started,
        "baseline_mib": baseline,
        "peak_mib": rss.peak_mib,
        "end_mib": end,
        "peak_growth_mib": rss.peak_mib - baseline,
        "end_growth_mib": end - baseline,
        "serve_s": serve_s,
        "all_served": done,
        "requests_served": status["requests_served"] - served,
        "growth_by_process_mib": by_process,
        "met": done and rss.peak_mib - baseline < RSS_LIMIT_MIB,
    }


def bigframe(bench: Bench) -> dict[str, Any]:
    with bench.server("bigframe") as server, bench.client(server) as client:
        client.encode(bench.texts(32))
        baseline = settled_rss(server)
        size = 400 * 2**20
        payload = b'["' + b"a" * (size - 4) + b'"]'  # one 400 MB sentence, valid JSON
        header = json.dumps({"protocol": 1}).encode()
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        try:
            push.connect(f"tcp://127.0.0.1:{server.port}")
            log(f"bigframe: baseline {baseline:.0f} MiB; sending one 400 MB frame")
            with RssSampler(server, RSS_SAMPLE_S) as rss:
                push.send_multipart([b"bigframe", b"ENCODE", b"1", header, payload], copy=False)
                time.sleep(10)
        finally:
            push.close(linger=0)
            context.term()
        del payload
        latency, vectors = timed(lambda: client.encode(bench.texts(32)))
        served = np.asarray(vectors).shape == (32, 384)
        status = client.server_status
        by_process = rss.growth_by_process([w["pid"] for w in status["workers"]])
    growth = rss.peak_mib - baseline
    return {
        "growth_by_process_mib": by_process,
        "baseline_mib": baseline,
        "peak_mib": rss.peak_mib,
        "peak_growth_mib": growth,
        "served_after": served,
        "latency_after_s": latency,
        "rejections": status["rejections"],
        "met": served and growth < RSS_LIMIT_MIB,
    }
