"""The bertserve wire protocol: every frame layout, command and version, in one place.

Arrays travel as a JSON header (``dtype``, ``shape``) plus the raw buffer; nothing on the
wire is pickled. Decoding a malformed message raises :class:`ProtocolError`, never
``AssertionError`` or ``IndexError``.

Client and server (public, versioned by :data:`PROTOCOL_VERSION`)::

    client PUSH -> ventilator PULL   [client_id, command, request_id, header, payload]
        command   ENCODE | CONFIG | STATUS | TERMINATE | RELOAD | CANCEL
        header    JSON {"protocol", "client_version", ...}; ENCODE adds "is_tokenized", "show_tokens"
                  and "count" (the number of inputs; optional, checked against the payload), and
                  may add the request options of :data:`ENCODE_OPTIONS`; RELOAD may add "version"
                  ("latest" or a number of the server's model repository). ENCODE may add
                  "traceparent": the caller's W3C trace context (:data:`TRACEPARENT_FIELD`), which
                  the server's spans of the request continue when it traces. ENCODE, CONFIG,
                  STATUS and RELOAD may add "model": the name of one of the models the server
                  serves (:data:`MODEL_NAME_PATTERN`); without it, the server's default model
        payload   ENCODE: JSON list of strings (or of token lists); otherwise empty

      CANCEL withdraws the sender's pending ENCODE of that request id: its queued work is
      dropped and it is answered with kind ``cancelled`` (which nobody need read). It gets no
      other answer; a request already answered, or unknown, is left as it is.

    sink PUB -> client SUB           [client_id, request_id, status, header, *buffer]
      (under CURVE: sink ROUTER -> client DEALER, the same frames; the client first sends
       [ANNOUNCE, client_id] from a DEALER whose routing id is 16 random bytes, and the sink
       routes replies to a client id only to connections of the key it belongs to)
        status    OK | ERROR
        header    ENCODE: array header {"dtype", "shape", "token_count", "chunked", "truncated"}
                  (+ "tokens", and "model_version" from a model repository); CONFIG/STATUS/RELOAD:
                  the answer; ERROR: {"error": message, "kind": short name}
        buffer    ENCODE: the vectors' raw bytes, C order

``token_count`` is how many tokens the request's inputs became, [CLS] and [SEP] included
(after truncation). ``truncated`` lists the inputs (their indexes, ascending) the model cut to
its length: of a sentence pair, either side. A client that does not know a header field
ignores it.

Error replies carry a ``kind``: ``input`` (bad texts), ``limit`` (over a size limit),
``busy`` (the server's queues are full: retry later), ``protocol``, ``forbidden``,
``duplicate`` (a request id already pending), ``model`` (the server serves no model of that
name; the message lists those it serves), ``task`` (the model does another task than the
request asks: the message names the model's), ``expired`` (its deadline passed before it
completed: the client's ``timeout_ms``, or the server's request timeout), ``cancelled`` (the
client withdrew it), ``worker`` (the model failed on the request, or it crashed its worker
twice), ``internal`` and ``shutdown``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PROTOCOL_VERSION = 1

# client -> server commands
ENCODE = b"ENCODE"
CONFIG = b"CONFIG"
STATUS = b"STATUS"
TERMINATE = b"TERMINATE"
RELOAD = b"RELOAD"  # check the model repository now, and swap to the version found
ANNOUNCE = b"ANNOUNCE"  # client DEALER -> sink ROUTER under CURVE: route replies to this topic here
CANCEL = b"CANCEL"  # withdraw a pending ENCODE of the sender's: its queued work is dropped
COMMANDS = (ENCODE, CONFIG, STATUS, TERMINATE, RELOAD, CANCEL)

ENCODE_OPTIONS = {
    "long_inputs": "'truncate' or 'chunk': what happens to an input longer than the model takes",
    "timeout_ms": "a number > 0: the request's deadline, from its arrival; work still queued then is dropped",
    "dimensions": "an int from 1 to the model's dimension: keep the first k (renormalized if the output is)",
    "normalize": "true or false: each sentence vector at unit length, or not; false gives a normalizing model's "
    "vectors before its Normalize module (by default as the model's modules say)",
    "prompt_name": "the name of one of the server's prompts, put before every input",
    "truncation_direction": "'right' (the default) or 'left': which end of an over-long input is cut",
    "task": "'embed' (the default), 'rerank', 'classify', 'sparse' or 'multivector': what the request asks of "
    "the model; a model that does not answer it refuses it (kind 'task')",
    "is_query": "true or false (the default): a multivector request's inputs are queries, read as the model reads "
    "a query (ColBERT's query prefix and expansion), not documents",
    "outputs": "a list of 'embed', 'sparse' and 'multivector' (instead of task): each of a late-interaction model's "
    "outputs asked for, from one model run of each input, in one array (bertserve.client.late.unpack_outputs)",
}
"""The optional fields of an ENCODE header, each checked by the server at the edge."""
TRACEPARENT_FIELD = "traceparent"
"""An ENCODE header's optional W3C trace context (``00-<32 hex>-<16 hex>-<2 hex>``): the
server checks its form, refuses another with kind ``protocol``, and when it traces makes its
spans of the request children of that span (``bertserve start --otlp-endpoint``)."""
TRUNCATION_DIRECTIONS = ("right", "left")
TASKS = ("embed", "rerank", "classify", "sparse", "multivector")
"""What a request asks of a model: vectors, a cross-encoder's scores of sentence pairs (or a
late-interaction model's MaxSim), a classifier's label scores, sparse weights, or one vector
per token (ColBERT's, BGE-M3's). Each row of the answer is the input's: ``(N, D)`` vectors,
``(N, 1)`` or ``(N, labels)`` logits, ``(N, K, 2)`` ``[id, weight]`` pairs, ``(N, T, D)``
token vectors (zero rows pad an input's to the longest's)."""
MODEL_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}"
"""What a served model's name may be: letters, digits and ``._:/-``, at most 128 characters."""

