"""Resident memory of a server and every process it started: one sampler, and one-off reads.

:class:`RssSampler` reads the RSS of each process of a server's family every ``interval``
seconds in a thread of its own. What the scenarios ask of it:

- the summed RSS over time (``samples``: the soak's curve, the swap's steady state and peak);
- the peaks before and after the server's ready line (the suite's startup and serving peaks);
- each process's first reading, its peak and when it first appeared (the growth of each
  process under a flood; the peak of a worker that a swap started).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psutil

from lib.stats import median

MIB = 2**20


class Family(Protocol):
    """What is read of a server (a ``RunningServer``): the processes it is and started, and
    whether it has printed its ready line."""

    process: Any  # the server's own process, by its ``pid``
    ready: threading.Event

    def family(self) -> list[psutil.Process]: ...


def family_rss(server: Family) -> dict[int, float]:
    """RSS in MiB of the server and each process it started, by pid."""
    rss = {}
    for process in server.family():
        try:
            rss[process.pid] = process.memory_info().rss / MIB
        except psutil.Error:  # exited between listing and reading
            continue
    return rss


def family_pss(server: Family) -> dict[int, float]:
    """Proportional set size in MiB of the server and each process it started, by pid: a page
    shared by n processes counts 1/n in each, so the sum is what the family really holds."""
    pss = {}
    for process in server.family():
        try:
            pss[process.pid] = process.memory_full_info().pss / MIB
        except (psutil.Error, AttributeError):  # exited, or no PSS on this platform
            continue
    return pss


def max_rss_mib(pids: Iterable[int]) -> float:
    """The largest RSS in MiB of the processes ``pids`` (all alive)."""
    return max(psutil.Process(pid).memory_info().rss for pid in pids) / MIB


def largest_child_mib(server: Family) -> float:
    """The largest RSS of the processes the server started: a worker's (a sink is far smaller)."""
    return max(mib for pid, mib in family_rss(server).items() if pid != server.process.pid)


def settled_rss(server: Family, samples: int = 5, interval: float = 0.5) -> float:
    """The family's RSS once it has settled: the median of ``samples`` reads after 2 s."""
    time.sleep(2.0)
    values = []
    for _ in range(samples):
        values.append(sum(family_rss(server).values()))
        time.sleep(interval)
    return median(values)


def settled_rss_by_pid(
    servers: Sequence[Family], samples: int = 5, interval: float = 0.5, wait: float = 2.0
) -> list[dict[int, float]]:
    """Each server's RSS by pid once it has settled: per process, the median of ``samples``
    reads after ``wait`` seconds; the servers are read in the same turns, so they settle alike."""
    time.sleep(wait)
    reads: list[dict[int, list[float]]] = [{} for _ in servers]
    for turn in range(samples):
        for server, by_pid in zip(servers, reads, strict=True):
            for pid, mib in family_rss(server).items():
                by_pid.setdefault(pid, []).append(mib)
        if turn < samples - 1:
            time.sleep(interval)
    return [{pid: median(values) for pid, values in by_pid.items()} for by_pid in reads]


@dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic()
    total_mib: float  # the whole family; 0 once the server is gone
    ready: bool  # the server had printed its ready line
    children: int | None  # the processes the server started itself, if counted


class RssSampler:
    """Samples a server family's RSS every ``interval`` seconds, from :meth:`start` (which
    takes the first sample at once) to :meth:`stop`; also a context manager.

    ``count_children`` also counts, in each sample, the processes the server started itself
    (not their own short-lived children).
    """

    def __init__(self, server: Family, interval: float, *, count_children: bool = False) -> None:
        self.server, self.interval, self.count_children = server, interval, count_children
        self.samples: list[Sample] = []  # appended by the thread only
        self.initial_by_pid: dict[int, float] = {}  # the first sample's
        self.peak_by_pid: dict[int, float] = {}
        self.first_seen: dict[int, float] = {}  # pid -> time.monotonic() of its first sample
        self._serving_from = 0  # index of the first sample of the current serving peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{server.process.pid}", daemon=True)

    def start(self) -> RssSampler:
        self._sample()
        self.initial_by_pid = dict(self.peak_by_pid)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def __enter__(self) -> RssSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        now, ready = time.monotonic(), self.server.ready.is_set()
        by_pid = family_rss(self.server)
        for pid, mib in by_pid.items():
            self.first_seen.setdefault(pid, now)
            self.peak_by_pid[pid] = max(mib, self.peak_by_pid.get(pid, 0.0))
        children = None
        if self.count_children:
            try:
                children = len(psutil.Process(self.server.process.pid).children())
            except psutil.Error:  # the server is gone
                children = 0
        self.samples.append(Sample(now, sum(by_pid.values()), ready, children))

    def latest_mib(self) -> float:
        return self.samples[-1].total_mib if self.samples else float("nan")

    @property
    def peak_mib(self) -> float:
        return max((s.total_mib for s in self.samples), default=float("nan"))

    @property
    def startup_peak_mib(self) -> float:
        """The largest summed RSS before the ready line (0 if none was sampled)."""
        return max((s.total_mib for s in self.samples if not s.ready), default=0.0)

    @property
    def serving_peak_mib(self) -> float:
        """The largest summed RSS after the ready line, since :meth:`reset_serving_peak`."""
        return max((s.total_mib for s in self.samples[self._serving_from :] if s.ready), default=0.0)

    def reset_serving_peak(self) -> None:
        """Start a new serving peak, e.g. for one point of a sweep."""
        self._serving_from = len(self.samples)

    def between(self, start: float, end: float) -> list[Sample]:
        """The samples taken from ``start`` to ``end`` (``time.monotonic()``)."""
        return [s for s in self.samples if start <= s.at <= end]

    def growth_by_process(self, workers: Iterable[int]) -> dict[str, float]:
        """Each process's peak over its RSS at :meth:`start` (0 if it came later), named by role."""
        roles = {self.server.process.pid: "server"} | {pid: f"worker pid {pid}" for pid in workers}
        return {
            roles.get(pid, f"pid {pid} (sink or helper)"): round(peak - self.initial_by_pid.get(pid, 0.0), 1)
            for pid, peak in sorted(self.peak_by_pid.items())
        }
