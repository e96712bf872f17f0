"""Text Embeddings Inference's own endpoints: ``/embed``, ``/tokenize``, ``/similarity``, and
``POST /`` (and ``/invocations``, SageMaker's), which TEI's clients post to. TEI serves one
model, and its router answers the root by that model's task: an embedder as ``/embed`` (as
``/similarity`` when TEI is told its task is sentence similarity), a reranker as ``/rerank``,
a classifier as ``/predict``, a SPLADE model as ``/embed_sparse``. Here the root reaches the
model the body names; else, where the body's shape says a task (:func:`shaped_task`), the
default model of that task; else the default model. It answers by that model's task the
same way; a body whose ``inputs`` is ``{"source_sentence", "sentences"}`` (what
``huggingface_hub``'s ``sentence_similarity`` posts) is answered as ``/similarity``.

``normalize`` is TEI's, true by default: unit-length vectors, and ``false`` a normalizing
model's vectors before its Normalize module, its Dense layers applied (the sink normalizes,
:func:`~..model.graph.serving_graph`). ``truncate`` left out follows ``--auto-truncate``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from bertserve.client import tasks as t
from bertserve.client.protocol import Reply
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from . import compact
from .disconnects import Call
from .front import http_call
from .lengths import explain_bounded, tokens_answered
from .options import asked, checked_prompt_name, direction, prompted
from .schemas import (
    EmbedRequest,
    HTTPError,
    SimilarityRequest,
    TokenizeRequest,
    checked_texts,
    json_response,
    not_json,
)
from .task_bodies import EmbedAllRequest, MultivectorRequest, PredictRequest, SparseRequest, TEIRerankRequest
from .tasks import API, TaskEndpoints

if TYPE_CHECKING:
    from .late import LateEndpoints


class TEIEndpoints:
    """TEI's endpoints, over the embedding API's gateway, catalog and checks, and the task
    endpoints the root answers for."""

    def __init__(self, api: API, tasks: TaskEndpoints, late: LateEndpoints | None = None) -> None:
        self.api, self.tasks, self.late = api, tasks, late

    async def embed(self, body: EmbedRequest, request: Request) -> Response:
        vectors, reply, info, types = await self.embedded(body, http_call(request))
        if types is None:
            return json_response(vectors, reply)
        answered = compact.forms(vectors, types, info)
        return json_response(answered[types[0]] if isinstance(body.embedding_types, str) else answered, reply)

    async def embedded(
        self, body: EmbedRequest, call: Call
    ) -> tuple[np.ndarray, Reply, dict[str, Any], tuple[str, ...] | None]:
        """``/embed``'s vectors, the reply they came in, the model's ``CONFIG`` answer, and the
        compact types asked for."""
        api = self.api
        model = api.catalog.pick(body.model, "embed")
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        texts = api.within_limits(checked_texts(texts, "inputs"), "inputs")
        await api.ready_or_503()
        info = await api.catalog.info(model)
        if info.get("token_level"):
            raise HTTPError(
                422, f"the model {model.name!r} returns one vector per token (pooling NONE); /embed needs one per input"
            )
        options = dataclasses.replace(asked(body, info), normalize=body.normalize)
        types = compact.requested(body.embedding_types)
        try:
            t.check_calibrated(types or (), body.normalize, info, "embedding_types")
        except ValueError as exc:
            raise HTTPError(422, str(exc), param="embedding_types") from None
        api.bounds.request(model, info, texts, options, compact.json_value_bytes(types))
        if not api.settings.cuts(body.truncate) and body.long_inputs != "chunk":
            await api.refuse_over_long(call, model, info, texts, options, chunkable=bool(info.get("chunking", True)))
        reply = await api.encode(call, model, texts, options)
        return reply.array().astype(np.float32, copy=False), reply, info, types

    async def similarity(self, body: SimilarityRequest, request: Request) -> Response:
        """The cosine of ``source_sentence``'s vector with each of ``sentences``'."""
        api = self.api
        pair = body.inputs
        if not isinstance(pair, dict) or set(pair) - {"source_sentence", "sentences"}:
            raise HTTPError(422, "inputs must be {source_sentence: text, sentences: [texts]}", param="inputs")
        source, others = pair.get("source_sentence"), pair.get("sentences")
        if not isinstance(source, str) or not isinstance(others, list) or not others:
            raise HTTPError(
                422,
                "inputs must hold source_sentence, a text, and sentences, a non-empty list of texts",
                param="inputs",
            )
        texts = api.within_limits(checked_texts([source, *others], "inputs"), "inputs")
        given = {key: value for key, value in body.model_dump().items() if value is not None}
        chosen = {**(body.parameters if isinstance(body.parameters, dict) else {}), **given}  # TEI's two places
        fields = ("truncate", "truncation_direction", "prompt_name", "model")
        try:
            embed = EmbedRequest.model_validate({key: chosen.get(key) for key in fields} | {"inputs": texts})
        except ValidationError as exc:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
        rows, reply, _, _ = await self.embedded(embed, http_call(request))  # normalized: their products are cosines
        return json_response(rows[1:] @ rows[0], reply)

    async def tokenize(self, body: TokenizeRequest, request: Request) -> Response:
        api = self.api
        model = api.catalog.pick(body.model)
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        texts = api.within_limits(checked_texts(texts, "inputs"), "inputs")
        info = await api.catalog.said(model)  # the prompts are the model's from the start; no worker is needed
        tokens = await api.tokenized(
            http_call(request),
            tokenized,
            model.tokenizer,
            prompted(texts, checked_prompt_name(body.prompt_name, info), info),
            add_special_tokens=body.add_special_tokens,
            truncate=bool(body.truncate),
            direction=direction(body.truncation_direction) or "right",
        )
        return json_response(tokens)

    async def root(self, request: Request) -> Response:
        """``POST /``: as the endpoint of the task of the model it reaches (the body's
        ``model``, else the default one)."""
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            raise not_json(exc) from None
        if not isinstance(body, dict):
            raise HTTPError(422, f"the body must be a JSON object, not {type(body).__name__}", param="body")
        name = body.get("model")
        if name is not None and not isinstance(name, str):
            raise HTTPError(422, "model must be a string", param="model")
        api = self.api
        model = api.catalog.pick(name, shaped_task(body))
        await api.ready_or_503()
        info = await api.catalog.info(model)
        task = str(info.get("task") or "embed")
        answer: tuple[type[BaseModel], Callable[[Any, Request], Awaitable[Response]]]
        if task == "embed" and isinstance(body.get("inputs"), dict):
            answer = SimilarityRequest, self.similarity
        elif task == "embed":
            answer = (EmbedAllRequest, self.tasks.embed_all) if info.get("token_level") else (EmbedRequest, self.embed)
        else:
            by_task: dict[str, tuple[type[BaseModel], Callable[[Any, Request], Awaitable[Response]]]] = {
                "rerank": (TEIRerankRequest, self.tasks.tei_rerank),
                "classify": (PredictRequest, self.tasks.predict),
                "sparse": (SparseRequest, self.tasks.embed_sparse),
            }
            if self.late is not None:
                by_task["multivector"] = (MultivectorRequest, self.late.embed_multivector)
            if task not in by_task:
                raise HTTPError(400, f"the root does not answer a {task} model here", param="model")
            answer = by_task[task]
        schema, endpoint = answer
        try:
            parsed = schema.model_validate({**body, "model": model.name})
        except ValidationError as exc:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
        return await endpoint(parsed, request)


def shaped_task(body: dict[str, Any]) -> str | None:
    """The task a root body's shape asks for, where it says: a rerank's ``query`` (TEI's
    ``/rerank``), huggingface_hub's ``text_classification`` (``parameters`` beside text
    inputs), ``sentence_similarity`` (``inputs`` of a source sentence and others); else None
    (the default model's)."""
    if "query" in body:
        return "rerank"
    if isinstance(body.get("inputs"), dict):
        return "embed"
    if "parameters" in body:
        return "classify"
    return None


def tokenized(
    tokenizer: Any, texts: list[str], *, add_special_tokens: bool, truncate: bool, direction: str
) -> list[list[dict[str, Any]]]:
    """``/tokenize``'s answer, refused with 413 before any token is made if it would hold more
    than :data:`~.lengths.TOKENIZE_TOKENS` (:mod:`.lengths`)."""
    tokens_answered(tokenizer, texts, add_special_tokens=add_special_tokens, truncate=truncate)
    return explain_bounded(
        tokenizer, texts, add_special_tokens=add_special_tokens, truncate=truncate, direction=direction
    )
