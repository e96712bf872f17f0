"""``flood``: 8 clients send 40 x 1,000 sentences each past small queue bounds; ``busy`` at
once, a normal client served, memory bounded."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq
from bertserve.client import ServerBusyError, ServerError
from bertserve.client.protocol import decode_reply
from bertserve.server.testing.launcher import RunningServer
from lib.load import timed
from lib.rss import RssSampler, settled_rss
from lib.stats import median

from sharing.bench import RSS_LIMIT_MIB, Bench, log

BUSY_AT_ONCE_S = 0.1
RSS_SAMPLE_S = 0.2


class BusyListener:
    """Notes when each ``busy`` reply to the given identities arrives, on its own SUB socket
    (a PUB sends every reply to every matching subscriber), in its own thread."""

    def __init__(self, server: RunningServer, identities: list[bytes]) -> None:
        self.port_out, self.identities = server.port_out, identities
        self.arrived: dict[tuple[bytes, int], float] = {}
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        context = zmq.Context()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        try:
            for identity in self.identities:
                sub.setsockopt(zmq.SUBSCRIBE, identity)
            sub.connect(f"tcp://127.0.0.1:{self.port_out}")
            self.ready.set()
            while not self._stop.is_set():
                if not sub.poll(100):
                    continue
                reply = decode_reply(sub.recv_multipart())
                if not reply.ok and reply.header.get("kind") == "busy":
                    self.arrived[(reply.client_id, reply.request_id)] = time.perf_counter()
        finally:
            sub.close(linger=0)
            context.term()

    def __enter__(self) -> BusyListener:
        self._thread.start()
        self.ready.wait(10)
        time.sleep(0.5)  # the subscriptions reach the server's PUB
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@dataclass
class _Flooder:
    identity: bytes
    sent: dict[int, float] = field(default_factory=dict)
    send_loop_s: float = 0.0
    busy: int = 0
    answered: int = 0
    other_errors: list[str] = field(default_factory=list)


def _flood(bench: Bench, server: RunningServer, index: int, flooder: _Flooder, start: threading.Event) -> None:
    with bench.client(server, identity=flooder.identity) as client:
        batches = [bench.texts(1000, (index * 40 + i) * 1000) for i in range(40)]
        start.wait(30)
        started = time.perf_counter()
        for texts in batches:
            sent_at = time.perf_counter()
            flooder.sent[client.encode(texts, blocking=False)] = sent_at
        flooder.send_loop_s = time.perf_counter() - started
        while True:
            try:
                for _ in client.fetch():
                    flooder.answered += 1
                return
            except ServerBusyError as exc:
                assert exc.kind == "busy" and exc.request_id is not None
                flooder.busy += 1
            except ServerError as exc:
                flooder.other_errors.append(repr(exc))


def flood(bench: Bench) -> dict[str, Any]:
    flags = ("--max-request-size", "1000", "--max-client-queued-sentences", "5000", "--max-queued-sentences", "20000")
    with bench.server("flood", *flags) as server, bench.client(server) as normal:
        # Warm the workers' memory first: TensorFlow's caches for the shapes 1,000-sentence requests
        # make grow over their first ~20,000 sentences, whatever the queues do (see unread).
        for round_ in range(5):
            for i in range(4):
                normal.encode(bench.texts(1000, (round_ * 4 + i) * 1000), blocking=False)
            normal.fetch_all()
        small = bench.texts(32, offset=11)
        idle = median([timed(lambda: normal.encode(small))[0] for _ in range(5)])
        baseline = settled_rss(server)
        log(f"flood: baseline {baseline:.0f} MiB, idle latency {idle * 1000:.0f} ms; 8 clients x 40 x 1,000")
        flooders = [_Flooder(f"flood-{i}".encode()) for i in range(8)]
        start = threading.Event()
        threads = [
            threading.Thread(target=_flood, args=(bench, server, i, flooders[i], start), daemon=True) for i in range(8)
        ]
        for thread in threads:
            thread.start()
        latencies: list[float] = []
        normal_busy = 0
        with BusyListener(server, [f.identity for f in flooders]) as listener, RssSampler(server, RSS_SAMPLE_S) as rss:
            time.sleep(0.5)  # every flood client connected
            start.set()
            time.sleep(0.2)
            for _ in range(6):
                for _attempt in range(40):
                    try:
                        latencies.append(timed(lambda: normal.encode(small))[0])
                        break
                    except ServerBusyError:
                        normal_busy += 1
                        time.sleep(0.05)
                time.sleep(0.5)
            for thread in threads:
                thread.join(300)
        status = normal.server_status
        by_process = rss.growth_by_process([w["pid"] for w in status["workers"]])
    busy_s = [
        listener.arrived[(f.identity, rid)] - sent_at
        for f in flooders
        for rid, sent_at in f.sent.items()
        if (f.identity, rid) in listener.arrived
    ]
    busy = sum(f.busy for f in flooders)
    answered = sum(f.answered for f in flooders)
    growth = rss.peak_mib - baseline
    return {
        "busy_errors": busy,
        "flood_requests": 8 * 40,
        "flood_answered": answered,
        "flood_other_errors": [e for f in flooders for e in f.other_errors],
        "flood_send_loop_s": [f.send_loop_s for f in flooders],
        "send_to_busy_s": sorted(busy_s),
        "send_to_busy_median_s": median(busy_s),
        "send_to_busy_max_s": max(busy_s, default=float("nan")),
        "normal_idle_s": idle,
        "normal_latency_s": latencies,
        "normal_median_s": median(latencies),
        "normal_max_s": max(latencies, default=float("nan")),
        "normal_busy_refusals": normal_busy,
        "busy_rejections": status["busy_rejections"],
        "rejections": status["rejections"],
        "baseline_mib": baseline,
        "peak_growth_mib": growth,
        "growth_by_process_mib": by_process,
        "met": (
            busy > 0
            and median(busy_s) <= BUSY_AT_ONCE_S
            and len(latencies) == 6
            and normal_busy == 0
            and answered + busy == 8 * 40
            and growth < RSS_LIMIT_MIB
        ),
    }