# reply status
OK = b"OK"
ERROR = b"ERROR"

# kinds of error reply
BUSY = "busy"
EXPIRED = "expired"
CANCELLED = "cancelled"
DROPPED = "dropped"  # the reply could not be queued for its client (it did not read): this says so instead
UNKNOWN_MODEL = "model"
WRONG_TASK = "task"  # the model does another task than the request asks of it

PAIR_SEPARATOR = "|||"
"""Writes a sentence pair as one input: ``"first ||| second"``; a ``"|||"`` token does for
tokenized input. The server cuts an input at the first one (see :func:`one_sentence`)."""

_ARRAY_DTYPES = {"float32", "float16", "float64", "int32", "int64"}


class ProtocolError(ValueError):
    """A message does not follow the bertserve wire protocol."""


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def loads(data: bytes, what: str = "header") -> Any:
    try:
        return json.loads(data.decode("utf-8")) if data else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"the {what} is not valid UTF-8 JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError(f"the {what} nests too deeply") from None


def _as_dict(data: bytes, what: str = "header") -> dict[str, Any]:
    value = loads(data, what)
    if not isinstance(value, dict):
        raise ProtocolError(f"the {what} must be a JSON object")
    return value


# -- arrays ------------------------------------------------------------------------------


def array_header(array: np.ndarray) -> dict[str, Any]:
    return {"dtype": array.dtype.name, "shape": list(array.shape)}


