"""What the head says as it begins to stop."""

from __future__ import annotations

import signal

from bertserve.server.serving.process.shutdown import stopping_message


def test_a_ctrl_c_says_how_many_requests_are_in_flight_and_how_not_to_wait() -> None:
    assert stopping_message(3, signal.SIGINT) == "stopping: 3 requests in flight; Ctrl-C again to stop now"
    assert stopping_message(1, signal.SIGINT) == "stopping: 1 request in flight; Ctrl-C again to stop now"
    assert stopping_message(0, signal.SIGINT) == "stopping: no requests in flight"


def test_sigterm_and_a_client_stop_say_how_long_requests_get() -> None:
    assert stopping_message(2, signal.SIGTERM) == "stopping: 2 requests in flight; they get 10 s to finish"
    assert stopping_message(2, None) == "stopping: 2 requests in flight; they get 10 s to finish"


def test_what_did_not_finish_is_it_or_them(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from bertserve.server.serving.process import shutdown

    monkeypatch.setattr(shutdown, "DRAIN_SECONDS", 0.01)
    flags = SimpleNamespace(force_exit=False)
    for count, said in (
        (1, "1 request did not finish in 0 s; failing it"),
        (3, "3 requests did not finish in 0 s; failing them"),
    ):
        ventilator = SimpleNamespace(idle=False, in_flight=count, poll_once=lambda ms: None)
        caplog.clear()
        with caplog.at_level("WARNING", logger="bertserve"):
            shutdown._drain(ventilator, flags)  # type: ignore[arg-type]
        assert [r.getMessage() for r in caplog.records] == [said]
