"""``bertserve status``'s summary of a STATUS answer, and of one from another version that
lacks fields (or holds odd ones): always a summary, never a crash."""

from __future__ import annotations

from bertserve.client.status_text import status_summary, uptime


def test_a_status_in_a_few_lines() -> None:
    status = {
        "server_version": "0.1.0",
        "ready": True,
        "uptime_s": 7500.2,
        "requests_served": 12345,
        "requests_failed": 2,
        "requests_rejected": 1,
        "queued_sentences": 40,
        "workers": [{"state": "busy", "remote": False}, {"state": "idle", "remote": True}],
        "models": {"a": {"default": True, "ready": True, "workers": 2, "jobs_in_flight": 1, "queued_sentences": 40}},
    }
    text = status_summary(status)
    assert text.splitlines()[:2] == [
        "bertserve 0.1.0, ready, up 2 h 5 min",
        "requests: 12,345 served, 2 failed, ? expired, ? cancelled, 1 refused, ? in flight",
    ]
    assert "workers: 2 (1 busy, 1 remote)" in text
    assert "model a (default): ready, 2 workers, 1 jobs in flight, 40 sentences queued" in text


def test_a_status_missing_or_holding_odd_fields_still_reads() -> None:
    text = status_summary({"models": {"x": "not a mapping"}, "workers": ["odd"], "uptime_s": "soon", "ready": False})
    assert text.startswith("bertserve ?, not ready, up 0 s") and "workers: 0 (0 busy, 0 remote)" in text
    for odd in ({"models": ["a list"], "workers": {"a": "mapping"}}, {"models": 7, "workers": "text"}):
        assert "workers: 0 (0 busy, 0 remote)" in status_summary(odd)  # a peer of another shape: read, not raised


def test_uptime_reads_at_every_scale() -> None:
    assert [uptime(s) for s in (5, 725, 7500, 200000)] == ["5 s", "12 min 5 s", "2 h 5 min", "2 d 7 h"]
