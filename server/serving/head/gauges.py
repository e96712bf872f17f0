"""The head's gauges for ``/metrics``: queue depths, requests in flight, workers, readiness
and the models served, each labelled with its name. Read from their owners; nothing here is
kept but which models' labels are set."""

from __future__ import annotations

from ... import metrics
from .models import HeadModel, Models
from .registry import Registry


class HeadGauges:
    def __init__(self) -> None:
        self._labelled: set[str] = set()  # the models whose info labels are set

    def model_changed(self, name: str) -> None:
        """Model ``name`` is served in a new version: its labels are set again at the next update."""
        metrics.MODEL.clear()
        self._labelled.clear()

    def update(self, models: Models, registry: Registry, *, in_flight: int, queued_bytes: int, ready: bool) -> None:
        for model in models:
            self._update_model(model, registry)
        metrics.RUNNING_JOBS.set(registry.in_flight)
        workers = registry.workers.values()
        slots = sum(w.slots for w in workers)
        metrics.PADDING.set(1 - sum(w.tokens for w in workers) / slots if slots else 0.0)
        metrics.IN_FLIGHT.set(in_flight)
        metrics.QUEUED_BYTES.set(queued_bytes)
        metrics.WORKERS.set(len(registry))
        metrics.READY.set(1 if ready else 0)

    def _update_model(self, model: HeadModel, registry: Registry) -> None:
        name, scheduler = model.name, model.scheduler
        stats = scheduler.stats()
        small = stats["queued_small_sentences"]
        retries = sum(job.size for job in scheduler.retries)
        metrics.QUEUED.labels("small", name).set(small)
        metrics.QUEUED.labels("retry", name).set(retries)
        metrics.QUEUED.labels("bulk", name).set(max(0, stats["queued_sentences"] - small - retries))
        metrics.QUEUED_REQUESTS.labels("small", name).set(stats["queued_small_requests"])
        metrics.QUEUED_REQUESTS.labels("bulk", name).set(stats["queued_bulk_requests"])
        metrics.MODEL_WORKERS.labels(name).set(registry.serving_count(name))
        info = registry.model_info(name, model.version)
        if info and name not in self._labelled:
            self._labelled.add(name)
            metrics.MODEL.labels(
                model=name,
                model_dir=model.model_dir,
                dtype=str(info.get("dtype")),
                pooling_strategy=str(info.get("pooling_strategy")),
                output_dim=str(info.get("output_dim")),
                max_seq_len=str(info.get("max_seq_len")),
            ).set(1)
