"""bert-as-service 1.x's own client on bertserve: its wire format, translated at the edge.

``bert-serving-client`` 1.10.0 (pure Python, on PyPI) works unchanged against ``bertserve
start``. Its messages become the same :class:`~bertserve.client.protocol.Request` our own
client's do, so limits, fairness, merging and chunking apply alike; only the replies are
laid out its way. The format, as that client's ``bert_serving/client/__init__.py`` reads
and writes it::

    client PUSH -> ventilator   [identity, message, request_id, message_len]
        message   JSON list of strings, or of token lists (is_tokenized: told apart by shape)
                  | SHOW_CONFIG | SHOW_STATUS | TERMINATION
    sink PUB -> client SUB      vectors          [identity, JSON {"dtype", "shape", "tokens"}, buffer, request_id]
                                config, status   [identity, JSON object, request_id]
                                error            [identity, JSON {"dtype": text, ...}, b"", request_id]

A bertserve request has 5 frames, so a 4-frame message whose request id and length are
decimal numbers is unambiguous (:func:`is_legacy`). Such a request is answered in this
layout by the reply format :data:`.formats.LEGACY`, chosen when it is read and carried with
it to the sink.

Errors. bert-as-service answered a request it could not serve with silence: its client
waited until its own ``timeout`` (by default forever). That client hands the reply header's
``dtype`` straight to ``numpy.frombuffer``, so an error reply here is a vector reply whose
``dtype`` is the error text, never a valid type name: the client raises at once
``TypeError: data type 'bertserve error (input): texts[1] is empty' not understood``. (In
that text a comma is written ``;``: numpy would read a text with a comma as a list of
formats and raise ``ValueError`` instead.) The header also holds ``error`` and ``kind``
exactly as our own protocol has them. No error reply can pass for vectors.

ZeroMQ drops what a PUB sends to a subscriber whose subscription has not arrived yet, and
the old client asks for the server's config the moment it connects, without asking again.
So :class:`Publisher` holds a legacy reply until its client's subscription is in, for at
most :data:`HOLD_S`.

Under CURVE the old client cannot authenticate (it has no keys), so the server refuses it.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zmq
from bertserve.client import __version__, protocol as p

PROTOCOL_LEVEL = "1.10.0"
"""The bert-as-service version whose client we answer; that client insists on it."""

HOLD_S = 3.0
"""Longest a reply waits for its client's subscription before it is sent regardless."""

SHOW_CONFIG = b"SHOW_CONFIG"
SHOW_STATUS = b"SHOW_STATUS"
TERMINATION = b"TERMINATION"
_COMMANDS = {SHOW_CONFIG: p.CONFIG, SHOW_STATUS: p.STATUS, TERMINATION: p.TERMINATE}

"""Key the ventilator adds to a legacy client's STATUS for the sink (which removes it)."""

_MAX_HELD = 1000  # replies held for subscriptions not in yet; past it they go out at once
_MAX_TOPICS = 100_000  # subscriptions remembered
_JSON_SPACE = b" \t\r\n"
_MAX_DIGITS = 19


def _is_number(frame: bytes) -> bool:
    return frame.isdigit() and len(frame) <= _MAX_DIGITS


def is_legacy(frames: Sequence[bytes]) -> bool:
    """Whether ``frames`` are a bert-as-service 1.x client's message: 4 frames, an identity
    of 1 to 64 bytes, and a request id and a length in decimal."""
    return (
        len(frames) == 4 and 0 < len(frames[0]) <= 64 and _is_number(bytes(frames[2])) and _is_number(bytes(frames[3]))
    )


def decode_request(frames: Sequence[bytes], *, show_tokens: bool) -> p.Request:
    """The request a message :func:`is_legacy` accepted stands for; never raises.

    ``show_tokens`` is the server's ``show_tokens_to_client``: the old client cannot ask for
    tokens, the server decides. Anything but a command is an ENCODE whose payload is read,
    and checked, as ours is: a payload that is not a JSON list gets an error reply.
    """
    client_id, message, raw_id, raw_len = (bytes(f) for f in frames)
    command = _COMMANDS.get(message, p.ENCODE)
    header: dict[str, Any] = {}
    if command == p.ENCODE:
        header.update(count=int(raw_len), is_tokenized=_holds_lists(message), show_tokens=show_tokens)
    request = p.Request(client_id, command, int(raw_id), header)
    if command == p.ENCODE:
        request.payload = message
    return request


def _holds_lists(message: bytes) -> bool:
    """Whether a JSON list's first element is a list: ``is_tokenized``, which the old client
    does not send. Told from the first bytes, so a busy server need not parse the texts; a
    list mixing both shapes is refused when its texts are checked."""
    text = message.lstrip(_JSON_SPACE)
    return text[:1] == b"[" and text[1:].lstrip(_JSON_SPACE)[:1] == b"["


# -- replies -----------------------------------------------------------------------------


def vectors_reply(client: bytes, request_id: int, array: np.ndarray, tokens: list[Any] | None) -> list[Any]:
    """``tokens`` is None unless the server shows tokens to clients; the old client then
    reads ``""``, as bert-as-service sent."""
    header = {"dtype": array.dtype.name, "shape": list(array.shape), "tokens": tokens if tokens is not None else ""}
    return [client, p.dumps(header), array.data if array.size else b"", _id(request_id)]


