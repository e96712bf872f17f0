"""Three denial-of-service attacks made of valid requests with a valid API key, against a real
server on loopback: one checkout's code (``--checkout``, this one by default), or two side by
side (``--baseline``, run first).

    git worktree add /tmp/bertserve-before 197c93b
    python benchmarks/attacks.py --checkout /tmp/bertserve-before      # one run, printed
    python benchmarks/attacks.py                                       # this checkout
    python benchmarks/attacks.py --baseline /tmp/bertserve-before --markdown benchmarks/report/attacks.md

A checkout's server runs with its own ``package/``, ``client/`` and ``server/`` (as setup.py
maps them) and this environment's packages: a folder first on ``PYTHONPATH`` holds a
``bertserve`` package of links to them, found before the editable install's finder (the last
of ``sys.meta_path``); the run checks where ``bertserve.server`` is imported from. Every
server serves the tiny fp32 models of ``tests/data`` with ``--http-port`` and ``--api-keys``
(two principals: ``attacker``, and ``bystander``, who also calls from another loopback
address, 127.0.0.2), each attack a server of its own:

1. **rerank amplification**: ``--attackers`` (4) callers each POST ``/rerank`` (TEI's shape)
   with a 99,990-character query and 1,000 one-word documents (a 107 KB body), again as soon
   as one is answered, for ``--attack-s`` (5) s, then close their connections, to a server of
   ``rerank_bert``. A bystander sends a small ``/rerank`` (one query, two documents) every
   100 ms from 2 s before the attack to ``--after-s`` (5) s after it, open loop, each with
   10 s to be answered. Figures: the bystander's median and largest latency and its calls
   with no answer, idle, during and after; each process's RSS (the HTTP process, the head,
   the sink, the worker) at its peak during the attack and at the end of the after-window,
   over its RSS just before; each process's CPU during the attack and in the after-window,
   and the machine's busy time spent by neither the server nor the benchmark (a neighbour
   on shared cores). ``--rounds`` (3) rounds, each on a new server.
2. **answers without a bound**: ``/embed_sparse`` of ``["a"] * 100000`` to ``splade_bert``
   (SPLADE, 700-term vocabulary) and ``/v1/embeddings`` of ``{"input": ["a"] * 100000}`` to
   the 32-wide ``roberta`` of ``tests/data/families``, each ``--repeats`` (3) times: status,
   answer size, time, each process's RSS peak over its RSS before the call (median of the
   repeats) and what it holds 2 s after the last call.
3. **a silent hang**: a server of ``rerank_bert`` with ``--max-message-bytes`` and
   ``--max-http-body-bytes`` 1 MiB; a ``/rerank`` of a 100-character query and 6,000
   documents of 100 characters (a 0.62 MB body; its 6,000 pairs, none cut, are 1.23 MB):
   the time until the caller gets an answer, and its status, within ``--hang-timeout-s``
   (30), while the bystander calls as in 1; repeated ``--repeats`` times unless a call got
   no answer (another would only wait as long again).

The report gives the CPU, the load average at the start and the end (the machine may be
shared), and, for the last run, which figures pass the bounds: a bystander answered within
1 s, and no process grown by more than 64 MiB per attacking request. A server whose
processes hold more than ``--max-server-mib`` (8 GiB) together is killed, and the report
says so: an attack that grows a process without bound must not take the machine with it.
The whole run, both checkouts, takes about six minutes on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from lib.inputs import DEFAULT_CORPUS, read_corpus
from lib.report import Progress, describe_cpu, environment, format_load, write_json, write_report
from lib.rss import MIB, RssSampler, family_rss
from lib.stats import fmt, median

log = Progress()
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
KEYS = {"attacker": "attacker-key-0123456789abcdef", "bystander": "bystander-key-0123456789abcdef"}
BYSTANDER_ADDRESS = "127.0.0.2"
BYSTANDER_EVERY_S = 0.1
BYSTANDER_TIMEOUT_S = 10.0
BYSTANDER_BODY = {"query": "what is the capital of france", "texts": ["paris is in france", "the sky is blue"]}
IDLE_S = 2.0  # the bystander alone before an attack
HOLD_S = 2.0  # after a call, before what the processes hold is read
STOP_TIMEOUT_S = 10.0  # then wait_stopped gives the children 15 s more, and kills what is left
GUARD_MIB = 8192  # default --max-server-mib
SMALL_FRAME = 1024 * 1024  # attack 3's --max-message-bytes and --max-http-body-bytes
HANG_SIDE_CHARS, HANG_DOCUMENTS = 100, 6000  # attack 3: pairs of 205 bytes, 1.23 MB in all
BYSTANDER_BOUND_S = 1.0
GROWTH_BOUND_MIB = 64.0  # per attacking request
MODELS = {
    "ranker": DATA / "tasks" / "rerank_bert",
    "splade": DATA / "tasks" / "splade_bert",
    "embedder": DATA / "families" / "roberta",
}
ROLES = ("http", "head", "sink", "worker")


# -- the code under test -------------------------------------------------------------------


@dataclass(frozen=True)
class Checkout:
    path: Path
    revision: str  # short commit, and whether client/ or server/ differ from it
    env: dict[str, str]  # what the server's environment needs to import bertserve from ``path``


def checkout_env(checkout: Path, folder: Path) -> dict[str, str]:
    """The environment in which ``python -m bertserve.server.cli`` imports bertserve from
    ``checkout``; raises SystemExit if it imports it from elsewhere."""
    env: dict[str, str] = {}
    if checkout != ROOT:
        package = folder / "bertserve"
        package.mkdir(parents=True)
        (package / "__init__.py").symlink_to(checkout / "package" / "__init__.py")
        for name in ("client", "server"):
            (package / name).symlink_to(checkout / name, target_is_directory=True)
        env["PYTHONPATH"] = str(folder)
    code = "import os, bertserve.server as s, bertserve.client as c; print(os.path.realpath(s.__file__)); "
    code += "print(os.path.realpath(c.__file__))"
    found = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, cwd=folder, capture_output=True, text=True, timeout=60
    )
    paths = found.stdout.split()
    if found.returncode or len(paths) != 2 or not all(Path(p).is_relative_to(checkout) for p in paths):
        raise SystemExit(f"bertserve is imported from {paths or found.stderr.strip()}, not from {checkout}")
    return env


def describe_revision(checkout: Path) -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=30).stdout

    commit = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "client", "server", "package").strip()
    return f"{commit} with uncommitted changes to client/ or server/" if changed else commit


@dataclass
class Target:
    """A running server, its HTTP address and the pid of each of its processes by role."""

    server: RunningServer
    url: str
    pids: dict[str, int]

    def rss(self) -> dict[str, float]:
        """RSS in MiB by role (NaN for a process gone)."""
        by_pid = family_rss(self.server)
        return {role: by_pid.get(pid, float("nan")) for role, pid in self.pids.items()}


class RssGuard:
    """Kills a server's processes (SIGKILL, by pid) once together they hold more than
    ``cap_mib``: an attack that grows a process without bound would otherwise take the
    machine's memory (and its neighbours') before the run stops it. Notes the family's peak."""

    def __init__(self, target: Target, cap_mib: float, interval: float = 0.1) -> None:
        self.target, self.cap_mib, self.interval = target, cap_mib, interval
        self.peak_mib = 0.0
        self.killed_at_mib: float | None = None
        self.killed_rss: dict[str, float] = {}  # by role, when killed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-guard", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            family = self.target.server.family()
            by_pid = family_rss(self.target.server)
            total = sum(by_pid.values())
            self.peak_mib = max(self.peak_mib, total)
            if total > self.cap_mib and self.killed_at_mib is None:
                self.killed_at_mib = total
                self.killed_rss = {role: by_pid.get(pid, math.nan) for role, pid in self.target.pids.items()}
                for process in family:
                    with contextlib.suppress(psutil.Error):
                        process.kill()
                log(f"the server's processes held {total:.0f} MiB, over {self.cap_mib:.0f}: killed {self.killed_rss}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def serve(checkout: Checkout, folder: Path, graph_dir: Path, models: Sequence[str], *flags: str) -> Target:
    keys = folder / "api-keys"
    if not keys.exists():
        keys.write_text("".join(f"{name} {key}\n" for name, key in KEYS.items()))
        keys.chmod(0o600)
    http_port = free_port()
    served = [arg for name in models for arg in ("--model", f"{name}={MODELS[name]},dtype=fp32")]
    server = start_server(
        *("--http-port", str(http_port), "--api-keys", str(keys), "--graph-dir", str(graph_dir), *served, *flags),
        env=checkout.env,
        echo=False,
        log_path=folder / f"server-{time.monotonic_ns()}.log",
    )
    url = f"http://127.0.0.1:{http_port}"
    try:
        status = httpx.get(f"{url}/status", headers=auth("attacker"), timeout=30).json()
        pids = {"head": server.process.pid} | process_roles(server, http_port)
        pids |= {f"worker {w['model']}" if len(models) > 1 else "worker": int(w["pid"]) for w in status["workers"]}
    except BaseException:
        stop(server)
        raise
    return Target(server, url, pids)


def process_roles(server: RunningServer, http_port: int) -> dict[str, int]:
    """The HTTP process (listening on ``http_port``) and the sink (on the port replies leave from)."""
    found = {}
    for process in server.family()[1:]:
        try:
            ports = {c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue
        if http_port in ports:
            found["http"] = process.pid
        if server.port_out in ports:
            found["sink"] = process.pid
    return found


def stop(server: RunningServer) -> list[str]:
    """SIGTERM, and whatever is left killed after ``STOP_TIMEOUT_S``: what went wrong."""
    server.terminate()
    return server.wait_stopped(STOP_TIMEOUT_S)


def auth(principal: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[principal]}"}


def json_body(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


# -- the bystander ------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    at: float  # time.monotonic() when sent
    seconds: float | None  # None: no answer within its time
    status: int | str  # the HTTP status, or what went wrong


async def bystander(url: str, stop_event: asyncio.Event, calls: list[Call]) -> None:
    """A small ``/rerank`` every ``BYSTANDER_EVERY_S`` from ``BYSTANDER_ADDRESS`` with its own
    key, whether or not the last was answered, until ``stop_event``; then waits for the last."""
    transport = httpx.AsyncHTTPTransport(
        local_address=BYSTANDER_ADDRESS, limits=httpx.Limits(max_connections=None, max_keepalive_connections=20)
    )
    body = json_body(BYSTANDER_BODY)
    headers = auth("bystander") | {"content-type": "application/json"}
    async with httpx.AsyncClient(transport=transport, base_url=url, headers=headers, timeout=None) as client:

        async def one() -> None:
            sent = time.monotonic()
            try:
                answer = await asyncio.wait_for(client.post("/rerank", content=body), BYSTANDER_TIMEOUT_S)
                calls.append(Call(sent, time.monotonic() - sent, answer.status_code))
            except asyncio.TimeoutError:
                calls.append(Call(sent, None, "no answer"))
            except httpx.HTTPError as exc:
                calls.append(Call(sent, None, type(exc).__name__))

        pending = set()
        next_at = time.monotonic()
        while not stop_event.is_set():
            pending.add(asyncio.create_task(one()))
            next_at += BYSTANDER_EVERY_S
            with contextlib.suppress(asyncio.TimeoutError):  # the next call's time came
                await asyncio.wait_for(stop_event.wait(), max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*pending)


def bystander_figures(calls: Sequence[Call], start: float, end: float) -> dict[str, Any]:
    """The calls sent from ``start`` to ``end``: how many, their latency, those unanswered."""
    sent = [c for c in calls if start <= c.at < end]
    answered = [c.seconds for c in sent if c.seconds is not None]
    return {
        "sent": len(sent),
        "median_ms": median(answered) * 1000,
        "max_ms": max(answered, default=float("nan")) * 1000,
        "no_answer": len(sent) - len(answered),
        "statuses": dict(Counter(str(c.status) for c in sent)),
    }


# -- the attacks ---------------------------------------------------------------------------


OTHERS = "others"  # the machine's busy time but the server's processes' and this one's


def cpu_seconds(target: Target) -> dict[str, float]:
    """CPU seconds so far of each of the server's processes by role, and the machine's busy
    seconds that none of the server's processes nor this one spent (a neighbour's work)."""

    def spent(process: psutil.Process | int) -> float:
        try:
            t = (psutil.Process(process) if isinstance(process, int) else process).cpu_times()
        except psutil.Error:  # gone
            return math.nan
        return t.user + t.system

    times = {role: spent(pid) for role, pid in target.pids.items()}
    machine = psutil.cpu_times()
    busy = sum(getattr(machine, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
    ours = sum(v for v in map(spent, [psutil.Process(), *target.server.family()]) if not math.isnan(v))
    times[OTHERS] = busy - ours
    return times


def cpu_percent(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Percent of one core of each from ``before`` to ``after``, ``seconds`` apart."""
    return {key: (after[key] - before[key]) / seconds * 100 for key in before}


def growth(target: Target, sampler: RssSampler, now: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
    """Per role: RSS before (the sampler's first reading), the peak over it, and ``now`` over it."""
    rows = {}
    for role, pid in target.pids.items():
        before = sampler.initial_by_pid.get(pid, float("nan"))
        rows[role] = {"before_mib": before, "peak_mib": sampler.peak_by_pid.get(pid, float("nan")) - before}
        if now is not None:
            rows[role]["after_mib"] = now.get(role, float("nan")) - before
    return rows


async def attacker(url: str, body: bytes, until: float, results: list[dict[str, Any]]) -> None:
    """``/rerank`` with ``body`` again and again until ``until``; then the connection is closed."""
    headers = auth("attacker") | {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=None) as client:
        while (left := until - time.monotonic()) > 0:
            sent = time.monotonic()
            try:
                answer = await asyncio.wait_for(client.post("/rerank", content=body), left)
                results.append({"status": answer.status_code, "seconds": time.monotonic() - sent})
            except asyncio.TimeoutError:
                results.append({"status": "unanswered when cut off", "seconds": time.monotonic() - sent})
            except httpx.HTTPError as exc:
                results.append({"status": type(exc).__name__, "seconds": time.monotonic() - sent})


def amplification_body(corpus: Sequence[str]) -> tuple[bytes, str, list[str]]:
    text = " ".join(corpus)
    while len(text) < 99_990:
        text += " " + text
    words = sorted({w.lower() for s in corpus for w in s.split() if w.isalpha() and len(w) <= 5})
    documents = [words[i % len(words)] for i in range(1000)]
    return json_body({"query": text[:99_990], "texts": documents}), text[:99_990], documents


async def amplification(target: Target, corpus: Sequence[str], attackers: int, attack_s: float, after_s: float) -> dict:
    body, query, documents = amplification_body(corpus)
    calls: list[Call] = []
    done = asyncio.Event()
    watcher = asyncio.create_task(bystander(target.url, done, calls))
    await asyncio.sleep(IDLE_S)
    sampler = RssSampler(target.server, 0.1).start()
    cpu_start = cpu_seconds(target)
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    await asyncio.gather(*(attacker(target.url, body, started + attack_s, results) for _ in range(attackers)))
    ended = time.monotonic()
    sampler.stop()
    cpu_end = cpu_seconds(target)
    await asyncio.sleep(after_s)
    cpu_after = cpu_seconds(target)
    rss_now = target.rss()
    done.set()
    await asyncio.wait_for(watcher, BYSTANDER_TIMEOUT_S + 5)
    return {
        "body_bytes": len(body),
        "query_chars": len(query),
        "documents": len(documents),
        "attackers": attackers,
        "attack_s": attack_s,
        "after_s": after_s,
        "attack_calls": len(results),
        "attack_statuses": dict(Counter(str(r["status"]) for r in results)),
        "attack_median_s": median([r["seconds"] for r in results if isinstance(r["status"], int)]),
        "bystander": {
            "idle": bystander_figures(calls, 0, started),
            "during": bystander_figures(calls, started, ended),
            "after": bystander_figures(calls, ended, float("inf")),
        },
        "rss": growth(target, sampler, rss_now),
        "cpu_during_percent": cpu_percent(cpu_start, cpu_end, ended - started),
        "cpu_after_percent": cpu_percent(cpu_end, cpu_after, after_s),
    }


def unbounded(target: Target, path: str, body: dict[str, Any], repeats: int, timeout_s: float) -> dict[str, Any]:
    payload = json_body(body)
    headers = auth("attacker") | {"content-type": "application/json"}
    rows = []
    with httpx.Client(base_url=target.url, headers=headers, timeout=timeout_s) as client:
        first = target.rss()
        for _ in range(repeats):
            sampler = RssSampler(target.server, 0.05).start()
            sent = time.monotonic()
            try:
                answer = client.post(path, content=payload)
                row: dict[str, Any] = {"status": answer.status_code, "answer_bytes": len(answer.content)}
                if answer.status_code != 200:
                    row["error"] = answer.text[:300]
                del answer
            except httpx.HTTPError as exc:
                row = {"status": type(exc).__name__, "answer_bytes": 0}
            row["seconds"] = time.monotonic() - sent
            sampler.stop()
            row["rss"] = growth(target, sampler)
            rows.append(row)
            log(f"{path}: {row['status']}, {row['answer_bytes'] / MIB:.1f} MiB in {row['seconds']:.1f} s")
        time.sleep(HOLD_S)
        held = target.rss()
    return {
        "path": path,
        "inputs": len(body.get("inputs") or body.get("input") or ()),
        "body_bytes": len(payload),
        "calls": rows,
        "status": dict(Counter(str(r["status"]) for r in rows)),
        "answer_mib": median([r["answer_bytes"] / MIB for r in rows]),
        "seconds": median([r["seconds"] for r in rows]),
        "peak_mib": {role: median([r["rss"][role]["peak_mib"] for r in rows]) for role in target.pids},
        "held_mib": {role: held[role] - first[role] for role in target.pids},
        "errors": sorted({r["error"] for r in rows if "error" in r}),
    }


def hang_body(corpus: Sequence[str]) -> tuple[bytes, int]:
    """The rerank of attack 3, and the bytes of its pairs written whole (``query ||| document``).

    Its pairs are short (at most 110 of the 128 tokens the model takes), so none is cut: the
    request costs little to check and tokenize, and only its frame is too large."""
    text = " ".join(corpus)
    size = HANG_SIDE_CHARS
    query = text[:size]
    documents = [text[(i * size) % (len(text) - size) :][:size] for i in range(HANG_DOCUMENTS)]
    pairs = sum(len(f"{query} ||| {d}".encode()) for d in documents)
    return json_body({"query": query, "texts": documents}), pairs


async def silent_hang(
    target: Target, corpus: Sequence[str], repeats: int, timeout_s: float, after_s: float
) -> dict[str, Any]:
    body, pair_bytes = hang_body(corpus)
    calls: list[Call] = []
    done = asyncio.Event()
    watcher = asyncio.create_task(bystander(target.url, done, calls))
    await asyncio.sleep(IDLE_S)
    sampler = RssSampler(target.server, 0.1).start()
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    headers = auth("attacker") | {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=target.url, headers=headers, timeout=None) as client:
        for _ in range(repeats):
            sent = time.monotonic()
            try:
                answer = await asyncio.wait_for(client.post("/rerank", content=body), timeout_s)
                rows.append(
                    {"status": answer.status_code, "seconds": time.monotonic() - sent, "error": answer.text[:300]}
                )
            except asyncio.TimeoutError:
                rows.append({"status": f"no answer in {timeout_s:g} s", "seconds": None})
                break
            except httpx.HTTPError as exc:  # the connection closed without an answer
                rows.append({"status": type(exc).__name__, "seconds": None})
                break
            log(f"hang: {rows[-1]['status']} in {rows[-1]['seconds']:.2f} s")
    ended = time.monotonic()
    await asyncio.sleep(after_s)  # does the server serve others again once the caller has gone?
    sampler.stop()
    rss_now = target.rss()
    done.set()
    await asyncio.wait_for(watcher, BYSTANDER_TIMEOUT_S + 5)
    answered = [r["seconds"] for r in rows if r["seconds"] is not None]
    return {
        "body_bytes": len(body),
        "pair_bytes": pair_bytes,
        "frame_limit": SMALL_FRAME,
        "timeout_s": timeout_s,
        "calls": rows,
        "status": dict(Counter(str(r["status"]) for r in rows)),
        "seconds": median(answered),
        "rss": growth(target, sampler, rss_now),
        "bystander": {
            "idle": bystander_figures(calls, 0, started),
            "during": bystander_figures(calls, started, ended),
            "after": bystander_figures(calls, ended, float("inf")),
        },
    }


# -- one run -------------------------------------------------------------------------------


def run(checkout_path: Path, args: argparse.Namespace, corpus: Sequence[str]) -> dict[str, Any]:
    """The three attacks against ``checkout_path``'s code, each on a server of its own."""
    with tempfile.TemporaryDirectory(prefix="bertserve-attacks-") as work:
        folder = Path(work)
        checkout = Checkout(checkout_path, describe_revision(checkout_path), checkout_env(checkout_path, folder))
        log(f"{checkout.path}: {checkout.revision}")
        report: dict[str, Any] = {"checkout": str(checkout.path), "revision": checkout.revision}
        report["load_start"] = os.getloadavg()
        stops: dict[str, list[str]] = {}

        def attack(name: str, models: Sequence[str], flags: Sequence[str], scenario: Any) -> dict[str, Any]:
            target = serve(checkout, folder, args.graph_dir, models, *flags)
            log(f"{name}: server up, processes {target.pids}")
            guard = RssGuard(target, args.max_server_mib)
            try:
                figures = scenario(target)
            finally:
                stops[name] = stop(target.server)
                guard.close()
            figures |= {"processes": target.pids, "family_peak_mib": guard.peak_mib}
            report[name] = figures | {"killed_at_mib": guard.killed_at_mib, "killed_rss_mib": guard.killed_rss}
            return report[name]

        rounds = [
            attack(
                f"amplification, round {i + 1}",
                ["ranker"],
                [],
                lambda t: asyncio.run(amplification(t, corpus, args.attackers, args.attack_s, args.after_s)),
            )
            for i in range(args.rounds)
        ]
        report["amplification"] = medians_of(rounds)
        attack(
            "unbounded",
            ["splade", "embedder"],
            [],
            lambda t: {
                "sparse": unbounded(
                    t, "/embed_sparse", {"model": "splade", "inputs": ["a"] * 100_000}, args.repeats, args.timeout_s
                ),
                "dense": unbounded(
                    t, "/v1/embeddings", {"model": "embedder", "input": ["a"] * 100_000}, args.repeats, args.timeout_s
                ),
            },
        )
        frame = ("--max-message-bytes", str(SMALL_FRAME), "--max-http-body-bytes", str(SMALL_FRAME))
        attack(
            "hang",
            ["ranker"],
            frame,
            lambda t: asyncio.run(silent_hang(t, corpus, args.repeats, args.hang_timeout_s, args.after_s)),
        )
        report["stops"] = stops
        report["load_end"] = os.getloadavg()
    return report


def medians_of(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of attack 1 as one: counts summed, the family's peak and the bystander's longest
    wait the largest, a server killed if any was, every other figure the median of the rounds'."""
    return _merged(rounds) | {"rounds": len(rounds)}


def _merged(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for key, value in rounds[0].items():
        values = [r[key] for r in rounds]
        if key in ("attack_statuses", "statuses"):
            merged[key] = dict(sum((Counter(v) for v in values), Counter()))
        elif key in ("sent", "no_answer", "attack_calls"):
            merged[key] = sum(values)
        elif key in ("family_peak_mib", "max_ms"):
            merged[key] = max((v for v in values if v is not None and not math.isnan(v)), default=math.nan)
        elif key == "killed_at_mib":
            merged[key] = max((v for v in values if v), default=None)
        elif isinstance(value, dict) and key not in ("processes", "killed_rss_mib"):
            merged[key] = _merged([r[key] for r in rounds])
        elif isinstance(value, float):
            merged[key] = median([v for v in values if v is not None and not math.isnan(v)])
        else:
            merged[key] = value
    return merged


# -- the report ----------------------------------------------------------------------------


def latency(b: dict[str, Any]) -> str:
    """``median / max ms, N of M no answer``."""
    text = f"{show(b['median_ms'], 0)} / {show(b['max_ms'], 0)}"
    if b["no_answer"]:
        text += f", **{b['no_answer']} of {b['sent']} no answer in {BYSTANDER_TIMEOUT_S:g} s**"
    else:
        text += f" ({b['sent']} calls)"
    others = {s: n for s, n in b["statuses"].items() if s not in ("200", "no answer")}
    if others:
        text += ", " + ", ".join(f"{n} x {s}" for s, n in others.items())
    return text


def statuses(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} x {s}" for s, n in counts.items()) or "none"


def table(runs: Sequence[dict[str, Any]], rows: list[tuple[str, Any]]) -> list[str]:
    """A markdown table: one column per run, one row per ``(label, run -> cell)``."""
    lines = [
        "| | " + " | ".join(f"`{r['revision']}`" for r in runs) + " |",
        "| --- |" + " ---: |" * len(runs),
    ]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in runs) + " |")
    return lines


def show(value: float | None, digits: int = 1) -> str:
    """``value`` to ``digits`` decimals; n/a for None or NaN."""
    return fmt(None if value is None or math.isnan(value) else value, digits)


def mib(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:+.0f}"


def was_killed(figures: dict[str, Any]) -> bool:
    """Whether the run killed the server of these figures for what it held."""
    killed = figures.get("killed_at_mib")
    return killed is not None and not math.isnan(killed)


def family_row(name: str) -> tuple[str, Any]:
    """The row of a table saying what the server's processes held together at most, and
    whether the run killed them for it."""

    def cell(r: dict[str, Any]) -> str:
        killed = r[name].get("killed_at_mib")
        text = show(r[name].get("family_peak_mib"), 0)
        return text + (f", **killed at {killed:.0f}**" if was_killed(r[name]) else "")

    return ("all the server's processes together, peak MiB", cell)


def markdown(report: dict[str, Any]) -> str:
    runs = report["runs"]
    env = report["environment"]
    first = runs[0]
    amp, hang = first["amplification"], first["hang"]
    lines = [
        "# Three denial-of-service attacks, made of valid requests",
        "",
        f"`{report['command']}`",
        "",
        f"CPU: {describe_cpu(env)}. Each column is one run of `benchmarks/attacks.py` against a "
        "checkout's code ("
        + "; ".join(f"`{r['revision']}`: `{r['checkout']}`" for r in runs)
        + "); every attack on a server of its own, serving the tiny fp32 models of "
        "`tests/data` with `--http-port` and `--api-keys` (two principals: the attacker, and a "
        f"bystander who also calls from {BYSTANDER_ADDRESS}); the new flags `--max-request-tokens` and "
        "`--max-reply-bytes` at their defaults. Load average (1/5/15 min) at the start and end of "
        "each run: " + "; ".join(f"{format_load(r['load_start'])} to {format_load(r['load_end'])}" for r in runs) + ".",
        "",
        "## 1. Rerank amplification",
        "",
        f"{amp['rounds']} rounds, each on a new server; a figure is the median of the rounds', a count their "
        f"sum, a max the largest. {amp['attackers']} attackers each POST `/rerank` with a "
        f"{amp['query_chars']:,}-character query and "
        f"{amp['documents']:,} one-word documents ({amp['body_bytes'] / 1000:.0f} KB), again as soon as "
        f"answered, for {amp['attack_s']:g} s, then close their connections. The bystander sends one query "
        f"and two documents every {BYSTANDER_EVERY_S * 1000:.0f} ms (open loop, {BYSTANDER_TIMEOUT_S:g} s "
        f"each); latency median / max in ms. RSS in MiB over each process's RSS just before the attack; "
        f"CPU in % of one core, during the attack and over the {amp['after_s']:g} s after the attackers left; "
        f"`{OTHERS}`: the machine's busy time that neither the server's processes nor the benchmark spent "
        "(a neighbour's work on the shared cores).",
        "",
    ]
    rows: list[tuple[str, Any]] = [
        ("attack calls (status)", lambda r: statuses(r["amplification"]["attack_statuses"])),
        (
            "attack call, median s (answered)",
            lambda r: show(r["amplification"]["attack_median_s"], 2),
        ),
    ]
    for phase in ("idle", "during", "after"):
        rows.append((f"bystander {phase}", lambda r, p=phase: latency(r["amplification"]["bystander"][p])))
    for role in ROLES:
        rows.append(
            (
                f"{role}: RSS before, MiB",
                lambda r, x=role: show(r["amplification"]["rss"].get(x, {}).get("before_mib"), 0),
            )
        )
        rows.append(
            (
                f"{role}: peak during / after",
                lambda r, x=role: " / ".join(
                    mib(r["amplification"]["rss"].get(x, {}).get(k, float("nan"))) for k in ("peak_mib", "after_mib")
                ),
            )
        )
    rows.append(family_row("amplification"))
    for role in (*ROLES, OTHERS):
        rows.append(
            (
                f"{role}: CPU % during / after",
                lambda r, x=role: " / ".join(
                    show(r["amplification"][k].get(x), 0) for k in ("cpu_during_percent", "cpu_after_percent")
                ),
            )
        )
    lines += table(runs, rows)
    lines += [
        "",
        "## 2. Answers without a bound",
        "",
        '`/embed_sparse` of `["a"] * 100000` to `splade_bert` (a tiny SPLADE model, 700 terms) and '
        '`/v1/embeddings` of `["a"] * 100000` to the tiny `roberta` of `tests/data/families` (32 '
        f"values a vector), each {report['repeats']} times; medians. RSS in MiB: the peak over the "
        f"process's RSS before the call, and what it held {HOLD_S:g} s after the last call over its RSS "
        "before the first.",
        "",
    ]
    rows = []
    for kind, label in (("sparse", "/embed_sparse"), ("dense", "/v1/embeddings")):
        rows += [
            (f"{label}: status", lambda r, k=kind: statuses(r["unbounded"][k]["status"])),
            (f"{label}: answer MiB", lambda r, k=kind: show(r["unbounded"][k]["answer_mib"], 1)),
            (f"{label}: seconds", lambda r, k=kind: show(r["unbounded"][k]["seconds"], 2)),
        ]
        for role in ("sink", "http", "head", f"worker {'splade' if kind == 'sparse' else 'embedder'}"):
            rows.append(
                (
                    f"{label}: {role} peak / held",
                    lambda r, k=kind, x=role: " / ".join(
                        mib(r["unbounded"][k][key].get(x, float("nan"))) for key in ("peak_mib", "held_mib")
                    ),
                )
            )
    rows.append(family_row("unbounded"))
    lines += table(runs, rows)
    errors = [
        f"- `{r['revision']}` {e}" for r in runs for k in ("sparse", "dense") for e in r["unbounded"][k]["errors"]
    ]
    if errors:
        lines += ["", "Refusals:", "", *errors]
    lines += [
        "",
        "## 3. A silent hang",
        "",
        f"`--max-message-bytes` and `--max-http-body-bytes` {SMALL_FRAME // 1024} KiB. One `/rerank` of a "
        f"{HANG_SIDE_CHARS}-character query and {HANG_DOCUMENTS:,} documents of {HANG_SIDE_CHARS} characters "
        f"({hang['body_bytes'] / 1e6:.2f} MB; its pairs, none cut, {hang['pair_bytes'] / 1e6:.2f} MB), the caller "
        "waiting "
        f"{hang['timeout_s']:g} s at most; again unless one got no answer. The bystander calls as in 1.",
        "",
    ]
    rows = [
        ("caller's answer", lambda r: statuses(r["hang"]["status"])),
        ("seconds to the answer (median)", lambda r: show(r["hang"]["seconds"], 2)),
        ("bystander idle", lambda r: latency(r["hang"]["bystander"]["idle"])),
        ("bystander meanwhile", lambda r: latency(r["hang"]["bystander"]["during"])),
        ("bystander after the caller gave up", lambda r: latency(r["hang"]["bystander"]["after"])),
    ]
    rows += [
        (
            f"{role}: RSS peak / after, MiB",
            lambda r, x=role: " / ".join(
                mib(r["hang"]["rss"].get(x, {}).get(k, math.nan)) for k in ("peak_mib", "after_mib")
            ),
        )
        for role in ROLES
    ]
    lines += table(runs, rows)
    errors = [f"- `{r['revision']}` {c['error']}" for r in runs for c in r["hang"]["calls"][:1] if c.get("error")]
    if errors:
        lines += ["", "The caller's answer:", "", *errors]
    lines += ["", "## Bounds on the last run", "", *verdict(runs[-1])]
    stops = [f"- `{r['revision']}` {name}: {'; '.join(p)}" for r in runs for name, p in r["stops"].items() if p]
    if stops:
        lines += [
            "",
            f"Servers that did not stop cleanly on SIGTERM within {STOP_TIMEOUT_S:g} s (what was left was killed):",
            "",
            *stops,
        ]
    return "\n".join(lines) + "\n"


def verdict(run_: dict[str, Any]) -> list[str]:
    """Each bound, whether the run kept it, and the figures."""

    def line(ok: bool, text: str) -> str:
        return f"- {'kept' if ok else '**NOT KEPT**'}: {text}"

    def answered(b: dict[str, Any], what: str) -> str:
        ok = b["no_answer"] == 0 and b["max_ms"] <= BYSTANDER_BOUND_S * 1000
        return line(
            ok,
            f"the bystander {what} answered within {BYSTANDER_BOUND_S:g} s "
            f"(max {show(b['max_ms'], 0)} ms, {b['no_answer']} of {b['sent']} unanswered)",
        )

    def largest(peaks: dict[str, float]) -> tuple[str, float]:
        known = {role: peak for role, peak in peaks.items() if not math.isnan(peak)}
        return max(known.items(), key=lambda kv: kv[1], default=("none", math.nan))

    amp, hang = run_["amplification"], run_["hang"]
    lines = [
        answered(amp["bystander"]["during"], "during attack 1"),
        answered(amp["bystander"]["after"], "after attack 1"),
        answered(hang["bystander"]["during"], "during attack 3"),
        answered(hang["bystander"]["after"], "after attack 3's caller gave up"),
    ]
    role, peak = largest({role: row["peak_mib"] for role, row in amp["rss"].items()})
    lines.append(
        line(
            peak / amp["attackers"] <= GROWTH_BOUND_MIB and not was_killed(amp),
            f"attack 1 grew no process by more than {GROWTH_BOUND_MIB:g} MiB per request in flight "
            f"(largest: {role}, {mib(peak)} MiB for {amp['attackers']} at once)",
        )
    )
    for kind in ("sparse", "dense"):
        u = run_["unbounded"][kind]
        role, peak = largest(u["peak_mib"])
        lines.append(
            line(
                peak <= GROWTH_BOUND_MIB,
                f"`{u['path']}` of {u['inputs']:,} inputs grew no process by more than {GROWTH_BOUND_MIB:g} MiB "
                f"(largest: {role}, {mib(peak)} MiB)",
            )
        )
    ok = all(c["seconds"] is not None for c in hang["calls"])
    lines.append(line(ok, f"attack 3's caller got an answer ({statuses(hang['status'])})"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--checkout", type=Path, default=ROOT, help="the code to attack (default: this checkout)")
    add("--baseline", type=Path, help="attack this checkout's code first, and report both side by side")
    add("--attackers", type=int, default=4)
    add("--attack-s", type=float, default=5.0)
    add("--after-s", type=float, default=5.0)
    add("--rounds", type=int, default=3, help="attack 1 this many times, each on a new server")
    add("--repeats", type=int, default=3, help="the calls of attacks 2 and 3")
    add("--timeout-s", type=float, default=120.0, help="the answers of attack 2 wait this long at most")
    add("--hang-timeout-s", type=float, default=30.0)
    add(
        "--max-server-mib",
        type=float,
        default=GUARD_MIB,
        help="kill a server whose processes hold more than this together (the machine's safety)",
    )
    add("--graph-dir", type=Path, default=Path(tempfile.gettempdir()) / "bertserve-attacks-graphs")
    add("--corpus", type=Path, default=DEFAULT_CORPUS)
    add("--json", type=Path)
    add("--markdown", type=Path)
    add("--render", type=Path, metavar="JSON", help="attack nothing: write the report of an earlier run's --json")
    args = parser.parse_args(argv)
    if args.render:
        report = nan_for_none(json.loads(args.render.read_text(encoding="utf-8")))
    else:
        corpus = read_corpus(args.corpus, 2000)
        checkouts = [args.baseline, args.checkout] if args.baseline else [args.checkout]
        report = {
            "command": "python benchmarks/attacks.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "environment": environment(),
            "repeats": args.repeats,
            "runs": [run(path.resolve(), args, corpus) for path in checkouts],
        }
        if args.json:
            write_json(report, args.json)
    write_report(report, markdown(report), None, args.markdown)
    return 0


def nan_for_none(data: Any) -> Any:
    """``data`` read back from JSON, where NaN was written as null."""
    if data is None:
        return math.nan
    if isinstance(data, dict):
        return {key: nan_for_none(value) for key, value in data.items()}
    if isinstance(data, list):
        return [nan_for_none(value) for value in data]
    return data


if __name__ == "__main__":
    raise SystemExit(main())
