"""How the scheduler batches: the size of a job, how long a merged job waits for company, and
how bulk requests are planned. The scheduler takes these values, not the server's whole config.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Batching:
    """The scheduler's batching options (their flags' names), checked when built."""

    max_batch_size: int = 256  # a request this large is bulk; most inputs in one job
    max_batch_tokens: int = 4096  # most padded tokens in one bulk job
    max_latency_ms: float = 10.0  # how long a merged job for a busy worker waits for company
    merge_requests: bool = True  # small requests of different clients share one job
    bulk_run_ms: float = 250.0  # while small jobs are about, a long job's model runs take about this long
    bulk_slowdown: float = 4.0  # a bulk request that would take more than this times its idle-server time: busy
    model_batch_size: int = 64  # the model's own run (its ``batch_size`` option)

    def __post_init__(self) -> None:
        checks = [
            (self.max_batch_size >= 1, "max_batch_size must be at least 1"),
            (self.max_batch_tokens >= 1, "max_batch_tokens must be at least 1"),
            (self.max_latency_ms >= 0, "max_latency_ms must not be negative"),
            (self.bulk_run_ms >= 0, f"--bulk-run-ms must be 0 or more, not {self.bulk_run_ms}"),
            (self.bulk_slowdown >= 0, f"--bulk-slowdown must be 0 or more, not {self.bulk_slowdown}"),
        ]
        for ok, problem in checks:
            if not ok:
                raise ConfigError(problem)

    @property
    def model_run(self) -> int:
        """Inputs in one model run: the model's ``batch_size``, at most ``max_batch_size``."""
        return min(self.model_batch_size, self.max_batch_size)
