"""The bert-as-service 1.x adapter, without a server: decoding its messages, and its own
client (``bert-serving-client`` 1.10.0) reading our replies over real ZeroMQ sockets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from bert_serving.client import BertClient as OldClient
from bertserve.client import protocol as p
from bertserve.server.cli import main as cli
from bertserve.server.security import handle_subscription
from bertserve.server.serving.protocol import formats, legacy
from bertserve.server.testing.launcher import free_port

pytestmark = pytest.mark.timeout(30)


def message(identity: bytes, body: bytes, request_id: int = 1, length: int = 0) -> list[bytes]:
    return [identity, body, b"%d" % request_id, b"%d" % length]


# -- recognising and decoding ------------------------------------------------------------


def test_a_four_frame_message_with_numbers_is_legacy_and_ours_is_not() -> None:
    assert legacy.is_legacy(message(b"3f2b-uuid", b'["a"]', 7, 1))
    assert legacy.is_legacy([b"0", legacy.TERMINATION, b"0", b"0"])  # bert-serving-terminate
    ours = p.encode_request(b"client", p.ENCODE, 1, {}, ["a"])
    assert not legacy.is_legacy(ours)
    assert not legacy.is_legacy(ours[:4])
    for bad in (
        [b"", b'["a"]', b"1", b"1"],  # no identity
        [b"x" * 65, b'["a"]', b"1", b"1"],  # an identity past 64 bytes
        [b"c", b'["a"]', b"-1", b"1"],
        [b"c", b'["a"]', b"1", b"one"],
        [b"c", b'["a"]', b"1" * 20, b"1"],  # past what a request id may be
        [b"c", b'["a"]', b"1"],
    ):
        assert not legacy.is_legacy(bad), bad


@pytest.mark.parametrize(
    ("body", "command"),
    [(b"SHOW_CONFIG", p.CONFIG), (b"SHOW_STATUS", p.STATUS), (b"TERMINATION", p.TERMINATE), (b'["a"]', p.ENCODE)],
)
def test_commands_map_onto_ours(body: bytes, command: bytes) -> None:
    request = legacy.decode_request(message(b"c", body, 12), show_tokens=False)
    assert (request.client_id, request.command, request.request_id) == (b"c", command, 12)


@pytest.mark.parametrize(
    ("body", "is_tokenized"),
    [
        (b'["first do it", "then do it right"]', False),
        (b'[["first", "do", "it"], ["then"]]', True),
        (b' \n[ \t[ "first"]]', True),
        (b"[]", False),
    ],
)
def test_is_tokenized_is_told_by_the_shape(body: bytes, is_tokenized: bool) -> None:
    texts = json.loads(body)
    request = legacy.decode_request(message(b"c", body, 3, len(texts)), show_tokens=True)
    assert request.header["is_tokenized"] is is_tokenized and request.header["show_tokens"] is True
    assert request.count == len(texts)
    assert p.check_texts(p.decode_texts(request, request.payload), is_tokenized) == texts


def test_bad_payloads_fail_where_ours_do() -> None:
    request = legacy.decode_request(message(b"c", b'{"texts": ["a"]}', 1, 1), show_tokens=False)
    with pytest.raises(p.ProtocolError, match="must be a JSON list"):
        p.decode_texts(request, request.payload)
    request = legacy.decode_request(message(b"c", b'["a", "b"]', 1, 3), show_tokens=False)
    with pytest.raises(p.ProtocolError, match="says 3 inputs, the payload holds 2"):
        p.decode_texts(request, request.payload)
    mixed = legacy.decode_request(message(b"c", b'["a", ["b"]]', 1, 2), show_tokens=False)
    with pytest.raises(ValueError, match=r"texts\[1\] must be a string"):
        p.check_texts(p.decode_texts(mixed, mixed.payload), mixed.header["is_tokenized"])


# -- replies, read by the old client itself ------------------------------------------------


class OldClientOverPub:
    """A real ``bert_serving.client.BertClient`` subscribed to an XPUB_MANUAL socket here,
    as the sink's is; no server behind its request port."""

    def __init__(self, context: zmq.Context) -> None:
        self.pub = context.socket(zmq.XPUB)
        self.pub.linger = 0
        self.pub.setsockopt(zmq.XPUB_MANUAL, 1)
        port_out = free_port()
        self.pub.bind(f"tcp://127.0.0.1:{port_out}")
        self.publisher = legacy.Publisher(self.pub)
        self.client = OldClient(port=free_port(), port_out=port_out, ignore_all_checks=True, timeout=5000)
        self.identity: bytes = self.client.identity

    def subscribe(self) -> None:
        assert self.pub.poll(5000), "the old client's subscription did not arrive"
        frame = self.pub.recv(copy=False)
        assert handle_subscription(self.pub, frame)  # a UUID topic, without CURVE
        self.publisher.subscribed(frame.bytes[1:])

    def close(self) -> None:
        self.client.close()
        self.pub.close()


