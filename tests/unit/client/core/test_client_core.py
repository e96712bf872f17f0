"""``client/core/``: the sans-IO client core that ``BertClient`` and ``AsyncBertClient`` share,
tested with no sockets and the clock passed in: the handshake's decisions, which reply answers
which request, what an encode call plans, and the errors a wait ends with."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from bertserve.client import protocol as p
from bertserve.client.core.base import ClientCore
from bertserve.client.core.handshake import RESEND_S, Handshake
from bertserve.client.core.options import ClientOptions, EncodeOptions
from bertserve.client.core.replies import ReplyBook
from bertserve.client.core.requests import plan_encode
from bertserve.client.core.window import ABANDONED_GRACE_S
from bertserve.client.errors import (
    AuthenticationError,
    NoServerError,
    ProtocolVersionError,
    ServerTimeoutError,
    UnknownModelError,
)

ADDRESS = "tcp://127.0.0.1:5555"
ME = b"me"


def _options(**overrides: Any) -> ClientOptions:
    given: dict[str, Any] = {
        "timeout": 1000,
        "output_fmt": "ndarray",
        "identity": ME,
        "check_version": True,
        "check_length": True,
        "show_server_config": False,
        "server_key": None,
        "client_cert": None,
        "model": None,
    }
    given.update(overrides)
    host, port, port_out = given.pop("host", "127.0.0.1"), given.pop("port", 5555), given.pop("port_out", None)
    return ClientOptions.checked(host, port, port_out, **given)


def _reply(request_id: int, ok: bool = True, header: dict[str, Any] | None = None, client_id: bytes = ME) -> p.Reply:
    return p.decode_reply(p.encode_reply(client_id, request_id, ok, header or {}))


def _frames(request_id: int, client_id: bytes = ME) -> list[Any]:
    return p.encode_reply(client_id, request_id, True, {})


# -- options -------------------------------------------------------------------------------


def test_client_options_are_checked_in_the_order_the_signature_gives_them() -> None:
    options = _options()
    assert (options.port_out, options.address, options.identity, options.model) == (5556, ADDRESS, ME, None)
    assert _options(host="::1").address == "tcp://[::1]:5555"
    with pytest.raises(ValueError, match="host"):
        _options(host="", port=0)  # the host is named before the port
    with pytest.raises(ValueError, match="port_out defaults to port \\+ 1"):
        _options(port=65535, timeout=-1)
    with pytest.raises(ValueError, match="never waits forever"):
        _options(timeout=float("inf"), output_fmt="csv")


def test_the_core_checks_a_new_timeout() -> None:
    core = ClientCore(_options())
    core.timeout = 250
    assert core.timeout == 250.0
    with pytest.raises(ValueError, match="never waits forever"):
        core.timeout = 0


# -- the handshake ---------------------------------------------------------------------------


def _handshake(now: float = 100.0, model: str | None = None) -> Handshake:
    return Handshake(model, address=ADDRESS, port_out=5556, timeout_ms=1000, now=now)


def test_the_handshake_asks_for_its_models_config_and_asks_again_until_the_deadline() -> None:
    assert _handshake().header == {} and _handshake(model="fast").header == {"model": "fast"}
    handshake = _handshake(now=100.0)
    assert handshake.command == p.CONFIG
    assert handshake.wait_until(100.0, lambda: None) == 100.0 + RESEND_S
    assert handshake.wait_until(100.9, lambda: None) == 101.0  # never past the deadline
    with pytest.raises(NoServerError) as info:
        handshake.wait_until(101.0, lambda: None)
    assert not info.value.refused and "within 1000 ms" in str(info.value)
    refused = AuthenticationError("refused")
    with pytest.raises(AuthenticationError):  # a refused handshake says more than a timeout
        handshake.wait_until(101.0, lambda: refused)


def test_an_unanswered_handshake_gives_up_early_only_when_waiting_cannot_help() -> None:
    handshake = _handshake(now=100.0)
    waited: list[float] = []

    def nobody_listens(seconds: float) -> bool:
        waited.append(seconds)
        return seconds >= 0.7

    handshake.unanswered(100.5, None, nobody_listens)  # something may listen: go on asking
    with pytest.raises(NoServerError) as info:
        handshake.unanswered(100.75, None, nobody_listens)
    assert info.value.refused and waited == pytest.approx([0.5, 0.75])
    with pytest.raises(AuthenticationError):
        handshake.unanswered(100.1, AuthenticationError("refused"), nobody_listens)
    assert len(waited) == 2  # a refusal is said without probing


def test_the_answer_to_the_handshake_is_the_config_or_the_error_it_carries() -> None:
    handshake = _handshake()
    assert handshake.config(_reply(1, header={"output_dim": 4})) == {"output_dim": 4}
    with pytest.raises(ProtocolVersionError, match="does not speak protocol"):
        handshake.config(_reply(1, ok=False, header={"error": "protocol 9", "kind": "protocol"}))
    with pytest.raises(UnknownModelError):
        handshake.config(_reply(1, ok=False, header={"error": "no such model", "kind": "model"}))


def test_the_core_keeps_each_models_config() -> None:
    core = ClientCore(_options(model="fast"))
    handshake = core.handshake(now=0.0)
    assert handshake.header == {"model": "fast"} and handshake.deadline == 1.0
    assert core.connected(handshake, _reply(1, header={"output_dim": 4})) == {"output_dim": 4}
    assert core.config == {"output_dim": 4} and core.known_config("fast") == {"output_dim": 4}
    assert core.known_config(None) is None
    core.learn(None, {"output_dim": 8})
    assert core.known_config(None) == {"output_dim": 8} and core.config == {"output_dim": 4}


# -- requests --------------------------------------------------------------------------------


def test_request_frames_carry_the_client_version_and_respect_the_servers_size() -> None:
    core = ClientCore(_options())
    request = p.decode_request(core.frames(p.ENCODE, 7, {"is_tokenized": False}, ["a b"]))
    assert (request.client_id, request.request_id, request.command) == (ME, 7, p.ENCODE)
    assert "client_version" in request.header
    cancel = p.decode_request(core.cancel_frames(7))
    assert (cancel.command, cancel.request_id) == (p.CANCEL, 7)
    core.learn(None, {"max_message_bytes": 20})
    with pytest.raises(ValueError, match="max_message_bytes"):
        core.frames(p.ENCODE, 8, {}, ["a long text " * 5])


def test_an_encode_plan_warns_answers_empty_inputs_and_cuts_big_ones() -> None:
    config = {"max_seq_len": 3, "output_dim": 4, "max_batch_size": 2}
    options = EncodeOptions()
    plan = plan_encode(
        options, ["one two three four"], config, output_fmt="ndarray", check_length=True, show_progress=False
    )
    assert plan.warning is not None and "texts[0] has 4 words" in plan.warning
    assert plan.empty is None and plan.chunk is None
    quiet = plan_encode(
        options, ["one two three four"], config, output_fmt="list", check_length=False, show_progress=False
    )
    assert quiet.warning is None
    chunked = EncodeOptions(long_inputs="chunk")
    assert (
        plan_encode(chunked, ["a b c d"], config, output_fmt="list", check_length=True, show_progress=False).warning
        is None
    )

    empty = plan_encode(options, [], config, output_fmt="ndarray", check_length=True, show_progress=False)
    assert isinstance(empty.empty, np.ndarray) and empty.empty.shape == (0, 4)
    assert (
        plan_encode(
            options, [], config, output_fmt="list", check_length=True, show_progress=False, blocking=False
        ).empty
        is None
    )

    texts = ["w"] * 9
    assert plan_encode(options, texts, config, output_fmt="list", check_length=True, show_progress=True).chunk == 8
    assert (
        plan_encode(options, texts[:8], config, output_fmt="list", check_length=True, show_progress=True).chunk is None
    )
    with pytest.raises(ValueError, match="more than the model's 4 dimensions"):
        plan_encode(
            EncodeOptions(dimensions=5), texts, config, output_fmt="list", check_length=True, show_progress=False
        )


def test_a_wait_that_runs_out_names_a_refused_handshake_first() -> None:
    core = ClientCore(_options())
    error = core.timeout_error("request 3", None)
    assert isinstance(error, ServerTimeoutError) and error.timeout_ms == 1000
    assert (
        str(error)
        == f"no answer from the bertserve server at {ADDRESS} (replies on port 5556) to request 3 within 1000 ms"
    )
    assert "within 250 ms" in str(core.timeout_error("x", None, 250))
    refused = AuthenticationError("refused")
    assert core.timeout_error("request 3", refused) is refused


# -- which reply answers which request -------------------------------------------------------


def test_the_book_reads_only_well_formed_replies_to_this_client() -> None:
    book: ReplyBook[str] = ReplyBook(ME, ADDRESS)
    assert [book.new_id() for _ in range(3)] == [1, 2, 3]
    book.window.sent(1)
    assert len(book.window) == 1
    assert book.read([b"me", b"1"]) is None  # malformed: logged and ignored
    assert book.read(_frames(1, client_id=b"me-too")) is None  # another client whose id starts with ours
    assert len(book.window) == 1
    reply = book.read(_frames(1))
    assert reply is not None and reply.request_id == 1 and len(book.window) == 0


def test_while_waiting_for_one_request_the_book_holds_the_others_replies() -> None:
    book: ReplyBook[str] = ReplyBook(ME, ADDRESS)
    book.expect(1, "first")
    book.expect(2, "second")
    assert book.match(_reply(2), {1}) is None  # awaited, but not by this wait: held
    assert book.match(_reply(9), {1}) is None  # nobody awaits it: dropped
    assert book.held({9}) is None
    first = book.match(_reply(1), {1})
    assert first is not None and book.take(1) == "first"
    second = book.held({2, 3})
    assert second is not None and second.request_id == 2 and book.held({2}) is None
    assert dict(book.awaited) == {2: "second"}


def test_a_request_given_up_keeps_its_place_until_its_reply_or_its_grace_ends() -> None:
    book: ReplyBook[str] = ReplyBook(ME, ADDRESS)
    book.window.size = 2
    for request_id in (1, 2):
        book.window.sent(request_id)
        book.expect(request_id, "tag")
    book.match(_reply(2), {1})
    book.give_up([1, 2], now=10.0)
    assert not book.awaited and book.held({2}) is None  # the held reply went with it
    assert not book.window.has_room(10.0)
    book.read(_frames(1))  # the late reply to 1 frees its place
    assert book.window.has_room(10.0) and len(book.window) == 1
    assert book.window.has_room(10.0 + ABANDONED_GRACE_S + 1) and len(book.window) == 1


def test_each_reply_is_claimed_by_the_waiter_of_its_request() -> None:
    book: ReplyBook[str] = ReplyBook(ME, ADDRESS)
    book.expect(1, "future 1")
    book.expect(2, "future 2")
    assert book.claim(_reply(2)) == "future 2"
    assert book.claim(_reply(2)) is None  # a second reply to it is dropped
    assert book.clear() == ["future 1"] and not book.awaited


def test_an_input_past_the_request_size_is_split_only_where_one_request_cannot_hold_it() -> None:
    config = {"output_dim": 4, "max_request_size": 50, "max_client_queued_sentences": 100}
    options = EncodeOptions()

    def chunk(count: int, **kwargs: Any) -> int | None:
        texts = ["a b"] * count
        return plan_encode(options, texts, config, output_fmt="ndarray", check_length=False, **kwargs).chunk

    assert chunk(50, show_progress=False) is None  # one request holds it
    assert chunk(51, show_progress=False) == 25  # four in flight fit the client's 100 queued
    assert chunk(51, show_progress=False, blocking=False) is None  # one request id asked for: the server's answer
    assert (
        plan_encode(
            options,
            ["x"] * 51,
            {"output_dim": 4, "max_request_size": 50},
            output_fmt="list",
            check_length=False,
            show_progress=False,
        ).chunk
        == 50
    )  # no queue bound said: the limit
