"""What the gRPC services share: the API they call (:class:`Service`), a stream's messages
answered in groups, and the messages' fields as the HTTP bodies' (TEI's meanings, :mod:`.tei`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import numpy as np
from bertserve.client import tasks as t
from bertserve.client.tei import tei_pb2 as pb

from ..http.app import Endpoints
from ..http.disconnects import Call
from ..http.options import prompted
from ..http.schemas import HTTPError
from ..http.task_bodies import one_text, pair_input
from .calls import Guard
from .streams import Messages, answered

Answer = Callable[[Call, str | None, Sequence[Any]], Awaitable[Sequence[Any]]]
"""A method's answers to a group of its messages, for a call and the model it names."""

DIRECTIONS = {pb.TRUNCATION_DIRECTION_RIGHT: "right", pb.TRUNCATION_DIRECTION_LEFT: "left"}
GROUP = 1000
"""Most stream messages sent to the head as one request: as many as a bulk HTTP request holds,
so that the head sorts them by length into model runs as it sorts a bulk request's."""
DEFAULT_MESSAGE_BYTES = 16 * 2**20
ROOM_BYTES = 2**20
"""Most bytes of messages one stream reads ahead of its answers."""


class Service:
    """A gRPC service over the HTTP API's endpoints and checks, its calls guarded by ``guard``."""

    def __init__(self, api: Endpoints, guard: Guard) -> None:
        self.api, self.guard = api, guard

    async def _one(self, context: grpc.aio.ServicerContext, method: str, answer: Answer, request: Any) -> Any:
        """A unary call of ``method``: ``answer`` of its one request, guarded."""
        async with self.guard.call(context, method) as call:
            return (await answer(call, self.guard.model(context), [request]))[0]

    async def _each(
        self, context: grpc.aio.ServicerContext, method: str, answer: Answer, requests: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        """A stream of ``method``: each message's answer, in order, ``answer`` given groups (:meth:`_stream`)."""
        async with self.guard.call(context, method) as call:
            model = self.guard.model(context)
            async for reply in self._stream(requests, lambda group: answer(call, model, group)):
                yield reply

    def _stream(
        self, requests: AsyncIterator[Any], answer: Callable[[Sequence[Any]], Awaitable[Sequence[Any]]]
    ) -> AsyncIterator[Any]:
        idle_s = self.guard.options.grpc_idle_timeout_s
        messages = Messages(requests, room=GROUP, room_bytes=ROOM_BYTES, idle_s=idle_s)
        most = min(GROUP, self.api.settings.max_inputs)
        return answered(messages, options_of, answer, most=most, most_bytes=frame_bytes(self.api) // 2)

    async def _tokens(
        self,
        call: Call,
        requests: Sequence[Any],
        header: dict[str, Any],
        prompt: str | None,
        name: str | None,
        task: str,
    ) -> list[int]:
        """Each request's tokens: the reply's count for one, the model's tokenizer's for each of a
        stream's group (the head counts a request's tokens, not each input's)."""
        if len(requests) == 1:
            return [int(header.get("token_count", 0))]
        model = self.api.catalog.pick(name, task)
        info = self.api.catalog.last(model)
        texts = [predict_text(r.inputs, "inputs") if not isinstance(r.inputs, str) else r.inputs for r in requests]
        counts = await self.api.tokenized(call, model.tokenizer.count_tokens, prompted(texts, prompt, info))
        return [int(n) for n in counts]


def frame_bytes(api: Endpoints) -> int:
    """The largest request the head takes, in bytes, as it said (else its default)."""
    return api.bounds.message_bytes or DEFAULT_MESSAGE_BYTES


def options_of(message: Any) -> tuple[Any, ...]:
    """What a stream's message asks beside its input: messages alike go as one request."""
    return tuple((field.name, value) for field, value in message.ListFields() if field.name not in ("inputs", "ids"))


def prompted_fields(request: Any, model: str | None, *, prompt: bool = True) -> dict[str, Any]:
    """The HTTP body's fields of a message's ``truncate``, direction and prompt, for ``model``."""
    fields = {
        "truncate": True if request.truncate else None,
        "truncation_direction": DIRECTIONS.get(request.truncation_direction, "right"),
        "model": model,
    }
    if prompt:
        fields["prompt_name"] = request.prompt_name if request.HasField("prompt_name") else None
    return fields


def predict_text(inputs: Any, name: str) -> str:
    """A ``Predict``'s text, or a ``PredictPair``'s one or two texts as one input, as ``/predict``
    takes them (a text's ``|||`` is not a pair's separator)."""
    if isinstance(inputs, str):
        return one_text(inputs, name)
    sides = list(inputs)
    if not 1 <= len(sides) <= 2:
        raise HTTPError(422, f"{name} must hold one text or a pair of two, not {len(sides)}", param="inputs")
    return pair_input(sides, name)


def decoded(tokenizer: Any, ids: list[int], skip_special_tokens: bool) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))


def call_metadata(inputs: str | int, tokens: int, started_ns: int) -> pb.Metadata:
    return pb.Metadata(
        compute_chars=len(inputs) if isinstance(inputs, str) else inputs,
        compute_tokens=tokens,
        total_time_ns=time.monotonic_ns() - started_ns,
    )


def ranks(scores: np.ndarray, texts: list[str] | None, metadata: pb.Metadata) -> pb.RerankResponse:
    return pb.RerankResponse(
        ranks=[
            pb.Rank(index=i, score=float(scores[i]), text=texts[i] if texts is not None else None)
            for i in t.ranking(scores, None)
        ],
        metadata=metadata,
    )
