"""TEI's ``tei.v1`` services over the HTTP API's own checks and flows (:mod:`..http`): a call is
the HTTP request of the same meaning, so both front ends refuse the same inputs with the same
messages, and answer with the same numbers.

The fields mean what TEI says. ``truncate`` true cuts an input longer than the model takes; false
(proto3 cannot tell it from unset) is what the HTTP API does where the field is left out: refused,
unless the server runs with ``--auto-truncate`` (a rerank's pair is cut, as ``/rerank`` cuts it).
``normalize`` unset is true. A call is for the model its ``bertserve-model`` metadata names, else
for the default model of its method's task (:meth:`..http.catalog.Catalog.pick`). A stream's
messages are answered in groups (:mod:`.streams`). ``Metadata`` says the call's characters, its
tokens and its time; the head does not split that time into queue and inference.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import numpy as np
from bertserve.client import tasks as t
from bertserve.client.tei import tei_pb2 as pb

from ..http.app import Endpoints
from ..http.disconnects import Call
from ..http.schemas import EmbedRequest
from ..http.task_bodies import EmbedAllRequest, PredictRequest, SparseRequest
from ..http.tasks import TaskEndpoints
from ..http.tei import TEIEndpoints
from .calls import Guard
from .service import (
    DIRECTIONS,
    GROUP,
    ROOM_BYTES,
    Service,
    call_metadata,
    frame_bytes,
    predict_text,
    prompted_fields,
    ranks,
)
from .status import CallError
from .streams import Messages


class Tei(Service):
    """The methods of TEI's ``Embed``, ``Predict`` and ``Rerank`` services, each a guarded call
    (:class:`.calls.Guard`)."""

    def __init__(self, api: Endpoints, guard: Guard) -> None:
        super().__init__(api, guard)
        self.tasks = TaskEndpoints(api)
        self.tei = TEIEndpoints(api, self.tasks)

    # -- Embed --

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        return await self._one(context, "tei.v1.Embed/Embed", self._embed, request)

    def EmbedStream(
        self, requests: AsyncIterator[pb.EmbedRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EmbedResponse]:
        return self._each(context, "tei.v1.Embed/EmbedStream", self._embed, requests)

    async def _embed(
        self, call: Call, model: str | None, requests: Sequence[pb.EmbedRequest]
    ) -> list[pb.EmbedResponse]:
        started = time.monotonic_ns()
        first = requests[0]
        body = EmbedRequest.model_validate(
            {
                "inputs": [r.inputs for r in requests],
                "normalize": first.normalize if first.HasField("normalize") else True,
                "dimensions": first.dimensions if first.HasField("dimensions") else None,
                **prompted_fields(first, model),
            }
        )
        vectors, reply, _, _ = await self.tei.embedded(body, call)
        tokens = await self._tokens(call, requests, reply.header, body.prompt_name, model, "embed")
        return [
            pb.EmbedResponse(embeddings=row.tolist(), metadata=call_metadata(r.inputs, n, started))
            for r, row, n in zip(requests, vectors, tokens, strict=True)
        ]

    async def EmbedSparse(
        self, request: pb.EmbedSparseRequest, context: grpc.aio.ServicerContext
    ) -> pb.EmbedSparseResponse:
        return await self._one(context, "tei.v1.Embed/EmbedSparse", self._sparse, request)

    def EmbedSparseStream(
        self, requests: AsyncIterator[pb.EmbedSparseRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EmbedSparseResponse]:
        return self._each(context, "tei.v1.Embed/EmbedSparseStream", self._sparse, requests)

    async def _sparse(
        self, call: Call, model: str | None, requests: Sequence[pb.EmbedSparseRequest]
    ) -> list[pb.EmbedSparseResponse]:
        started = time.monotonic_ns()
        body = SparseRequest.model_validate(
            {"inputs": [r.inputs for r in requests], **prompted_fields(requests[0], model)}
        )
        rows, reply = await self.tasks.sparse(call, body)
        tokens = await self._tokens(call, requests, reply.header, body.prompt_name, model, "sparse")
        return [
            pb.EmbedSparseResponse(
                sparse_embeddings=[
                    pb.SparseValue(index=int(i), value=float(v)) for i, v in zip(row.indices, row.values, strict=True)
                ],
                metadata=call_metadata(r.inputs, n, started),
            )
            for r, row, n in zip(requests, rows, tokens, strict=True)
        ]

    async def EmbedAll(self, request: pb.EmbedAllRequest, context: grpc.aio.ServicerContext) -> pb.EmbedAllResponse:
        return await self._one(context, "tei.v1.Embed/EmbedAll", self._all, request)

    def EmbedAllStream(
        self, requests: AsyncIterator[pb.EmbedAllRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EmbedAllResponse]:
        return self._each(context, "tei.v1.Embed/EmbedAllStream", self._all, requests)

    async def _all(
        self, call: Call, model: str | None, requests: Sequence[pb.EmbedAllRequest]
    ) -> list[pb.EmbedAllResponse]:
        started = time.monotonic_ns()
        body = EmbedAllRequest.model_validate(
            {"inputs": [r.inputs for r in requests], **prompted_fields(requests[0], model)}
        )
        rows, _ = await self.tasks.token_vectors(call, body)
        return [
            pb.EmbedAllResponse(
                token_embeddings=[pb.TokenEmbedding(embeddings=token.tolist()) for token in row],
                metadata=call_metadata(r.inputs, len(row), started),
            )
            for r, row in zip(requests, rows, strict=True)
        ]

    # -- Predict --

    async def Predict(self, request: pb.PredictRequest, context: grpc.aio.ServicerContext) -> pb.PredictResponse:
        return await self._one(context, "tei.v1.Predict/Predict", self._predict, request)

    async def PredictPair(
        self, request: pb.PredictPairRequest, context: grpc.aio.ServicerContext
    ) -> pb.PredictResponse:
        return await self._one(context, "tei.v1.Predict/PredictPair", self._predict, request)

    def PredictStream(
        self, requests: AsyncIterator[pb.PredictRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PredictResponse]:
        return self._each(context, "tei.v1.Predict/PredictStream", self._predict, requests)

    def PredictPairStream(
        self, requests: AsyncIterator[pb.PredictPairRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PredictResponse]:
        return self._each(context, "tei.v1.Predict/PredictPairStream", self._predict, requests)

    async def _predict(self, call: Call, model: str | None, requests: Sequence[Any]) -> list[pb.PredictResponse]:
        started = time.monotonic_ns()
        first = requests[0]
        texts = [predict_text(r.inputs, f"inputs[{i}]") for i, r in enumerate(requests)]
        body = PredictRequest.model_validate(
            {"inputs": texts, "raw_scores": first.raw_scores, **prompted_fields(first, model, prompt=False)}
        )
        logits, labels, reply = await self.tasks.classified(call, texts, body)
        scores = logits if first.raw_scores else t.label_probabilities(logits)
        tokens = await self._tokens(call, requests, reply.header, None, model, "classify")
        return [
            pb.PredictResponse(
                predictions=[pb.Prediction(score=float(row[j]), label=labels[j]) for j in t.ranking(row, None)],
                metadata=call_metadata(text, n, started),
            )
            for text, row, n in zip(texts, scores, tokens, strict=True)
        ]

    # -- Rerank --

    async def Rerank(self, request: pb.RerankRequest, context: grpc.aio.ServicerContext) -> pb.RerankResponse:
        async with self.guard.call(context, "tei.v1.Rerank/Rerank") as call:
            started = time.monotonic_ns()
            texts = list(request.texts)
            scores, tokens = await self._ranked(call, self.guard.model(context), request.query, texts, request)
            chars = len(request.query) * len(texts) + sum(map(len, texts))
            return ranks(scores, texts if request.return_text else None, call_metadata(chars, tokens, started))

    async def RerankStream(
        self, requests: AsyncIterator[pb.RerankStreamRequest], context: grpc.aio.ServicerContext
    ) -> pb.RerankResponse:
        """Every message a (query, text) pair, ranked together when the stream ends; the first
        message's ``raw_scores``, ``return_text``, ``truncate`` and direction hold for all."""
        async with self.guard.call(context, "tei.v1.Rerank/RerankStream") as call:
            started = time.monotonic_ns()
            idle_s, most = self.guard.options.grpc_idle_timeout_s, self.api.settings.max_inputs
            messages = Messages(requests, room=GROUP, room_bytes=ROOM_BYTES, idle_s=idle_s)
            pairs: list[pb.RerankStreamRequest] = []
            held, most_bytes = 0, frame_bytes(self.api)
            try:
                while (message := await messages.next()) is not None:
                    held += len(message.query) + len(message.text)
                    if len(pairs) >= most or held > most_bytes:
                        raise CallError(
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"the stream holds more than {most} pairs (--max-request-size) or {most_bytes} "
                            "characters (--max-message-bytes): rank fewer at once",
                        )
                    pairs.append(message)
            finally:
                await messages.close()
            if not pairs:
                raise CallError(grpc.StatusCode.INVALID_ARGUMENT, "the stream sent no pair to rank")
            scores = np.zeros(len(pairs), np.float32)
            tokens = 0
            by_query: dict[str, list[int]] = {}
            for index, pair in enumerate(pairs):
                by_query.setdefault(pair.query, []).append(index)
            for query, indexes in by_query.items():  # one request a query, as /rerank sends it
                texts = [pairs[i].text for i in indexes]
                scored, counted = await self._ranked(call, self.guard.model(context), query, texts, pairs[0])
                scores[indexes], tokens = scored, tokens + counted
            chars = sum(len(p.query) + len(p.text) for p in pairs)
            shown = [p.text for p in pairs] if pairs[0].return_text else None
            return ranks(scores, shown, call_metadata(chars, tokens, started))

    async def _ranked(
        self, call: Call, model: str | None, query: str, texts: list[str], first: Any
    ) -> tuple[np.ndarray, int]:
        """The scores of ``texts`` for ``query``, and the tokens they took."""
        _, info, logits, _, tokens = await self.tasks.rerank_logits(
            call, model, query, texts, "texts", direction_=DIRECTIONS.get(first.truncation_direction, "right")
        )
        scores = logits if first.raw_scores else t.activate(logits, str(info.get("activation", "identity")))
        return np.asarray(scores, np.float32), tokens
