"""Admit: whether the head takes an ENCODE request, with every check made once, here, in
the order that lets a busy server refuse a request cheaply.

1. its options (:mod:`.request_options`);
2. its inputs, against ``--max-request-size`` and the room in its client's queue and the
   server's (:func:`..policy.admission.check_count`): the count its header declares is
   checked before its texts are read, so a flood is refused unread; a request that
   declares none has its texts read first, to be counted;
3. its texts: their form, ``--max-text-chars``, and a request id not pending already;
4. the memory they hold with their prompt, against ``--max-queued-bytes``;
5. its answer, against ``--max-reply-bytes``;
6. for a bulk request, the time it would take beside the bulk work queued
   (``--bulk-slowdown``, :meth:`..policy.scheduler.Scheduler.check_slowdown`).

What passes is :class:`Taken`, which :meth:`.requests.Requests.queue` plans (its key,
deadline and REGISTER) and hands to the scheduler, which checks nothing again. The
decisions are pure (:mod:`..policy.admission`, :mod:`..policy.costs`); this reads them in
order, on what the head holds now.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from bertserve.client import protocol as p

from ...model.prompts import apply_prompt
from ..policy import admission, costs
from ..policy.admission import Refusal
from ..policy.jobs import Busy
from ..policy.scheduler import Slot
from .models import HeadModel
from .request_options import EncodeOptions, read_options


class Held(Protocol):
    """What admission reads of the requests the head holds (:class:`.requests.Requests`)."""

    @property
    def queued_bytes(self) -> int: ...

    def pending(self, wire_key: str) -> bool: ...


@dataclass(frozen=True)
class Taken:
    """A request admitted: its options, its texts (checked, with their prompt) and the bytes
    they hold, when it arrived and when it expires, and its slot in the queue."""

    options: EncodeOptions
    texts: list[Any]
    nbytes: int
    now: float  # when it was admitted (``time.monotonic()``)
    deadline: float  # now + its timeout
    slot: Slot


def admit(
    request: p.Request,
    model: HeadModel,
    who: bytes,
    *,
    info: dict[str, Any],
    held: Held,
    of_task: Callable[[str], list[str]],
) -> Taken | Refusal:
    """``request`` admitted on ``model`` for ``who``, or the :class:`Refusal` of the first
    check it fails. ``info`` is what the model's workers said of it."""
    limits, scheduler = model.config.limits, model.scheduler
    options = read_options(request.header, model.config, info, model.prompts, model.name, of_task)
    if isinstance(options, Refusal):
        return options
    texts = _counted(request, lambda count: admission.check_count(count, limits, scheduler, who))
    if isinstance(texts, Refusal):
        return texts
    refusal = (
        _form(texts, options)
        or admission.check_lengths(texts, limits.max_text_chars)
        or admission.check_unique(request.request_id, held.pending(request.key))
    )
    if refusal is not None:
        return refusal
    if options.prompt:  # the prompt's tokens count toward max_seq_len, as it runs
        texts = apply_prompt(texts, options.prompt)
    nbytes = admission.held_bytes(texts)
    too_large = _too_large(texts, options, info, limits.max_reply_bytes)
    refusal = admission.check_bytes(nbytes, held.queued_bytes, limits.max_queued_bytes) or (
        Refusal(too_large, "limit") if too_large is not None else None
    )
    if refusal is not None:
        return refusal
    now = time.monotonic()
    deadline = now + options.timeout_s
    try:
        slot = scheduler.check_slowdown(who, len(texts), now, deadline)
    except Busy as exc:
        return Refusal(str(exc), admission.BUSY)
    return Taken(options, texts, nbytes, now, deadline, slot)


def _too_large(texts: list[Any], options: EncodeOptions, info: dict[str, Any], limit: int) -> str | None:
    """Why the answer to ``texts`` would pass the reply bound, counted before any work: a row
    a text at the model's widest, or a late-interaction model's vectors a token by each text's size."""
    if costs.answers_by_token(info, options.task):
        sizes = costs.token_answer_bytes(info, texts, options.task, 4, query=options.reads == "query")
        return costs.too_large_answer(sizes, limit)
    return costs.too_large_reply(len(texts), costs.reply_row_bytes(info, options.dimensions, options.task), limit)


def _counted(request: p.Request, check: Callable[[int], Refusal | None]) -> list[Any] | Refusal:
    """``request``'s texts once their count passed ``check``: the count its header declares,
    checked before they are read; without one, they are read first and counted."""
    declared = request.count
    texts = _read(request) if declared is None else None
    if isinstance(texts, Refusal):
        return texts
    refusal = check(len(texts) if texts is not None else declared or 0)
    if refusal is not None:
        return refusal
    return texts if texts is not None else _read(request)


def _read(request: p.Request) -> list[Any] | Refusal:
    """The texts of ``request``'s payload (as many as its header declares, if it does)."""
    try:
        texts = request.texts = p.decode_texts(request, request.payload)
    except p.ProtocolError as exc:
        return Refusal(f"malformed request: {exc}", "protocol")
    return texts


def _form(texts: list[Any], options: EncodeOptions) -> Refusal | None:
    """Whether ``texts`` are texts (or token lists, for a tokenized request); a rerank of a
    late-interaction model, pairs of texts (its workers read each side on its own, so a job of
    them holds nothing else)."""
    try:
        p.check_texts(texts, options.is_tokenized)
    except (TypeError, ValueError) as exc:
        return Refusal(str(exc))
    if options.reads == "pairs":
        if options.is_tokenized:
            return Refusal("a rerank by a late-interaction model takes pairs of texts, not tokens")
        for i, text in enumerate(texts):
            if p.PAIR_SEPARATOR not in text:
                return Refusal(f"texts[{i}] is not a pair: a rerank input is 'query {p.PAIR_SEPARATOR} document'")
    return None
