"""``fairness``: client B's 32 sentences while client A has 1,000 x 100 queued, against 3 x B's
idle latency + one mini-job."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
from bertserve.server.testing.launcher import RunningServer
from lib.load import timed, wait_until
from lib.stats import median

from sharing.bench import Bench, log


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
