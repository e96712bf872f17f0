"""A late-interaction model's endpoints (BGE-M3, ColBERT: :mod:`..model.late`):
``/embed_multivector``, each input's token vectors, and ``/embed_outputs``, several of BGE-M3's
outputs of each input from one model run. Each is an ENCODE request like any other (task
``multivector``, or ``outputs``), counted before any work at the model's length for every input;
rerank with such a model is MaxSim, on every rerank endpoint (:mod:`.tasks`)."""

from __future__ import annotations

from typing import Any

import numpy as np
from bertserve.client import late
from bertserve.client.protocol import Reply
from fastapi import Request
from fastapi.responses import Response

from ..serving.policy import costs
from . import compact
from .disconnects import Call
from .front import http_call
from .options import Asked, checked_prompt_name, direction
from .schemas import HTTPError, json_response, quoted
from .task_bodies import MultivectorRequest, OutputsRequest
from .tasks import API, TaskEndpoints


class LateEndpoints:
    """The endpoints of a late-interaction model, over the task endpoints' checks."""

    def __init__(self, api: API, tasks: TaskEndpoints) -> None:
        self.api, self.tasks = api, tasks

    async def embed_multivector(self, body: MultivectorRequest, request: Request) -> Response:
        types = compact.requested_multivector(body.embedding_types)
        rows, _ = await self.multivectors(http_call(request), body, types)
        answered = {kind: [late.multivector_form(row, kind) for row in rows] for kind in types or ("float",)}
        if types is None or isinstance(body.embedding_types, str):
            return json_response(answered[(types or ("float",))[0]])
        return json_response(answered)

    async def multivectors(
        self, call: Call, body: MultivectorRequest, types: tuple[str, ...] | None = None
    ) -> tuple[list[np.ndarray], Reply]:
        """Each of ``body``'s inputs' token vectors (``(tokens, dim)`` float32), by a
        late-interaction model, and their reply. The answer is counted before any work, at the
        model's length for every input, in the JSON of the ``types`` asked for."""
        texts = self.tasks.texts_of(body.inputs)
        if not isinstance(body.is_query, bool):
            raise HTTPError(422, f"is_query must be true or false, not {quoted(body.is_query)}", param="is_query")
        model, info = await self.tasks.model_for(body.model, "multivector")
        options = Asked(
            prompt_name=checked_prompt_name(body.prompt_name, info),
            truncation_direction=direction(body.truncation_direction),
            task="multivector",
            is_query=body.is_query or None,
        )
        smaller = "" if types == ("binary",) else "or ask for embedding_types binary (1/128 of float's JSON)"
        self.api.bounds.request(model, info, texts, options, compact.json_value_bytes(types), how=smaller)
        # a ColBERT query is cut to its query length as PyLate cuts it, unless truncate=false says otherwise
        refuse = body.truncate is False if body.is_query else not self.api.settings.cuts(body.truncate)
        if refuse and not info.get("query_length"):  # BGE-M3 reads as this process's tokenizer does
            await self.api.refuse_over_long(call, model, info, texts, options, chunkable=False)
        reply = await self.api.encode(call, model, texts, options)
        cut = reply.header.get("truncated")
        if refuse and isinstance(cut, list) and cut:  # a ColBERT model's own lengths: as its workers said
            raise HTTPError(
                413,
                f"inputs[{cut[0]}] is longer than the model {model.name!r} takes"
                f"{' for a query' if body.is_query else ''}; pass truncate=true to cut it",
            )
        return late.multivector_rows(reply.array()), reply

    async def embed_outputs(self, body: OutputsRequest, request: Request) -> Response:
        """Each input's ``outputs`` from one model run: ``{"embed": [...], "sparse": [{index,
        value}...], "multivector": [[...]...]}`` an input."""
        try:
            outputs = late.check_outputs(body.outputs)
        except ValueError as exc:
            raise HTTPError(422, str(exc), param="outputs") from None
        texts = self.tasks.texts_of(body.inputs)
        model, info = await self.tasks.model_for(body.model, outputs[-1])
        for output in outputs[:-1]:
            await self.tasks.model_for(model.name, output)
        options = Asked(
            prompt_name=checked_prompt_name(body.prompt_name, info),
            truncation_direction=direction(body.truncation_direction),
            outputs=outputs,
        )
        self.api.bounds.request(model, info, texts, options, costs.JSON_FLOAT_BYTES)
        call = http_call(request)
        if not self.api.settings.cuts(body.truncate):
            await self.api.refuse_over_long(call, model, info, texts, options, chunkable=False)
        reply = await self.api.encode(call, model, texts, options)
        dims = {"embed": info.get("output_dim"), "multivector": info.get("multivector_dim")}
        answers = late.unpack_outputs(reply.array(), outputs, dims)
        return json_response([_json(answer) for answer in answers])


def _json(answer: dict[str, Any]) -> dict[str, Any]:
    """One input's outputs as JSON values: a sparse vector as TEI's ``{index, value}`` terms."""
    out = dict(answer)
    if "sparse" in out:
        terms = out["sparse"]
        out["sparse"] = [{"index": int(i), "value": float(v)} for i, v in zip(terms.indices, terms.values, strict=True)]
    return out
