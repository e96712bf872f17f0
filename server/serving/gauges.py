"""The head's gauges for ``/metrics``: queue depths, requests in flight, workers, readiness
and the model served. Read from their owners; nothing here is kept but whether the model's
labels are set."""

from __future__ import annotations

from .. import metrics
from ..config import ServerConfig
from .registry import Registry
from .scheduler import Scheduler


class HeadGauges:
    def __init__(self) -> None:
        self._model_labelled = False

    def model_changed(self) -> None:
        """A new model version is served: its labels replace the old ones at the next update."""
        metrics.MODEL.clear()
        self._model_labelled = False

    def update(
        self, config: ServerConfig, scheduler: Scheduler, registry: Registry, *, in_flight: int, queued_bytes: int,
        ready: bool,
    ) -> None:  # fmt: skip
        stats = scheduler.stats()
        small = stats["queued_small_sentences"]
        retries = sum(job.size for job in scheduler.retries)
        metrics.QUEUED.labels("small").set(small)
        metrics.QUEUED.labels("retry").set(retries)
        metrics.QUEUED.labels("bulk").set(max(0, stats["queued_sentences"] - small - retries))
        metrics.QUEUED_REQUESTS.labels("small").set(stats["queued_small_requests"])
        metrics.QUEUED_REQUESTS.labels("bulk").set(stats["queued_bulk_requests"])
        metrics.RUNNING_JOBS.set(registry.in_flight)
        workers = registry.workers.values()
        slots = sum(w.slots for w in workers)
        metrics.PADDING.set(1 - sum(w.tokens for w in workers) / slots if slots else 0.0)
        metrics.IN_FLIGHT.set(in_flight)
        metrics.QUEUED_BYTES.set(queued_bytes)
        metrics.WORKERS.set(len(registry))
        metrics.READY.set(1 if ready else 0)
        model = registry.model
        if model and not self._model_labelled:
            self._model_labelled = True
            metrics.MODEL.labels(
                model=config.model.model_dir, dtype=str(model.get("dtype")),
                pooling_strategy=str(model.get("pooling_strategy")), output_dim=str(model.get("output_dim")),
                max_seq_len=str(model.get("max_seq_len")),
            ).set(1)  # fmt: skip