def array_from_buffer(header: dict[str, Any], buffer: bytes | memoryview) -> np.ndarray:
    """The array described by ``header`` over ``buffer``; checks sizes instead of trusting them."""
    dtype, shape = header.get("dtype"), header.get("shape")
    if dtype not in _ARRAY_DTYPES:
        raise ProtocolError(f"unsupported array dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ProtocolError(f"bad array shape {shape!r}")
    expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if len(buffer) != expected:
        raise ProtocolError(f"array buffer holds {len(buffer)} bytes, the header implies {expected}")
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


# -- what ENCODE accepts ---------------------------------------------------------------


def check_texts(texts: object, is_tokenized: bool = False, *, pairs: bool = True) -> list[Any]:
    """Return ``texts`` as a list, or raise naming the first element that cannot be encoded.

    ``texts`` must be a list (or tuple) of non-empty strings or, with ``is_tokenized``, of
    non-empty lists of non-empty strings. Anything else that is not a sequence raises
    ``TypeError``; a bad element raises ``ValueError`` naming its position. Without ``pairs``
    each element is one sentence even if it holds ``|||``: it comes back as
    :func:`one_sentence` makes it.
    """
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        kind = "a list of token lists" if is_tokenized else "a list of strings"
        raise TypeError(f"texts must be {kind}, not {type(texts).__name__}")
    for i, item in enumerate(texts):
        if is_tokenized:
            _check_tokens(i, item)
        else:
            _check_text(i, item, pairs)
    return list(texts) if pairs else [one_sentence(item, is_tokenized) for item in texts]


def _check_tokens(i: int, item: object) -> None:
    if isinstance(item, str) or not isinstance(item, Sequence):
        raise ValueError(f"texts[{i}] must be a list of tokens, not {type(item).__name__}")
    if not item:
        raise ValueError(f"texts[{i}] is an empty token list")
    for j, token in enumerate(item):
        if not isinstance(token, str) or not token.strip():
            raise ValueError(f"texts[{i}][{j}] must be a non-empty string token, got {token!r}")
        if _has_surrogate(token):
            raise ValueError(f"texts[{i}][{j}] holds a lone surrogate, which is not valid Unicode text")


def _check_text(i: int, item: object, pairs: bool) -> None:
    if not isinstance(item, str):
        raise ValueError(f"texts[{i}] must be a string, not {type(item).__name__}")
    if _has_surrogate(item):
        raise ValueError(f"texts[{i}] holds a lone surrogate, which is not valid Unicode text")
    if not item.strip():
        raise ValueError(f"texts[{i}] is empty")
    if pairs and PAIR_SEPARATOR in item and not all(part.strip() for part in item.split(PAIR_SEPARATOR, 1)):
        raise ValueError(f"texts[{i}] is a sentence pair with an empty side: {item!r}")


def one_sentence(item: Any, is_tokenized: bool = False) -> Any:
    """``item`` (a text, or with ``is_tokenized`` a token list) written so that the server
    encodes it as one sentence, never as a pair.

    The protocol has no way to say "not a pair": the server cuts every input at its first
    ``|||``. So each run of three or more ``|`` in a text gets spaces between them, and a
    ``|||`` token becomes three ``|`` tokens. BERT's tokenizer makes every ``|`` a token of its
    own, spaces or not, so the input still becomes the tokens it would have been whole.
    """
    if is_tokenized:
        if PAIR_SEPARATOR not in item:
            return item
        return [part for token in item for part in (["|"] * 3 if token == PAIR_SEPARATOR else [token])]
    if PAIR_SEPARATOR not in item:
        return item
    return _PIPE_RUN.sub(lambda run: " ".join(run[0]), item)


_PIPE_RUN = re.compile(r"\|{3,}")


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# -- client <-> server -------------------------------------------------------------------


@dataclass
class Request:
    client_id: bytes
    command: bytes
    request_id: int
    header: dict[str, Any]
    texts: list[Any] = field(default_factory=list)
    payload: bytes = b""  # the undecoded payload, when decode_request was told to leave it

    @property
    def key(self) -> str:
        return request_key(self.client_id, self.request_id)

    @property
    def count(self) -> int | None:
        """How many inputs the header says the payload holds, if it says (ENCODE)."""
        count = self.header.get("count")
        return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


def request_key(client_id: bytes, request_id: int) -> str:
    return f"{bytes(client_id).hex()}#{request_id}"


def encode_request(
    client_id: bytes, command: bytes, request_id: int, header: dict[str, Any], texts: Sequence[Any] = ()
) -> list[bytes]:
    full = {"protocol": PROTOCOL_VERSION, **header}
    if command == ENCODE:
        full["count"] = len(texts)  # lets a busy server refuse the request without reading it
    payload = dumps(list(texts)) if command == ENCODE else b""
    return [client_id, command, str(request_id).encode(), dumps(full), payload]


def decode_request(frames: Sequence[bytes], *, payload: bool = True) -> Request:
    """Parse a client's message; the client id comes first so errors can still be addressed.

    With ``payload=False`` the texts of ENCODE are left undecoded in ``Request.payload``, for
    :func:`decode_texts` once the request is worth reading.
    """
    if len(frames) != 5:
        raise ProtocolError(f"a request has 5 frames, this one has {len(frames)}")
    client_id, command, raw_id, raw_header, raw_payload = (bytes(f) for f in frames)
    if not client_id or len(client_id) > 64:
        raise ProtocolError("the client id must be 1 to 64 bytes")
    if command not in COMMANDS:
        raise ProtocolError(f"unknown command {command[:32]!r}")
    if not raw_id.isdigit() or len(raw_id) > 19:
        raise ProtocolError(f"the request id must be a non-negative integer below 10**19, not {raw_id[:32]!r}")
    request_id = int(raw_id)
    header = _as_dict(raw_header)
    version = header.get("protocol")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r} is not supported; this server speaks {PROTOCOL_VERSION}")
    request = Request(client_id, command, request_id, header)
    if command == ENCODE:
        if payload:
            request.texts = decode_texts(request, raw_payload)
        else:
            request.payload = raw_payload
    return request