@pytest.fixture
def old() -> Iterator[OldClientOverPub]:
    context = zmq.Context()
    harness = OldClientOverPub(context)
    try:
        harness.subscribe()
        yield harness
    finally:
        harness.close()
        context.term()


def test_the_old_client_reads_vectors_and_tokens(old: OldClientOverPub) -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    tokens = [["[CLS]", "a", "[SEP]"], ["[CLS]", "b", "[SEP]"], ["[CLS]", "c", "[SEP]"]]
    old.publisher.send(legacy.vectors_reply(old.identity, 5, array, tokens))
    old.client.pending_request.add(5)
    response = old.client._recv_ndarray(5)
    np.testing.assert_array_equal(response.embedding, array)
    assert response.tokens == tokens
    old.publisher.send(legacy.vectors_reply(old.identity, 6, array, None))
    old.client.pending_request.add(6)
    assert old.client._recv_ndarray(6).tokens == ""  # as bert-as-service sent without show_tokens_to_client


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        ("texts[1] is empty", "texts[1] is empty"),
        ("the request has 9 inputs; this server takes at most 8 per request", "the request has 9 inputs; this"),
        ("texts[1] must be a string, not list", "texts[1] must be a string; not list"),  # no ValueError from numpy
        ("(2,)f4", "(2;)f4"),
    ],
)
def test_an_error_makes_the_old_client_raise_with_the_message(old: OldClientOverPub, error: str, shown: str) -> None:
    old.publisher.send(legacy.error_reply(old.identity, 9, error, "input"))
    old.client.pending_request.add(9)
    with pytest.raises(TypeError, match=r"bertserve error \(input\)") as caught:
        old.client._recv_ndarray(9)
    assert shown in str(caught.value)
    assert 9 not in old.client.pending_request  # the old client's bookkeeping stays whole


def test_an_error_text_numpy_could_read_is_replaced() -> None:
    _, raw, buffer, _ = legacy.error_reply(b"c", 1, "x", "input")
    assert buffer == b""
    for readable in ("f4, i4", "float32", "a, b"):
        with pytest.raises(TypeError):
            np.dtype(legacy._unusable_dtype(readable))
    header = json.loads(raw)
    assert (header["error"], header["kind"]) == ("x", "input")


def test_config_answers_keep_bert_as_service_names(old: OldClientOverPub) -> None:
    ours = {
        "server_version": "0.1.0",
        "max_seq_len": 128,
        "show_tokens_to_client": True,
        "pooling_strategy": "REDUCE_MEAN",
        "pooling_layer": [-2],
        "num_worker": 2,
        "max_batch_size": 256,
        "dtype": "fp16",
        "graph_dir": "/g",
    }
    old.publisher.send(legacy.answer_reply(old.identity, 2, legacy.config_answer(ours, old.identity)))
    old.client.pending_request.add(2)
    answer = json.loads(old.client._recv(2).content[1])
    assert answer["server_version"] == legacy.PROTOCOL_LEVEL == "1.10.0"
    assert answer["bertserve_version"] == "0.1.0"
    assert (answer["max_seq_len"], answer["show_tokens_to_client"], answer["fp16"]) == (128, True, True)
    assert (answer["graph_tmp_dir"], answer["client"]) == ("/g", old.identity.decode())
    assert {k: answer[k] for k in ("pooling_strategy", "pooling_layer", "num_worker", "max_batch_size")} == {
        "pooling_strategy": "REDUCE_MEAN",
        "pooling_layer": [-2],
        "num_worker": 2,
        "max_batch_size": 256,
    }
    for dynamic in ("NONE", None):
        assert legacy.config_answer({"max_seq_len": dynamic}, b"c")["max_seq_len"] is None
    assert legacy.config_answer({}, b"c")["show_tokens_to_client"] is False


def test_status_answers_hold_the_config_and_a_statistic() -> None:
    client, raw, request_id = legacy.status_reply(b"c", 4, {"server_version": "0.1.0", "requests_received": 7})
    answer = json.loads(raw)
    assert (client, request_id) == (b"c", b"4")
    assert answer["statistic"] == {"num_data_request": 7}
    assert answer["server_version"] == "1.10.0" and answer["requests_received"] == 7


