"""Many one-sentence clients at once: 1 to 128 of them against the default server, over ZeroMQ
and over HTTP (``latency.py``'s client sweep).

A real deployment's small clients are many programs. 32 client threads in one Python process
are held back by that process's GIL, and the sweep would measure the benchmark. So the
clients of a level are spread over up to :attr:`Sweep.processes` processes (``python -m
lib.client_sweep``), threads within: 32 clients are 8 processes of 4 threads. Each client has
its own connection (:func:`lib.protocols.connected`) and sends one corpus sentence at a time,
back to back, each from its own place in the corpus.

Each level: the client processes start, connect and send one request each; then all go at
once, and after :attr:`Sweep.warmup_s` the window of :attr:`Sweep.seconds` begins. Of the
requests that ended in the window (every process reads one clock, ``CLOCK_MONOTONIC``): the
sentences per second, the latency p50 and p99, and the failures. Over the window: the whole
machine's idle share (``psutil.cpu_times()``: idle and iowait over all, guest time counted once),
the CPU (cores: CPU seconds per second) of each server process by role (:func:`server_roles`),
of the client processes, and of the rest of the machine (anyone else's work; the benchmark's
own parent process too, which sleeps), and the workers' busy share from ``server_status``.

The denominator of the ratio the issue sets, one bulk client, is measured in the same run over
each protocol: requests of :attr:`Sweep.bulk_size` of the same sentences, before and after
that protocol's levels. :func:`targets`: 32 clients' sentences/s >= 0.6 x one bulk client's,
and the machine at most 10 % idle under them, over each protocol.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from functools import partial
from typing import IO, Any

import psutil
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer
from comparing.targets import Target, target

from lib.inputs import cycle_take
from lib.load import timed
from lib.protocols import PROTOCOLS, Doors, connected, http_port, module_command
from lib.stats import percentile_ms, ratio

LEVELS = (1, 2, 4, 8, 16, 32, 64, 128)
TARGET_CLIENTS = 32
TARGET_RATIO, TARGET_IDLE = 0.6, 0.10
READY_TIMEOUT_S = 120.0
CLIENTS, REST = "clients", "rest of the machine"


@dataclass(frozen=True)
class Sweep:
    """The levels (clients at once), each level's warm-up and window, the most client
    processes, and the bulk requests of the denominator (their size, and how many before and
    how many after each protocol's levels)."""

    levels: tuple[int, ...] = LEVELS
    seconds: float = 8.0
    warmup_s: float = 2.0
    processes: int = 8
    bulk_size: int = 2000
    bulk_repeats: int = 2

    @classmethod
    def of(cls, args: argparse.Namespace) -> Sweep | None:
        """The plan of :func:`add_options`' flags; None with ``--no-sweep`` or ``--idle-only``."""
        if args.no_sweep or args.idle_only:
            return None
        if args.quick:  # a smoke run: the target's level and two others, briefly
            return cls(levels=(1, 8, TARGET_CLIENTS), seconds=2.0, warmup_s=1.0, bulk_size=500, bulk_repeats=1)
        return cls(levels=args.sweep_clients, seconds=args.sweep_seconds, processes=args.sweep_processes)


def _levels(text: str) -> tuple[int, ...]:
    """``--sweep-clients``: comma-separated numbers of clients, each at least 1."""
    found = tuple(int(part) for part in text.split(",") if part.strip())
    if not found or min(found) < 1:
        raise ValueError(text)
    return found


def add_options(parser: argparse.ArgumentParser) -> None:
    """The sweep's flags (the command's ``--quick`` and ``--idle-only`` are read too)."""
    add = parser.add_argument
    add("--no-sweep", action="store_true", help="leave out the client sweep (as --idle-only does)")
    add("--sweep-clients", type=_levels, default=LEVELS, help="clients at once per level (default 1,2,4,...,128)")
    add("--sweep-seconds", type=float, default=8.0, help="each level's window, after 2 s of warm-up (default 8)")
    add("--sweep-processes", type=int, default=8, help="the most client processes of a level, threads within")


def spread(clients: int, processes: int) -> list[int]:
    """Threads per process: ``clients`` over at most ``processes`` processes, as even as can be."""
    count = min(clients, processes)
    return [clients // count + (1 if i < clients % count else 0) for i in range(count)]


def server_roles(running: RunningServer, doors: Doors, status: dict[str, Any]) -> dict[int, str]:
    """Each server process's role, by pid. The command lines do not tell the spawned children
    apart, so: the head is the process started; a worker is one of ``server_status``'s
    ``workers``; the sink listens on the reply port, the HTTP front end on the HTTP port;
    multiprocessing's resource tracker (its command line says so) is left to the rest of the machine."""
    workers = {w["pid"]: f"worker {w['index']}" for w in status["workers"] if not w.get("remote")}
    roles = {}
    for process in running.family():
        pid = process.pid
        try:
            listening = {c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
            command = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if pid == running.process.pid:
            roles[pid] = "head"
        elif pid in workers:
            roles[pid] = workers[pid]
        elif running.port_out in listening:
            roles[pid] = "sink"
        elif http_port(doors) in listening:
            roles[pid] = "http"
        elif "resource_tracker" not in command:  # multiprocessing's bookkeeping: the rest of the machine's
            roles[pid] = f"process {pid}"
    return roles


def _columns(roles: list[str]) -> list[str]:
    """The roles in the order a request passes them, then anything else."""
    order = {"head": 0, "http": 1, "sink": 3}
    return sorted(roles, key=lambda role: (order.get(role, 2 if role.startswith("worker") else 4), role))


def _cpu_seconds(pids: list[int]) -> dict[int, float]:
    found = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            found[pid] = times.user + times.system
    return found


def _machine() -> tuple[float, float]:
    """Idle and total CPU seconds of the whole machine (guest time is inside user's already)."""
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    return idle, sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


def _snapshot(pids: list[int], client: BertClient) -> dict[str, Any]:
    busy = sum(float(w["busy_s"]) for w in client.server_status["workers"])
    return {"at": time.monotonic(), "machine": _machine(), "cpu": _cpu_seconds(pids), "busy_s": busy}


@dataclass
class _ClientProcess:
    """A client process of a level, and the file its stderr goes to (read when it fails)."""

    popen: subprocess.Popen[str]
    stderr: IO[str]

    def send(self, message: dict[str, Any]) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps(message) + "\n")
        self.popen.stdin.flush()

    def why(self) -> str:
        self.stderr.seek(0)
        lines = [line for line in self.stderr.read().splitlines() if line.strip()]
        return lines[-1] if lines else f"exited with {self.popen.poll()}"

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self.stderr.close()


def _start_clients(protocol: str, doors: Doors, threads: list[int], texts: list[str]) -> list[_ClientProcess]:
    """One process per entry of ``threads``, with that many clients, told what to send."""
    command, env = module_command("lib.client_sweep")
    children = []
    first = 0
    for count in threads:
        stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  # closed by _ClientProcess.close
        popen = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
        )
        children.append(_ClientProcess(popen, stderr))
        spec = {"protocol": protocol, "doors": doors.as_dict(), "threads": count, "first": first, "texts": texts}
        children[-1].send(spec)
        first += count
    return children


def level(
    protocol: str, clients: int, doors: Doors, roles: dict[int, str], texts: list[str], sweep: Sweep, status: BertClient
) -> dict[str, Any]:
    """One level: ``clients`` at once over ``protocol``; what the window saw (see the module's doc)."""
    threads = spread(clients, sweep.processes)
    children = _start_clients(protocol, doors, threads, texts)
    try:
        for child in children:
            assert child.popen.stdout is not None
            if child.popen.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {protocol} client process did not start: {child.why()}")
        window_start = time.monotonic() + sweep.warmup_s
        window_end = window_start + sweep.seconds
        for child in children:  # the load goes on a little past the window, so that it is load to the end
            child.send({"stop_at": window_end + 0.5})
        pids = [*roles, *(child.popen.pid for child in children)]
        time.sleep(max(0.0, window_start - time.monotonic()))
        before = _snapshot(pids, status)
        time.sleep(max(0.0, window_end - time.monotonic()))
        after = _snapshot(pids, status)
        answers = [json.loads(child.popen.communicate(timeout=READY_TIMEOUT_S)[0]) for child in children]
    finally:
        for child in children:
            child.close()
    seconds = after["at"] - before["at"]
    done = [s for answer in answers for end, s in answer["records"] if before["at"] <= end <= after["at"]]
    used = {pid: (after["cpu"].get(pid, 0.0) - before["cpu"].get(pid, 0.0)) / seconds for pid in pids}
    cpu = {role: used[pid] for pid, role in roles.items()} | {CLIENTS: sum(used[c.popen.pid] for c in children)}
    (idle_0, total_0), (idle_1, total_1) = before["machine"], after["machine"]
    idle_share = ratio(idle_1 - idle_0, total_1 - total_0)
    cpu[REST] = (1 - idle_share) * psutil.cpu_count() - sum(cpu.values())
    return {
        "clients": clients,
        "processes": len(threads),
        "per_s": len(done) / seconds,
        "requests": len(done),
        "failed": sum(answer["failed"] for answer in answers),
        "p50_ms": percentile_ms(done, 50),
        "p99_ms": percentile_ms(done, 99),
        "idle_share": idle_share,
        "worker_busy": (after["busy_s"] - before["busy_s"]) / seconds,
        "cpu_cores": cpu,
    }


def _bulk_runs(protocol: str, doors: Doors, bulk: list[str], repeats: int) -> list[float]:
    with connected(protocol, doors) as encode:
        return [len(bulk) / timed(partial(encode, bulk))[0] for _ in range(repeats)]


def measure(running: RunningServer, doors: Doors, texts: list[str], sweep: Sweep, log: Any) -> dict[str, Any]:
    """Every level over each protocol, with one bulk client's rate around them."""
    bulk = cycle_take(texts, 0, sweep.bulk_size)
    found: dict[str, Any] = {}
    with BertClient(port=doors.port, port_out=doors.port_out, timeout=60_000) as status:
        roles = server_roles(running, doors, status.server_status)
        for protocol in PROTOCOLS:
            with connected(protocol, doors) as encode:
                encode(bulk[:500])  # warm-up
            log(f"sweep, {protocol}: one bulk client, {sweep.bulk_size} sentences a request")
            runs = _bulk_runs(protocol, doors, bulk, sweep.bulk_repeats)
            levels = []
            for clients in sweep.levels:
                log(f"sweep, {protocol}: one-sentence clients at once: {clients}, {sweep.seconds:g} s")
                levels.append(level(protocol, clients, doors, roles, texts, sweep, status))
            runs += _bulk_runs(protocol, doors, bulk, sweep.bulk_repeats)
            found[protocol] = {"bulk_per_s": statistics.median(runs), "bulk_runs": runs, "levels": levels}
    return {"sweep": asdict(sweep), "roles": _columns(list(roles.values())), "protocols": found}


def _at(result: dict[str, Any], protocol: str, clients: int) -> dict[str, Any]:
    levels = result["protocols"][protocol]["levels"]
    return next((row for row in levels if row["clients"] == clients), {})


def targets(result: dict[str, Any] | None) -> list[Target]:
    """Over each protocol: 32 clients / one bulk client >= 0.6, and the machine's idle share
    under 32 clients <= 10 % (n/a when the sweep has no level of 32); none without the sweep."""
    if result is None:
        return []
    found = []
    for protocol in PROTOCOLS:
        row, bulk = _at(result, protocol, TARGET_CLIENTS), result["protocols"][protocol]["bulk_per_s"]
        per_s, idle = row.get("per_s", math.nan), row.get("idle_share", math.nan)
        detail = f"{per_s:.0f} against {bulk:.0f} sentences/s" if row else f"no level of {TARGET_CLIENTS} clients"
        name = f"{TARGET_CLIENTS} one-sentence clients / one bulk client, {protocol}"
        found.append(target(name, ratio(per_s, bulk), ">=", TARGET_RATIO, detail))
        idle_name = f"CPU idle share under {TARGET_CLIENTS} {protocol} clients"
        found.append(target(idle_name, idle, "<=", TARGET_IDLE, "the whole machine, idle + iowait over all"))
    return found


def markdown(result: dict[str, Any] | None) -> list[str]:
    """The section's paragraph and one table per protocol."""
    if result is None:
        return []
    sweep, roles = result["sweep"], result["roles"]
    lines = [
        "",
        "## Many one-sentence clients",
        "",
        f"The same default server, over ZeroMQ and over HTTP: 1 to {max(sweep['levels'])} clients at once, each "
        f"with its own connection sending one sentence at a time, spread over at most {sweep['processes']} "
        f"processes (threads within), so that no one process's GIL caps the load. Each level: {sweep['warmup_s']:g} s "
        f"of warm-up, then a window of {sweep['seconds']:g} s. CPU in cores (CPU seconds per second) over the "
        f"window; idle: the whole machine's share. One bulk client: requests of {sweep['bulk_size']:,} of the "
        f"same sentences, {sweep['bulk_repeats']} before and {sweep['bulk_repeats']} after each protocol's levels.",
    ]
    columns = [*roles, CLIENTS, REST]
    for protocol, found in result["protocols"].items():
        runs = ", ".join(f"{r:.0f}" for r in found["bulk_runs"])
        lines += ["", f"{protocol}: one bulk client {found['bulk_per_s']:.0f} sentences/s (median of {runs}).", ""]
        lines.append(
            "| clients | processes | sentences/s | / bulk | p50 ms | p99 ms | failed | idle | worker busy | "
            + " | ".join(columns)
            + " |"
        )
        lines.append("| ---: " * (9 + len(columns)) + "|")
        for row in found["levels"]:
            cores = [f"{row['cpu_cores'].get(c, math.nan):.2f}" for c in columns]
            lines.append(
                f"| {row['clients']} | {row['processes']} | {row['per_s']:.0f} | "
                f"{ratio(row['per_s'], found['bulk_per_s']):.2f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | "
                f"{row['failed']} | {row['idle_share']:.0%} | {row['worker_busy']:.2f} | " + " | ".join(cores) + " |"
            )
    return lines


def _child() -> int:
    """One client process: its spec on stdin's first line; its clients connect and send one
    request each, then it prints ``ready``; the second line says when to stop; at the end, the
    (end, seconds) of every request and the failures as JSON on stdout."""
    spec = json.loads(sys.stdin.readline())
    doors, texts, first, count = Doors.of(spec["doors"]), spec["texts"], spec["first"], spec["threads"]
    records: list[list[tuple[float, float]]] = [[] for _ in range(count)]
    failed = [0] * count
    ready, go, stop_at = threading.Barrier(count + 1), threading.Event(), [math.inf]

    def client(i: int) -> None:
        place = (first + i) * 7919  # a different sentence order for every client
        with connected(spec["protocol"], doors) as encode:
            encode([texts[place % len(texts)]])
            ready.wait(READY_TIMEOUT_S)
            go.wait(READY_TIMEOUT_S)
            while (started := time.monotonic()) < stop_at[0]:
                place += 1
                try:
                    encode([texts[place % len(texts)]])
                except Exception:  # a refusal or a timeout: counted, and the client goes on
                    failed[i] += 1
                    continue
                ended = time.monotonic()
                records[i].append((ended, ended - started))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    ready.wait(READY_TIMEOUT_S)
    print("ready", flush=True)
    stop_at[0] = json.loads(sys.stdin.readline())["stop_at"]
    go.set()
    for thread in threads:
        thread.join()
    print(json.dumps({"records": [r for rows in records for r in rows], "failed": sum(failed)}))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
