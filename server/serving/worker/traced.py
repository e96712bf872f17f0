"""A worker's spans of a job: tokenizing it and running the model, once for each traced
request whose rows the job carries (:func:`...tracing.record`), parented by the head's span of
that request, whose traceparent rides in the job's parts."""

from __future__ import annotations

import time
from typing import Any

from ... import tracing


def traces_of(parts: Any) -> list[str]:
    """The traceparents of a job's parts (each checked: a malformed one is not followed)."""
    if not tracing.enabled() or not isinstance(parts, list):
        return []
    found = (tracing.checked_traceparent(part.get("trace")) for part in parts if isinstance(part, dict))
    return [trace for trace in found if trace is not None]


def now_if_tracing() -> int | None:
    """``time.time_ns()`` while this process traces (a step's start), else None."""
    return time.time_ns() if tracing.enabled() else None


class JobTimes:
    """When a traced job's steps began and ended (``time.time_ns()``)."""

    def __init__(self, header: dict[str, Any]) -> None:
        self.traces = traces_of(header.get("parts"))
        self.start_ns = time.time_ns()
        tokenized = header.get("tokenized_ns")
        self.tokenized = tuple(tokenized) if isinstance(tokenized, list) and len(tokenized) == 2 else None
        self.run: tuple[int, int] | None = None

    def ran(self, start_ns: int) -> None:
        self.run = (start_ns, time.time_ns())

    def record(self, worker: Any, job_id: bytes, ids: Any, slots: int, error: str | None) -> None:
        """The job's span and its steps', in the trace of each request it served: the model,
        the job's rows, their padded length and the token slots the model runs took."""
        if not self.traces:
            return
        attributes = {
            "bertserve.job": job_id.decode(errors="replace"),
            "bertserve.worker": worker.index,
            "bertserve.batch_size": len(ids),
            "bertserve.padded_length": int(ids.shape[1]) if getattr(ids, "ndim", 0) == 2 else 0,
            "bertserve.token_slots": int(slots),
        }
        if worker.config.serving.served_model_name:
            attributes["bertserve.model"] = worker.config.serving.served_model_name
        steps = []
        if self.tokenized is not None:
            steps.append(tracing.Step("bertserve.worker.tokenize", *self.tokenized))
        if self.run is not None:
            steps.append(tracing.Step("bertserve.worker.model_run", *self.run))  # the job's span has the attributes
        start = min([self.start_ns, *(step.start_ns for step in steps)])
        tracing.record("bertserve.worker.job", self.traces, start, time.time_ns(), attributes, steps, error)