def test_each_reply_format_lays_out_its_own_clients_replies() -> None:
    ours = p.decode_request(p.encode_request(b"c", p.ENCODE, 1, {}, ["a"]))
    frames = formats.NATIVE.refusal(ours, "texts[0] is empty", "input")
    assert frames == p.error_reply(b"c", 1, "texts[0] is empty", "input")
    assert formats.named(b"native") is formats.NATIVE and formats.named("legacy") is formats.LEGACY
    old_encode = legacy.decode_request(message(b"c", b"[]", 1, 0), show_tokens=False)
    client, raw, buffer, request_id = formats.LEGACY.refusal(old_encode, "texts[0] is empty", "input")
    assert json.loads(raw)["error"] == "texts[0] is empty" and (client, buffer, request_id) == (b"c", b"", b"1")
    empty = {"dtype": "float32", "shape": [0, 8]}
    client, raw, buffer, request_id = formats.LEGACY.answer(old_encode, empty, b"")
    assert json.loads(raw) == {"dtype": "float32", "shape": [0, 8], "tokens": ""}
    assert (client, buffer, request_id) == (b"c", b"", b"1")
    old_config = legacy.decode_request(message(b"c", legacy.SHOW_CONFIG, 2), show_tokens=False)
    answer = formats.LEGACY.answer(old_config, {"server_version": "0.1.0"})
    assert len(answer) == 3 and json.loads(answer[1])["server_version"] == "1.10.0"
    assert formats.LEGACY.held and not formats.NATIVE.held


# -- holding replies until the subscription is in --------------------------------------------


def _receive(socket: zmq.Socket, count: int) -> list[list[bytes]]:
    got = []
    while len(got) < count and socket.poll(5000):
        got.append(socket.recv_multipart())
    return got


@pytest.fixture
def xpub_and_sub() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    with zmq.Context() as context:
        pub = context.socket(zmq.XPUB)
        pub.linger = 0
        pub.setsockopt(zmq.XPUB_MANUAL, 1)
        port = free_port()
        pub.bind(f"tcp://127.0.0.1:{port}")
        sub = context.socket(zmq.SUB)
        sub.linger = 0
        sub.connect(f"tcp://127.0.0.1:{port}")
        try:
            yield pub, sub
        finally:
            sub.close()
            pub.close()


def test_a_reply_waits_for_its_subscription(xpub_and_sub: tuple[zmq.Socket, zmq.Socket]) -> None:
    pub, sub = xpub_and_sub
    publisher = legacy.Publisher(pub)
    reply = legacy.answer_reply(b"late-joiner", 1, {"ok": True})
    publisher.send(reply)
    assert len(publisher.held) == 1
    sub.setsockopt(zmq.SUBSCRIBE, b"late-joiner")
    assert pub.poll(5000)
    frame = pub.recv(copy=False)
    assert handle_subscription(pub, frame)
    publisher.subscribed(frame.bytes[1:])
    assert not publisher.held
    assert _receive(sub, 1) == [reply]
    publisher.send(legacy.answer_reply(b"late-joiner", 2, {}))  # subscribed: sent at once
    assert not publisher.held and len(_receive(sub, 1)) == 1


def test_a_reply_nobody_subscribes_to_goes_out_after_the_hold(xpub_and_sub: tuple[zmq.Socket, zmq.Socket]) -> None:
    pub, _ = xpub_and_sub
    publisher = legacy.Publisher(pub)
    publisher.send(legacy.answer_reply(b"gone", 1, {}), now=100.0)
    publisher.release_due(100.0 + legacy.HOLD_S / 2)
    assert len(publisher.held) == 1
    publisher.release_due(100.0 + legacy.HOLD_S)
    assert not publisher.held
    for request_id in range(legacy._MAX_HELD + 5):
        publisher.send(legacy.answer_reply(b"nobody", request_id, {}), now=0.0)
    assert len(publisher.held) == legacy._MAX_HELD  # bounded: the rest went out at once
    publisher.flush()
    assert not publisher.held


# -- the flags ---------------------------------------------------------------------------------


def _config(argv: list[str]) -> Any:
    return cli.server_config_from_args(cli.build_parser().parse_args(["start", "--model-dir", "/m", *argv]))


def test_legacy_clients_are_on_and_tokens_off_by_default() -> None:
    config = _config([])
    assert (config.legacy.legacy_clients, config.legacy.show_tokens_to_client) == (True, False)
    config = _config(["--legacy-clients", "false", "--show-tokens-to-client"])
    assert (config.legacy.legacy_clients, config.legacy.show_tokens_to_client) == (False, True)
    assert config.public()["show_tokens_to_client"] is True
