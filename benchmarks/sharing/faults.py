"""``faults``: kill -9 a worker and SIGSTOP one while they hold jobs, and send an input that
crashes its worker; nothing lost or wrong, the hung worker replaced, the poison answered."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from types import ModuleType
from typing import Any

import numpy as np
import psutil
from bertserve.client import BertClient, ServerError
from bertserve.server.testing.launcher import RunningServer
from lib.inputs import BENCHMARKS_DIR
from lib.load import wait_until

from sharing.bench import Bench, compare_vectors, is_wrong, log

TESTS_DIR = BENCHMARKS_DIR.parent / "tests"  # the fault models stay with the tests: tests/faulty_model.py


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
            diff, cosine = compare_vectors(got, ref)
            wrong += is_wrong(diff, cosine)
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


def _faulty_model() -> ModuleType:
    """``tests/faulty_model.py``, imported from its path (the server's workers import it through
    the ``PYTHONPATH`` its ``pythonpath_env`` gives them)."""
    if "faulty_model" not in sys.modules:
        spec = importlib.util.spec_from_file_location("faulty_model", TESTS_DIR / "faulty_model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["faulty_model"] = module
        spec.loader.exec_module(module)
    return sys.modules["faulty_model"]


def _poison(bench: Bench) -> dict[str, Any]:
    if not (TESTS_DIR / "faulty_model.py").is_file():
        return {"skipped": "tests/faulty_model.py is missing"}
    faulty_model = _faulty_model()

    flags = ("--model-class", "faulty_model:FaultyModel")
    with (
        bench.server("poison", *flags, env=faulty_model.pythonpath_env()) as server,
        bench.client(server, timeout=60_000) as victim,
        bench.client(server) as normal,
    ):
        texts = bench.texts(32, offset=3)
        reference = np.asarray(normal.encode(texts))
        sent_at = time.perf_counter()
        victim.encode([f"This sentence says {faulty_model.CRASH_WORD} to its worker.", *texts[:3]], blocking=False)
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
            diff, cosine = compare_vectors(got[0], reference) if got else (float("inf"), -1.0)
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
        "served_after": compare_vectors(after, reference)[0] < 1e-3,
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