def error_reply(client: bytes, request_id: int, message: str, kind: str) -> list[Any]:
    text = f"bertserve error ({kind}): {message}".replace(",", ";")
    header = {"dtype": _unusable_dtype(text), "shape": [], "tokens": "", "error": message, "kind": kind}
    return [client, p.dumps(header), b"", _id(request_id)]


def answer_reply(client: bytes, request_id: int, answer: dict[str, Any]) -> list[Any]:
    return [client, p.dumps(answer), _id(request_id)]


def status_reply(client: bytes, request_id: int, status: dict[str, Any]) -> list[Any]:
    """bert-as-service's SHOW_STATUS: its config, then ours, and ``statistic``."""
    answer = config_answer(status, client)
    answer["statistic"] = {"num_data_request": status.get("requests_received", 0)}
    return answer_reply(client, request_id, answer)


def translate(request: p.Request, frames: list[Any]) -> list[Any]:
    """Our reply ``frames`` to the old client's ``request``, laid out its way."""
    reply = p.decode_reply(frames)
    if not reply.ok:
        message = str(reply.header.get("error", "the request failed"))
        return error_reply(request.client_id, request.request_id, message, str(reply.header.get("kind", "error")))
    if request.command == p.ENCODE:
        tokens = reply.header.get("tokens")
        return vectors_reply(request.client_id, request.request_id, reply.array(), tokens)
    if request.command == p.CONFIG:
        return answer_reply(request.client_id, request.request_id, config_answer(reply.header, request.client_id))
    return answer_reply(request.client_id, request.request_id, reply.header)


def config_answer(ours: dict[str, Any], client: bytes) -> dict[str, Any]:
    """bert-as-service's SHOW_CONFIG from our CONFIG answer: every field of ours, with
    theirs named their way where a counterpart exists. ``server_version`` is the protocol
    level we speak (the old client checks it), the real one is ``bertserve_version``."""
    answer = dict(ours)
    answer.update(
        server_version=PROTOCOL_LEVEL,
        bertserve_version=ours.get("server_version", __version__),
        max_seq_len=_max_seq_len(ours.get("max_seq_len")),
        show_tokens_to_client=bool(ours.get("show_tokens_to_client", False)),
        fp16=ours.get("dtype") == "fp16",
        graph_tmp_dir=ours.get("graph_dir"),
        client=client.decode("utf-8", "replace"),
        python_version=sys.version,
        pyzmq_version=zmq.pyzmq_version(),
        zmq_version=zmq.zmq_version(),
    )
    return answer


def _max_seq_len(value: object) -> int | None:
    """An int, or None for "each batch's own longest" (NONE), as the old client expects."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _unusable_dtype(text: str) -> str:
    """``text`` if numpy refuses it as a dtype with ``TypeError`` (an error message without
    a comma does); else a text it refuses so."""
    try:
        np.dtype(text)
    except TypeError:
        return text
    except ValueError:
        pass
    return "bertserve error: see the reply's error field"


def _id(request_id: int) -> bytes:
    return str(request_id).encode()


# -- the sink's side ---------------------------------------------------------------------


class Publisher:
    """Sends legacy replies on the sink's XPUB, each once its client's subscription is in.

    A reply for a topic not subscribed yet waits (at most :data:`HOLD_S`, and at most
    ``_MAX_HELD`` replies at once) and goes out when :meth:`subscribed` sees the topic, or
    when :meth:`release_due` finds it waited long enough (then, if nobody listens, ZeroMQ
    drops it as it would have).
    """

    def __init__(self, pub: zmq.Socket, on_full: Callable[[list[Any]], None] | None = None) -> None:
        self.pub = pub
        self.on_full = on_full  # given each reply its subscriber's full queue refused (an XPUB_NODROP socket)
        self.topics: OrderedDict[bytes, None] = OrderedDict()  # subscriptions seen, oldest first
        self.held: list[tuple[float, list[Any]]] = []  # (when it may wait no longer, frames)

    def subscribed(self, topic: bytes) -> None:
        self.topics[topic] = None
        self.topics.move_to_end(topic)
        while len(self.topics) > _MAX_TOPICS:
            self.topics.popitem(last=False)
        if self.held:
            waiting = [item for item in self.held if bytes(item[1][0]) == topic]
            if waiting:
                self.held = [item for item in self.held if bytes(item[1][0]) != topic]
                for _, frames in waiting:
                    self._send(frames)

    def send(self, frames: list[Any], now: float | None = None) -> None:
        if bytes(frames[0]) in self.topics or len(self.held) >= _MAX_HELD:
            self._send(frames)
        else:
            self.held.append(((time.monotonic() if now is None else now) + HOLD_S, frames))

    def release_due(self, now: float) -> None:
        if self.held and self.held[0][0] <= now:
            due = [frames for until, frames in self.held if until <= now]
            self.held = [item for item in self.held if item[0] > now]
            for frames in due:
                self._send(frames)

    def flush(self) -> None:
        held, self.held = self.held, []
        for _, frames in held:
            self._send(frames)

    def _send(self, frames: list[Any]) -> None:
        try:
            self.pub.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            if self.on_full is not None:
                self.on_full(frames)
