"""A server that runs while the client's ``port_out`` is wrong: the handshake's decisions,
with a stand-in for ``client/reply_port.py``'s check and the clock passed in, and the words
of the error for each reader. (The real check, against real servers, is in
tests/integration/test_wrong_port.py.)"""

from __future__ import annotations

from typing import cast

import pytest
from bertserve.client.advice import PYTHON, Advice
from bertserve.client.core.handshake import Handshake
from bertserve.client.errors import NoServerError, WrongPortError, WrongReplyPortError
from bertserve.client.reply_port import ReplyPortCheck

ADDRESS = "tcp://127.0.0.1:5555"
AT_REPLY_PORT = WrongPortError(
    "tcp://127.0.0.1:6000 is not a bertserve reply port: ...", address="tcp://127.0.0.1:6000"
)
CLI = Advice(
    chunk="pass --long-inputs chunk",
    silence_length=None,
    silence_version=None,
    max_seq_len="--max-seq-len",
    server_elsewhere="pass its --host and --port",
)


class StandIn:
    """What a ``ReplyPortCheck`` says: ``verdict`` once sure, ``final`` at the deadline."""

    def __init__(self, verdict: str | None = None, final: str | None = None, deciding: bool = True) -> None:
        self.verdict, self._final, self.deciding = verdict, final, deciding
        self.waited: list[float] = []

    def look(self, waited_s: float) -> str | None:
        self.waited.append(waited_s)
        return self.verdict

    def final(self) -> str | None:
        return self._final


def _handshake(port_out: int = 6000) -> Handshake:
    return Handshake(None, address=ADDRESS, port_out=port_out, timeout_ms=1000, now=100.0)


def _check(stand_in: StandIn) -> ReplyPortCheck:
    return cast(ReplyPortCheck, stand_in)


def test_a_verdict_on_the_reply_port_ends_the_handshake_with_the_server_named() -> None:
    check = StandIn(verdict="nothing listens there")
    with pytest.raises(WrongReplyPortError) as info:
        _handshake().unanswered(102.5, None, lambda _: False, _check(check))
    error = info.value
    assert isinstance(error, NoServerError) and isinstance(error, WrongPortError) and not error.refused
    assert check.waited == pytest.approx([2.5])
    assert str(error) == (
        "the bertserve server at tcp://127.0.0.1:5555 is running, but port_out 6000 is not its reply port: "
        "nothing listens there. Set port_out to the server's reply port, which its ready line names (\"results "
        'on port N"): by default port + 1 (5556)'
    )
    assert error.advise(CLI) == (
        "the bertserve server at tcp://127.0.0.1:5555 is running, but --port-out 6000 is not its reply port: "
        "nothing listens there. Set --port-out to the server's reply port, which its ready line names (\"results "
        'on port N"): by default --port + 1 (5556)'
    )
    assert "bertserve start" not in str(error)


def test_port_out_at_the_default_says_the_server_chose_another() -> None:
    with pytest.raises(WrongReplyPortError) as info:
        _handshake(port_out=5556).unanswered(102.5, None, lambda _: False, _check(StandIn(verdict="x")))
    assert str(info.value).endswith(": port + 1 by default, another since the server was started with --port-out")


def test_what_answers_at_the_reply_port_waits_for_the_check_while_it_decides() -> None:
    handshake = _handshake()
    handshake.unanswered(100.5, AT_REPLY_PORT, lambda _: False, _check(StandIn()))  # deciding: go on
    with pytest.raises(WrongPortError) as info:  # no server at the request port: said as it was
        handshake.unanswered(100.7, AT_REPLY_PORT, lambda _: False, _check(StandIn(deciding=False)))
    assert info.value is AT_REPLY_PORT
    at_request_port = WrongPortError("...", address=ADDRESS)
    with pytest.raises(WrongPortError) as info:
        handshake.unanswered(100.5, at_request_port, lambda _: False, _check(StandIn()))
    assert info.value is at_request_port


def test_at_the_deadline_what_the_check_saw_comes_before_a_timeout() -> None:
    handshake = _handshake()
    with pytest.raises(WrongReplyPortError, match="is running, but port_out 6000 is not its reply port: so far"):
        handshake.wait_until(101.0, lambda: None, _check(StandIn(final="so far")))
    with pytest.raises(WrongReplyPortError):
        handshake.wait_until(101.0, lambda: AT_REPLY_PORT, _check(StandIn(final="so far")))
    with pytest.raises(NoServerError) as info:  # no verdict: nobody answered, as before
        handshake.wait_until(101.0, lambda: None, _check(StandIn()))
    assert type(info.value) is NoServerError


def test_the_python_api_names_its_keyword_and_a_command_its_flag() -> None:
    assert PYTHON.option("port_out") == "port_out" and CLI.option("port_out") == "--port-out"
    told = Advice(chunk="", silence_length=None, silence_version=None, max_seq_len="x", server_elsewhere="", flags=True)
    assert told.option("port_out") == "--port-out"  # said, not inferred


def test_the_check_opens_nothing_before_it_is_asked_and_closes_twice() -> None:
    check = ReplyPortCheck("127.0.0.1", ADDRESS, "tcp://127.0.0.1:6000")
    assert check.look(0.1) is None and check.deciding
    check.close()
    check.close()
    assert not check.deciding and check.look(5.0) is None
