"""The worker processes of one machine and the devices they run on: how many, what each holds,
how each is watched, restarted and stopped. ``bertserve start`` and ``bertserve worker``
(:class:`..serving.remote.config.HostConfig`) share them."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .stopping import STOP_TIMEOUT_SECONDS, StopBudget

HEARTBEAT_INTERVAL_MS = 1000
"""How often a worker tells the ventilator it is alive."""


@dataclass(frozen=True, kw_only=True)
class Workers:
    """The workers and their devices (their flags' names), checked when built."""

    num_worker: int = 1  # local worker processes; each model's own unless its --model says
    prefetch_size: int = 1  # jobs a worker holds at once: its credits
    cpu: bool = False
    device_map: tuple[int, ...] = ()
    gpu_memory_fraction: float | None = None
    threads_per_worker: int | None = None  # None: the cores shared out
    worker_nice: int = 5
    feed: str = "thread"
    job_timeout_ms: int = 120_000
    heartbeat_timeout_ms: int = 10_000
    max_restarts: int = 5
    stop_timeout: float = STOP_TIMEOUT_SECONDS  # the whole stop, from the signal to the exit (.stopping)

    def __post_init__(self) -> None:
        checks = [
            (self.prefetch_size >= 1, "prefetch_size must be at least 1"),
            (self.job_timeout_ms >= 100, "job_timeout_ms must be at least 100"),
            (
                self.heartbeat_timeout_ms >= 3 * HEARTBEAT_INTERVAL_MS,
                f"heartbeat_timeout_ms must be at least {3 * HEARTBEAT_INTERVAL_MS} (three heartbeats)",
            ),
            (self.max_restarts >= 1, "max_restarts must be at least 1"),
            (
                self.gpu_memory_fraction is None or 0 < self.gpu_memory_fraction <= 1,
                "gpu_memory_fraction must be in (0, 1]",
            ),
            (self.threads_per_worker is None or self.threads_per_worker >= 1, "threads_per_worker must be >= 1"),
            (0 <= self.worker_nice <= 19, "worker_nice must be between 0 and 19"),
            (self.feed in ("thread", "tfdata"), "feed must be thread or tfdata"),
        ]
        for ok, problem in checks:
            if not ok:
                raise ConfigError(problem)
        StopBudget(self.stop_timeout)
        object.__setattr__(self, "device_map", tuple(int(d) for d in self.device_map))

    @property
    def stop_budget(self) -> StopBudget:
        """The whole stop and its stages' shares (:class:`.stopping.StopBudget`)."""
        return StopBudget(self.stop_timeout)
