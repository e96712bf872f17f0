"""``server/serving/sink/owed.py``: the errors owed to clients whose replies were dropped, bounded in
count (per client, per key and in all) and in what each payment costs."""

from __future__ import annotations

from typing import Any

from bertserve.client import protocol as p
from bertserve.server.serving.protocol import formats
from bertserve.server.serving.sink import owed
from bertserve.server.serving.sink.owed import Owed


def reply(client: bytes, request_id: int) -> list[Any]:
    return p.encode_reply(client, request_id, True, {}, b"vectors")


def paid(book: Owed, *, room: set[bytes] | None = None) -> list[p.Reply]:
    """One payment; ``room``: the clients whose connections take a message (None: all)."""
    sent: list[p.Reply] = []

    def send(frames: list[Any]) -> bool:
        if room is not None and bytes(frames[0]) not in room:
            return False
        sent.append(p.decode_reply(frames))
        return True

    book.pay(send, now=0.0)
    return sent


def test_each_dropped_reply_becomes_one_error_naming_why_in_order() -> None:
    book = Owed()
    for request_id in (3, 1, 2):
        book.add(reply(b"c", request_id), formats.NATIVE, "it did not read", now=0.0)
    errors = paid(book)
    assert [e.request_id for e in errors] == [3, 1, 2] and book.count == 0
    assert all(not e.ok and e.header["kind"] == p.DROPPED and "it did not read" in e.header["error"] for e in errors)


def test_a_full_connection_keeps_its_errors_for_a_later_payment() -> None:
    book = Owed()
    book.add(reply(b"full", 1), formats.NATIVE, "why", now=0.0)
    book.add(reply(b"free", 2), formats.NATIVE, "why", now=0.0)
    assert [e.client_id for e in paid(book, room={b"free"})] == [b"free"]
    assert book.count == 1 and [e.request_id for e in paid(book)] == [1]


def test_legacy_replies_are_told_in_the_legacy_layout() -> None:
    book = Owed()
    frames = formats.LEGACY.error(b"old", 7, "x", "input")
    book.add(frames, formats.LEGACY, "why", now=0.0)
    sent: list[list[Any]] = []
    book.pay(lambda f: sent.append(f) or True, now=0.0)
    assert len(sent) == 1 and bytes(sent[0][-1]) == b"7"


def test_one_key_cannot_push_out_another_keys_errors() -> None:
    book = Owed(key_of=lambda client: client.split(b":")[0])
    book.add(reply(b"victim:1", 1), formats.NATIVE, "why", now=0.0)
    for i in range(owed.MAX_OWED + 100):
        book.add(reply(b"attacker:%d" % i, i), formats.NATIVE, "why", now=0.0)
    assert book.count == owed.MAX_PER_KEY + 1
    victims = [e for e in paid_all(book) if e.client_id == b"victim:1"]
    assert len(victims) == 1


def paid_all(book: Owed) -> list[p.Reply]:
    sent: list[p.Reply] = []
    while book.count:
        sent += paid(book)
    return sent


def test_one_payment_tries_a_bounded_number_of_clients_and_the_rest_get_their_turn() -> None:
    book = Owed()
    for i in range(owed.CLIENTS_PER_PAY * 3):
        book.add(reply(b"client-%d" % i, i), formats.NATIVE, "why", now=0.0)
    tried: list[bytes] = []
    book.pay(lambda frames: tried.append(bytes(frames[0])) is None and False, now=0.0)  # nobody has room
    assert len(tried) == owed.CLIENTS_PER_PAY
    assert len(paid(book)) == owed.CLIENTS_PER_PAY
    assert b"client-0" not in [e.client_id for e in paid(book)], "those tried last go to the back"


def test_errors_past_their_time_are_forgotten_unsent() -> None:
    book = Owed()
    book.add(reply(b"c", 1), formats.NATIVE, "why", now=0.0)
    sent: list[Any] = []
    book.pay(lambda f: sent.append(f) or True, now=owed.TTL_S + 1)
    assert sent == [] and book.count == 0
