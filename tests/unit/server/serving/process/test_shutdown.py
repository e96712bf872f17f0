"""What the head says as it begins to stop, and how the stop budget is shared out."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
from bertserve.server.config.stopping import STOP_TIMEOUT_SECONDS, StopBudget
from bertserve.server.errors import ConfigError
from bertserve.server.serving.process import shutdown
from bertserve.server.serving.process.shutdown import stopping_message

PLAN = StopBudget(8).plan(100.0)


def test_a_ctrl_c_says_how_many_requests_are_in_flight_how_long_they_get_and_how_not_to_wait() -> None:
    said = "stopping: 3 requests in flight; they get 6.0 s to finish; Ctrl-C again to stop now"
    assert stopping_message(3, signal.SIGINT, PLAN) == said
    assert stopping_message(1, signal.SIGINT, PLAN).startswith("stopping: 1 request in flight;")
    assert stopping_message(0, signal.SIGINT, PLAN) == "stopping: no requests in flight"


def test_sigterm_and_a_client_stop_say_how_long_requests_get() -> None:
    assert stopping_message(2, signal.SIGTERM, PLAN) == "stopping: 2 requests in flight; they get 6.0 s to finish"
    assert stopping_message(2, None, StopBudget(30).plan(0)).endswith("they get 27.0 s to finish")


def test_what_did_not_finish_is_it_or_them(caplog) -> None:  # type: ignore[no-untyped-def]
    flags = SimpleNamespace(force_exit=False)
    plan = StopBudget(0.02).plan(0.0)  # long over: the drain ends at once
    for count, said in (
        (1, "1 request did not finish in 0.0 s; failing it"),
        (3, "3 requests did not finish in 0.0 s; failing them"),
    ):
        ventilator = SimpleNamespace(idle=False, in_flight=count, poll_once=lambda ms: None)
        caplog.clear()
        with caplog.at_level("WARNING", logger="bertserve"):
            shutdown._drain(ventilator, flags, plan)  # type: ignore[arg-type]
        assert [r.getMessage() for r in caplog.records] == [said]


@pytest.mark.parametrize("seconds", [0.05, 0.5, 1, 2, 5, STOP_TIMEOUT_SECONDS, 10, 30, 600, 3600])
def test_every_stage_ends_in_order_within_the_budget(seconds: float) -> None:
    budget = StopBudget(seconds)
    plan = budget.plan(1000.0)
    assert plan.began < plan.drain_until < plan.workers_until < plan.sink_until < plan.end < 1000.0 + seconds
    assert plan.drain_until - plan.began >= seconds / 2 - 1e-9  # what is in flight gets most of it
    assert plan.end - plan.drain_until >= min(1.0, seconds / 2) * 0.75  # time left to tell every caller


def test_the_default_fits_dockers_default_grace_with_room_to_spare() -> None:
    assert STOP_TIMEOUT_SECONDS <= 8
    assert StopBudget().plan(0).end < 8


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), 3601, "8", True, None])
def test_a_budget_that_is_no_duration_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ConfigError, match="stop_timeout"):
        StopBudget(bad)  # type: ignore[arg-type]
