"""Admission: whether the server takes a request, as pure functions of the request, the
limits and what the server holds now. No sockets: the ventilator reads the request and sends
the answer; these say what the answer is.

The head asks each of these once per request, in the order that lets a busy server refuse
it cheaply (:mod:`..head.intake`): on the count its header declares before its texts are
read, then on the texts themselves. Each check returns ``None`` when the request passes it,
or the :class:`Refusal` its client gets.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from ...config.limits import Limits
from ...config.model import parse_long_inputs
from ...model.chunking import chunk_refusal
from .jobs import Busy, TooLarge
from .scheduler import Scheduler

BUSY = "busy"  # the client may retry later (the kind of error reply, as the client protocol names it)


@dataclass(frozen=True)
class Refusal:
    """Why a request is not taken, and its kind: ``input``, ``limit``, ``busy``, ``protocol``,
    ``duplicate``, ``forbidden``."""

    message: str
    kind: str = "input"


def principal(client_id: bytes, user: bytes | None, gateway_key: bytes | None) -> bytes:
    """Whom bounds and turns apply to: under CURVE the client's key, whatever client ids it
    uses (the HTTP front end's callers are each their own client id); else the client id."""
    return b"key:" + user if user is not None and user != gateway_key else client_id


def chunking(requested: object, default: str, model: dict[str, Any]) -> tuple[bool, Refusal | None]:
    """Whether a request's long inputs are encoded in windows (its ``long_inputs``, else the
    model's ``default``), and why they cannot be, if they cannot. ``model`` is what the workers
    reported."""
    if requested is None:
        return default == "chunk", None
    try:
        if parse_long_inputs(requested) == "truncate":
            return False, None
    except ValueError as exc:
        return False, Refusal(str(exc))
    if model and not model.get("chunking"):
        refusal = chunk_refusal(model.get("pooling_strategy")) if "pooling_strategy" in model else None
        return False, Refusal(refusal or "this server's model cannot encode long inputs in windows (long_inputs=chunk)")
    return True, None


def check_count(count: int, limits: Limits, scheduler: Scheduler, who: bytes) -> Refusal | None:
    """``count`` inputs against the request size limit and the room in the queues."""
    limit = limits.request_size
    if count > limit:
        return Refusal(f"the request has {count} inputs; this server takes at most {limit} per request", "limit")
    try:
        scheduler.check_room(who, count)
    except Busy as exc:
        return Refusal(str(exc), BUSY)
    except TooLarge as exc:
        return Refusal(str(exc), "limit")
    return None


def check_bytes(nbytes: int, held: int, cap: int) -> Refusal | None:
    """Texts holding ``nbytes`` beside the ``held`` bytes of the requests admitted, against
    ``--max-queued-bytes`` (``cap``): ``limit`` if they never could fit, else ``busy``."""
    if nbytes > cap:
        return Refusal(
            f"the request's texts take {_mib(nbytes)} in memory; this server holds at most {_mib(cap)} of queued "
            "texts (--max-queued-bytes): send fewer or shorter texts per request",
            "limit",
        )
    if held + nbytes > cap:
        return Refusal(
            f"the server is busy: the texts of the requests it holds take {_mib(held)} of its {_mib(cap)} "
            f"(--max-queued-bytes), and this request's {_mib(nbytes)}; retry when some are answered",
            BUSY,
        )
    return None


def check_lengths(texts: list[Any], max_chars: int) -> Refusal | None:
    """Each text (or pre-tokenized input's tokens) against ``--max-text-chars``."""
    for index, text in enumerate(texts):
        size = len(text) if isinstance(text, str) else sum(map(len, text))
        if size > max_chars:
            return Refusal(f"texts[{index}] has {size} characters; this server takes at most {max_chars}", "limit")
    return None


def check_unique(request_id: int, pending: bool) -> Refusal | None:
    """A request id of a client may be pending once at a time."""
    if pending:
        return Refusal(
            f"request id {request_id} of this client is already pending; it was not queued again (the first "
            "request is unaffected)",
            "duplicate",
        )
    return None


def held_bytes(texts: list[Any]) -> int:
    """What a request's decoded texts hold in this process: each ``str`` object (its header and
    its characters, at 1, 2 or 4 bytes each as Python stores them) and a list slot for it; a
    pre-tokenized input counts its list and each token."""
    total = sys.getsizeof(texts)
    for text in texts:
        total += sys.getsizeof(text)
        if isinstance(text, list):
            total += sum(map(sys.getsizeof, text))
    return total


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"
