"""``bertserve status``'s short answer: a server's STATUS in a few lines a person reads at a
glance (``--json`` prints all of it). Every field is read with a default, so a server of
another version, which may lack some, still gets a summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def status_summary(status: Mapping[str, Any]) -> str:
    """The models, workers, queue, requests served and failed, and uptime of ``status``."""
    lines = [
        f"bertserve {status.get('server_version', '?')}, {'ready' if status.get('ready') else 'not ready'}, "
        f"up {uptime(_seconds(status.get('uptime_s')))}",
        "requests: "
        + ", ".join(
            f"{_count(status.get(key))} {word}"
            for key, word in (
                ("requests_served", "served"),
                ("requests_failed", "failed"),
                ("requests_expired", "expired"),
                ("requests_cancelled", "cancelled"),
                ("requests_rejected", "refused"),
                ("requests_in_flight", "in flight"),
            )
        ),
        f"queue: {_count(status.get('queued_sentences'))} sentences "
        f"({_count(status.get('queued_small_requests'))} small requests, "
        f"{_count(status.get('queued_bulk_requests'))} bulk), {_count(status.get('active_clients'))} active clients",
    ]
    listed = status.get("workers")
    workers = [w for w in listed if isinstance(w, Mapping)] if isinstance(listed, list) else []
    busy = sum(1 for w in workers if w.get("state") not in (None, "idle"))
    remote = sum(1 for w in workers if w.get("remote"))
    lines.append(f"workers: {len(workers)} ({busy} busy, {remote} remote)")
    models = status.get("models")
    for name, model in models.items() if isinstance(models, Mapping) else ():
        if not isinstance(model, Mapping):
            continue
        role = " (default)" if model.get("default") else ""
        state = "ready" if model.get("ready") else "not ready"
        lines.append(
            f"model {name}{role}: {state}, {_count(model.get('workers'))} "
            f"{'worker' if model.get('workers') == 1 else 'workers'}, "
            f"{_count(model.get('jobs_in_flight'))} jobs in flight, "
            f"{_count(model.get('queued_sentences'))} sentences queued"
        )
    lines.append("(bertserve status --json prints every figure)")
    return "\n".join(lines)


def uptime(seconds: float) -> str:
    """``45 s``, ``12 min 5 s``, ``3 h 20 min`` or ``2 d 4 h``."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else 0.0


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "?"