def decode_texts(request: Request, payload: bytes) -> list[Any]:
    """The texts of an ENCODE request, checked against the count its header declares."""
    texts = loads(payload, "payload")
    if not isinstance(texts, list):
        raise ProtocolError("the payload of ENCODE must be a JSON list")
    if "count" in request.header and request.count != len(texts):
        raise ProtocolError(f"the header says {request.header['count']!r} inputs, the payload holds {len(texts)}")
    return texts


def decode_client_id(frames: Sequence[bytes]) -> bytes | None:
    """The sender of a message that may be malformed, if one can be told."""
    if frames and 0 < len(frames[0]) <= 64:
        return bytes(frames[0])
    return None


@dataclass
class Reply:
    client_id: bytes
    request_id: int
    ok: bool
    header: dict[str, Any]
    buffer: bytes | memoryview | None = None

    def array(self) -> np.ndarray:
        if self.buffer is None:
            raise ProtocolError("this reply carries no array")
        return array_from_buffer(self.header, self.buffer)


def encode_reply(client_id: bytes, request_id: int, ok: bool, header: dict[str, Any], buffer: Any = None) -> list[Any]:
    frames: list[Any] = [client_id, str(request_id).encode(), OK if ok else ERROR, dumps(header)]
    if buffer is not None:
        frames.append(buffer)
    return frames


def error_reply(client_id: bytes, request_id: int, message: str, kind: str = "error") -> list[Any]:
    return encode_reply(client_id, request_id, False, {"error": message, "kind": kind})


def decode_reply(frames: Sequence[Any]) -> Reply:
    if len(frames) not in (4, 5):
        raise ProtocolError(f"a reply has 4 or 5 frames, this one has {len(frames)}")
    client_id, raw_id, status, raw_header = (bytes(f) for f in frames[:4])
    try:
        request_id = int(raw_id)
    except ValueError:
        raise ProtocolError(f"bad request id {raw_id[:32]!r}") from None
    if status not in (OK, ERROR):
        raise ProtocolError(f"bad reply status {status[:32]!r}")
    buffer = frames[4] if len(frames) == 5 else None
    return Reply(client_id, request_id, status == OK, _as_dict(raw_header), buffer)
