"""``client/core/window.py``: the places of a connection's unanswered requests, with the clock passed in."""

from __future__ import annotations

from bertserve.client.core.window import ABANDONED_GRACE_S, DEFAULT_SIZE, MAX_SIZE, ReplyWindow, window_size


def test_the_size_is_the_servers_reply_hwm_within_bounds() -> None:
    assert window_size({"reply_hwm": 7}) == 7
    assert window_size({"reply_hwm": 10**9}) == MAX_SIZE
    for bad in ({}, {"reply_hwm": 0}, {"reply_hwm": -3}, {"reply_hwm": True}, {"reply_hwm": "50"}, {"reply_hwm": 2.5}):
        assert window_size(bad) == DEFAULT_SIZE, bad


def test_a_request_holds_its_place_until_its_reply_comes() -> None:
    window = ReplyWindow(2)
    window.sent(1)
    window.reserve()
    assert not window.has_room(0.0)
    window.sent(2, reserved=True)
    assert len(window) == 2 and not window.has_room(0.0)
    assert window.answered(1) and window.has_room(0.0)
    assert not window.answered(1), "a second reply to one request frees nothing more"
    assert not window.answered(99), "a reply to a request never sent frees nothing"


def test_a_request_given_up_on_keeps_its_place_until_its_reply_or_its_grace_runs_out() -> None:
    window = ReplyWindow(1)
    window.sent(1)
    window.abandoned(1, now=100.0)
    assert not window.has_room(100.0 + ABANDONED_GRACE_S - 1)
    assert window.has_room(100.0 + ABANDONED_GRACE_S + 1)
    window.sent(2)
    window.abandoned(2, now=0.0)
    assert window.answered(2) and window.has_room(0.0)


def test_abandoning_an_answered_request_takes_no_place() -> None:
    window = ReplyWindow(1)
    window.sent(1)
    window.answered(1)
    window.abandoned(1, now=0.0)
    assert len(window) == 0
