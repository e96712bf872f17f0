"""Soak test: many clients, mixed request sizes, for minutes; every reply checked.

Starts a real server on free loopback ports (the shared launcher, ``tests/serving.py``),
computes the expected vector of every corpus sentence once with the in-process ``Encoder``
(same model options), then runs ``--clients`` threads, each with its own ``BertClient``, for
``--minutes``. Each thread sends requests of mixed sizes drawn from the corpus, mostly
blocking ``encode``, sometimes a few ``blocking=False`` requests then ``fetch``, and checks
every reply row by row against the expected vectors. The server's memory (RSS of the server
and all its children) is sampled throughout.

    python benchmarks/soak.py --clients 64 --minutes 30 --mix small,medium,bulk \\
        --json benchmarks/results/soak.json --markdown benchmarks/results/soak.md
    python benchmarks/soak.py --clients 4 --minutes 0.5 -- --max-batch-size 64   # flags after -- go to the server

Exits 1 if any request was lost, crossed or wrong (or the server did not stop cleanly),
2 if it could not run. Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import gc
import random
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bertserve.client
import numpy as np
from _common import (
    DEFAULT_CORPUS,
    NO_MODEL_HINT,
    RunningServer,
    ServerStartError,
    environment,
    read_corpus,
    resolve_model_dir,
    start_server,
    write_json,
)
from bertserve.client import BertClient, BertClientError, ServerError, ServerTimeoutError

# a ServerError of kind "busy"; newer clients raise it as this subclass
BUSY_ERROR: type[BaseException] | None = getattr(bertserve.client, "ServerBusyError", None)

# name: (fewest, most sentences, default weight)
SIZES: dict[str, tuple[int, int, float]] = {"small": (1, 8, 85.0), "medium": (9, 100, 12.0), "bulk": (200, 2000, 3.0)}
COSINE_MIN = 0.999
ASYNC_FRACTION = 0.15  # iterations that send 2-4 non-blocking requests, then fetch them
BUSY_BACKOFF_S = (0.05, 0.25)
DRAIN_MARGIN_S = 30.0  # beyond the client timeout, before a thread counts as stuck


# ----------------------------------------------------------------------------------------
# expected vectors and the check of one reply
# ----------------------------------------------------------------------------------------


class Expected:
    """The unit-length expected vector of every corpus sentence, by corpus index."""

    def __init__(self, vectors: np.ndarray) -> None:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        self.unit = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
        self.dim = int(vectors.shape[1])

    def check(self, indices: np.ndarray, got: Any) -> str:
        """``"ok"``, ``"crossed"`` (a row is the vector of a sentence not in this request)
        or ``"wrong"`` (bad shape, values or order)."""
        got = np.asarray(got, dtype=np.float32)
        if got.ndim != 2 or got.shape[1] != self.dim:
            return "wrong"
        rows = got / np.maximum(np.linalg.norm(got, axis=1, keepdims=True), 1e-12)
        if got.shape[0] == len(indices):
            bad = np.sum(rows * self.unit[indices], axis=1) < COSINE_MIN
            if not bad.any():
                return "ok"
            rows = rows[bad]
        best = np.argmax(rows @ self.unit.T, axis=1)
        matched = np.sum(rows * self.unit[best], axis=1) >= COSINE_MIN
        foreign = ~np.isin(best, indices)
        return "crossed" if np.any(matched & foreign) else "wrong"


# ----------------------------------------------------------------------------------------
# counters
# ----------------------------------------------------------------------------------------

OUTCOMES = ("ok", "wrong", "crossed", "lost", "busy", "error")


@dataclass
class Tally:
    """What happened to the requests of one size class. Every sent request ends in
    exactly one outcome; ``answered`` = ok + wrong + crossed (a reply with vectors)."""

    sent: int = 0
    sentences_answered: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # "error" outcomes by kind
    latencies: list[float] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return self.outcomes["ok"] + self.outcomes["wrong"] + self.outcomes["crossed"]

    @property
    def in_flight(self) -> int:
        return self.sent - sum(self.outcomes.values())

    def summary(self, seconds: float) -> dict[str, Any]:
        ms = np.asarray(self.latencies) * 1000
        return {
            "sent": self.sent,
            "answered": self.answered,
            **{name: self.outcomes[name] for name in OUTCOMES},
            # a request still unanswered after the drain deadline (its thread is stuck) is lost too
            "lost": self.outcomes["lost"] + self.in_flight,
            "in_flight_at_end": self.in_flight,
            "other_errors": self.outcomes["error"],
            "errors_by_kind": dict(self.errors),
            "sentences_per_second": round(self.sentences_answered / seconds, 1) if seconds > 0 else None,
            "latency_ms": {
                name: round(float(np.percentile(ms, q)), 1) if len(ms) else None
                for name, q in (("p50", 50), ("p99", 99), ("max", 100))
            },
        }


class Counters:
    def __init__(self, classes: list[str]) -> None:
        self._lock = threading.Lock()
        self.by_class = {name: Tally() for name in classes}
        self.connect_errors: Counter[str] = Counter()  # BertClient() failed: no request was sent

    def connect_failed(self, exc: BaseException) -> None:
        with self._lock:
            self.connect_errors[type(exc).__name__] += 1

    def sent(self, size_class: str) -> None:
        with self._lock:
            self.by_class[size_class].sent += 1

    def ended(
        self, size_class: str, outcome: str, *, seconds: float | None = None, rows: int = 0, kind: str = ""
    ) -> None:
        with self._lock:
            tally = self.by_class[size_class]
            tally.outcomes[outcome] += 1
            if outcome == "error":
                tally.errors[kind] += 1
            if outcome in ("ok", "wrong", "crossed") and seconds is not None:
                tally.latencies.append(seconds)
                tally.sentences_answered += rows

    def total(self) -> Tally:
        with self._lock:
            total = Tally()
            for tally in self.by_class.values():
                total.sent += tally.sent
                total.sentences_answered += tally.sentences_answered
                total.outcomes.update(tally.outcomes)
                total.errors.update(tally.errors)
                total.latencies.extend(tally.latencies)
            return total


# ----------------------------------------------------------------------------------------
# the clients
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    classes: list[str]
    weights: list[float]
    corpus: list[str]
    timeout_ms: float

    def draw(self, rng: random.Random) -> tuple[str, np.ndarray]:
        size_class = rng.choices(self.classes, self.weights)[0]
        fewest, most, _ = SIZES[size_class]
        count = rng.randint(fewest, most)
        indices = np.array([rng.randrange(len(self.corpus)) for _ in range(count)], dtype=np.int64)
        return size_class, indices

    def texts(self, indices: np.ndarray) -> list[str]:
        return [self.corpus[i] for i in indices]


def _failure(exc: BaseException) -> tuple[str, str]:
    """(outcome, kind) of a failed request."""
    if isinstance(exc, ServerTimeoutError):
        return "lost", ""
    if (BUSY_ERROR is not None and isinstance(exc, BUSY_ERROR)) or (
        isinstance(exc, ServerError) and exc.kind == "busy"
    ):
        return "busy", ""
    if isinstance(exc, ServerError):
        return "error", f"server:{exc.kind}"
    return "error", type(exc).__name__


class SoakClient(threading.Thread):
    """One client thread: its own ``BertClient`` (identity ``soak-<n>``: identities that are
    prefixes of one another, as ZeroMQ topics, so a reply filtered by prefix alone would
    cross) sending requests until ``stop`` is set."""

    def __init__(
        self, number: int, server: RunningServer, plan: Plan, expected: Expected, counters: Counters, seed: int
    ) -> None:
        super().__init__(name=f"soak-{number}", daemon=True)
        self.server, self.plan, self.expected, self.counters = server, plan, expected, counters
        self.rng = random.Random(seed * 1_000_003 + number)
        self.identity = f"soak-{number}"
        self.stop = threading.Event()
        self.crash: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    client = BertClient(
                        "127.0.0.1", **self.server.client_kwargs, timeout=self.plan.timeout_ms,
                        identity=self.identity, check_length=False,
                    )  # fmt: skip
                except BertClientError as exc:
                    self.counters.connect_failed(exc)
                    self.stop.wait(1.0)
                    continue
                with client:
                    while not self.stop.is_set():
                        if self.rng.random() < ASYNC_FRACTION:
                            self._non_blocking(client)
                        else:
                            self._blocking(client)
        except BaseException as exc:  # a bug in the soak itself: reported, fails the run
            self.crash = exc

    def _end(self, size_class: str, indices: np.ndarray, got: Any, started: float) -> None:
        outcome = self.expected.check(indices, got)
        self.counters.ended(size_class, outcome, seconds=time.perf_counter() - started, rows=len(indices))

    def _fail(self, size_class: str, exc: BaseException) -> None:
        outcome, kind = _failure(exc)
        self.counters.ended(size_class, outcome, kind=kind)
        if outcome == "busy":
            self.stop.wait(self.rng.uniform(*BUSY_BACKOFF_S))

    def _blocking(self, client: BertClient) -> None:
        size_class, indices = self.plan.draw(self.rng)
        self.counters.sent(size_class)
        started = time.perf_counter()
        try:
            got = client.encode(self.plan.texts(indices))
        except BertClientError as exc:
            self._fail(size_class, exc)
            return
        self._end(size_class, indices, got, started)

    def _non_blocking(self, client: BertClient) -> None:
        pending: dict[int, tuple[str, np.ndarray, float]] = {}
        for _ in range(self.rng.randint(2, 4)):
            size_class, indices = self.plan.draw(self.rng)
            self.counters.sent(size_class)
            try:
                request_id = client.encode(self.plan.texts(indices), blocking=False)
            except BertClientError as exc:
                self._fail(size_class, exc)
                continue
            pending[int(request_id)] = (size_class, indices, time.perf_counter())
        while pending:
            try:
                for result in client.fetch():
                    size_class, indices, started = pending.pop(result.id)
                    self._end(size_class, indices, result.embedding, started)
            except ServerTimeoutError as exc:  # every request still outstanding is given up
                for size_class, _indices, _started in pending.values():
                    self._fail(size_class, exc)
                pending.clear()
            except ServerError as exc:  # one request failed; the others stay outstanding
                if exc.request_id in pending:
                    self._fail(pending.pop(exc.request_id)[0], exc)
                else:
                    raise


# ----------------------------------------------------------------------------------------
# server memory
# ----------------------------------------------------------------------------------------


class RssWatch(threading.Thread):
    """Samples the server family's RSS (MiB) every ``interval`` seconds from ``origin``."""

    def __init__(self, server: RunningServer, interval: float, origin: float) -> None:
        super().__init__(name="rss", daemon=True)
        self.server, self.interval, self.origin = server, interval, origin
        self.samples: list[tuple[float, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while True:
            self.samples.append((round(time.monotonic() - self.origin, 2), round(self.server.family_rss_mib(), 1)))
            if self.done.wait(self.interval):
                return

    def latest(self) -> float:
        return self.samples[-1][1] if self.samples else float("nan")

    def summary(self, warmup_s: float, load_s: float) -> dict[str, Any]:
        during = [(t, mib) for t, mib in self.samples if t <= load_s + self.interval / 2 and mib > 0]
        after = [(t, mib) for t, mib in during if t >= warmup_s] or during[-1:]
        if not after:
            return {"samples": self.samples}
        start, end = after[0][1], after[-1][1]
        slope = None
        if len(after) >= 3:
            times, mibs = np.array(after).T
            slope = round(float(np.polyfit(times / 60, mibs, 1)[0]), 2)
        return {
            "warmup_seconds": round(warmup_s, 1),
            "start_mib": start,
            "peak_mib": max(mib for _, mib in during),
            "end_mib": end,
            "growth_percent": round(100 * (end - start) / start, 2) if start > 0 else None,
            "slope_mib_per_minute": slope,
            "interval_seconds": self.interval,
            "samples": self.samples,
        }


# ----------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------


def parse_mix(text: str) -> tuple[list[str], list[float]]:
    """``small,medium,bulk`` (default weights) or ``small=90,bulk=10``."""
    classes, weights = [], []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, weight = part.partition("=")
        if name not in SIZES:
            raise argparse.ArgumentTypeError(f"unknown size {name!r}; choose from {', '.join(SIZES)}")
        classes.append(name)
        weights.append(float(weight) if weight else SIZES[name][2])
    if not classes or min(weights) <= 0:
        raise argparse.ArgumentTypeError(f"--mix needs sizes with positive weights, not {text!r}")
    return classes, weights


def expected_vectors(model_dir: Path, corpus: list[str], args: argparse.Namespace) -> Expected:
    from bertserve.server import Encoder

    options: dict[str, Any] = {"max_seq_len": None if args.max_seq_len.upper() == "NONE" else int(args.max_seq_len)}
    options["dtype"] = args.dtype
    if args.graph_dir is not None:
        options["graph_dir"] = str(args.graph_dir)
    encoder = Encoder(model_dir, **options)
    expected = Expected(np.asarray(encoder.encode(corpus)))
    del encoder
    gc.collect()
    return expected


def progress(message: str, origin: float) -> None:
    print(f"[{time.monotonic() - origin:7.1f} s] {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, server_flags: list[str]) -> dict[str, Any]:
    origin = time.monotonic()
    model_dir = resolve_model_dir(args.model_dir)
    if model_dir is None:
        raise SystemExit(NO_MODEL_HINT)
    classes, weights = args.mix
    corpus = read_corpus(args.corpus)
    progress(f"expected vectors of {len(corpus)} sentences from the in-process Encoder ({model_dir})", origin)
    expected = expected_vectors(model_dir, corpus, args)

    flags = ["--model-dir", str(model_dir), "--max-seq-len", args.max_seq_len, "--dtype", args.dtype]
    flags += ["--num-worker", str(args.num_worker)]
    if args.graph_dir is not None:
        flags += ["--graph-dir", str(args.graph_dir)]
    server = start_server(*flags, *server_flags, expect_ready=False, echo=args.server_output)
    report: dict[str, Any] = {"kind": "soak", "server_flags": [*flags, *server_flags]}
    try:
        report["server_ready_seconds"] = round(server.wait_ready(args.start_timeout), 2)
        progress(f"server ready on port {server.port} ({server.port_out}); {args.clients} clients", origin)
        load_s = args.minutes * 60
        warmup_s = min(60.0, 0.2 * load_s) if args.warmup is None else args.warmup
        interval = min(args.rss_interval, max(0.5, load_s / 30))
        plan = Plan(classes, weights, corpus, args.timeout_ms)
        counters = Counters(classes)
        clients = [SoakClient(n, server, plan, expected, counters, args.seed) for n in range(1, args.clients + 1)]
        load_origin = time.monotonic()
        rss = RssWatch(server, interval, load_origin)
        rss.start()
        for client in clients:
            client.start()
        report_every = min(60.0, max(5.0, load_s / 10))
        while (left := load_s - (time.monotonic() - load_origin)) > 0:
            time.sleep(min(left, report_every))
            t = counters.total()
            progress(
                f"sent {t.sent}, answered {t.answered}, wrong {t.outcomes['wrong']}, crossed "
                f"{t.outcomes['crossed']}, lost {t.outcomes['lost']}, busy {t.outcomes['busy']}, "
                f"errors {t.outcomes['error']}; server RSS {rss.latest():.0f} MiB",
                origin,
            )
        for client in clients:
            client.stop.set()
        drain_deadline = time.monotonic() + args.timeout_ms / 1000 + DRAIN_MARGIN_S
        progress(f"load over; draining (at most {drain_deadline - time.monotonic():.0f} s)", origin)
        for client in clients:
            client.join(max(0.0, drain_deadline - time.monotonic()))
        seconds = time.monotonic() - load_origin
        rss.done.set()
        rss.join()
        stuck = [c.name for c in clients if c.is_alive()]
        crashes = [f"{c.name}: {c.crash!r}" for c in clients if c.crash is not None]
        report["status"] = _status(server)
    finally:
        server.terminate()
        report["stop_problems"] = server.wait_stopped()

    total = counters.total().summary(seconds)
    report.update(
        clients=args.clients, minutes=args.minutes, seconds=round(seconds, 1), timeout_ms=args.timeout_ms,
        mix=dict(zip(classes, weights, strict=True)), total=total, connect_errors=dict(counters.connect_errors),
        by_size={name: tally.summary(seconds) for name, tally in counters.by_class.items()},
        rss=rss.summary(warmup_s, load_s), stuck_clients=stuck, crashes=crashes, environment=environment(),
    )  # fmt: skip
    failures = [f"{name} {total[name]}" for name in ("lost", "crossed", "wrong") if total[name]]
    failures += [f"stuck clients {stuck}"] * bool(stuck) + [f"crashes {crashes}"] * bool(crashes)
    failures += [f"stop: {problem}" for problem in report["stop_problems"]]
    if total["sent"] == 0:
        failures.append("nothing was sent")
    growth = report["rss"].get("growth_percent")
    if args.max_rss_growth is not None and growth is not None and growth > args.max_rss_growth:
        failures.append(f"server RSS grew {growth}% (> {args.max_rss_growth}%)")
    report["passed"], report["failures"] = not failures, failures
    return report


def _status(server: RunningServer) -> dict[str, Any] | None:
    try:
        with BertClient("127.0.0.1", **server.client_kwargs, timeout=10_000, check_length=False) as client:
            return client.server_status
    except BertClientError as exc:
        return {"error": repr(exc)}


def markdown(report: dict[str, Any]) -> str:
    sizes = list(report["by_size"])
    columns = [report["total"], *(report["by_size"][name] for name in sizes)]
    mix = ",".join(f"{name}={weight:g}" for name, weight in report["mix"].items())
    lines = [
        f"## bertserve soak: {report['clients']} clients, {report['minutes']:g} min of load "
        f"({report['seconds']:.0f} s with the drain), mix {mix}",
        "",
        "| counter | total | " + " | ".join(sizes) + " |",
        "| --- | ---: |" + " ---: |" * len(sizes),
    ]
    rows = ["sent", "answered", "ok", "wrong", "crossed", "lost", "busy", "other_errors", "sentences_per_second"]
    for row in rows:
        lines.append(f"| {row.replace('_', ' ')} | " + " | ".join(str(c[row]) for c in columns) + " |")
    for q in ("p50", "p99", "max"):
        lines.append(f"| latency {q} ms | " + " | ".join(str(c["latency_ms"][q]) for c in columns) + " |")
    rss = report["rss"]
    lines += [
        "",
        f"| server RSS MiB | start (after {rss.get('warmup_seconds')} s) | peak | end | growth % | MiB/min |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| {len(rss['samples'])} samples | {rss.get('start_mib')} | {rss.get('peak_mib')} | {rss.get('end_mib')} "
        f"| {rss.get('growth_percent')} | {rss.get('slope_mib_per_minute')} |",
        "",
    ]
    if report["total"]["errors_by_kind"]:
        lines += [f"other errors: {report['total']['errors_by_kind']}", ""]
    if report["connect_errors"]:
        lines += [f"clients that could not connect (retried): {report['connect_errors']}", ""]
    verdict = "PASS" if report["passed"] else "FAIL: " + "; ".join(report["failures"])
    return "\n".join([*lines, f"**{verdict}**", ""])


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ours, server_flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Flags after -- are passed to `bertserve start` as they are."
    )
    parser.add_argument("--clients", type=int, default=64, help="client threads (default 64)")
    parser.add_argument("--minutes", type=float, default=30.0, help="minutes of load (default 30)")
    parser.add_argument(
        "--mix", type=parse_mix, default="small,medium,bulk",
        help="request sizes: small (1-8), medium (9-100), bulk (200-2000), as name or name=weight; "
        "default weights small 85, medium 12, bulk 3",
    )  # fmt: skip
    parser.add_argument("--model-dir", type=Path, help="default: all-MiniLM-L6-v2")
    parser.add_argument("--graph-dir", type=Path, help="graph cache shared by the Encoder and the server")
    parser.add_argument("--num-worker", type=int, default=2)
    parser.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (server and Encoder)")
    parser.add_argument("--max-seq-len", default="128", help="server and Encoder (default 128)")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument(
        "--timeout-ms", type=float, default=600_000, help="client timeout; no reply by then is lost (default 600000)"
    )
    parser.add_argument("--warmup", type=float, help="seconds before the RSS baseline (default 60, or 1/5 of the run)")
    parser.add_argument("--rss-interval", type=float, default=5.0, help="seconds between RSS samples (default 5)")
    parser.add_argument("--max-rss-growth", type=float, help="fail if RSS grows more than this %% after warm-up")
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds for the server to be ready")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-output", action="store_true", help="echo the server's output to stderr")
    parser.add_argument("--json", type=Path, help="write the report as JSON")
    parser.add_argument("--markdown", type=Path, help="write the report as markdown")
    args = parser.parse_args(ours)
    if args.clients < 1 or args.minutes <= 0 or args.timeout_ms <= 0:
        parser.error("--clients, --minutes and --timeout-ms must be positive")
    return args, server_flags


def main(argv: list[str] | None = None) -> int:
    args, server_flags = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop like Ctrl-C: the server is stopped too
    try:
        report = run(args, server_flags)
    except ServerStartError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    text = markdown(report)
    print(text)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text, encoding="utf-8")
    if args.json is not None:
        write_json(report, args.json)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
