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
