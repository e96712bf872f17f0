"""The task endpoints: rerank (TEI's ``/rerank``; Cohere's and Jina's ``/v1/rerank`` and
``/v2/rerank``), classification (``/predict``), sparse vectors (``/embed_sparse``), token
vectors (``/embed_all``); a late-interaction model's are in :mod:`.late`.

Each is an ENCODE request like any other, with the task it asks for in its header, so it
shares the server's batching, fairness, deadlines and bounds: a rerank of one query and N
documents is one request of N sentence pairs (:func:`bertserve.client.tasks.rerank_pair`),
merged with other requests' pairs. The head refuses a request whose task is not its model's;
this process refuses it first, with a 400 that names the model's task. A pair longer than the
model takes is cut the longer side first, as sentence-transformers' CrossEncoder cuts it (the
document, for a query shorter than half the length), and the result says ``truncated``, as
the workers that tokenized the pair said it with its score.

Every endpoint counts a request's cost before it tokenizes or sends anything
(:mod:`..serving.policy.costs`): its tokens of model work (a rerank's query in every pair)
against ``--max-request-tokens``, and its answer against ``--max-reply-bytes`` (a sparse
answer at every vocabulary entry until the workers' terms are known; then its JSON).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

import numpy as np
from bertserve.client import tasks as t
from bertserve.client.protocol import Reply
from fastapi import Request
from fastapi.responses import Response

from ..model.tasks import answers, wrong_task
from ..serving.policy import costs
from .bounds import Bounds
from .catalog import Catalog, ModelSettings
from .disconnects import Call
from .front import http_call
from .lengths import check_pair_limits, first_cut_pair, rerank_sides
from .options import Asked, checked_prompt_name, direction, prompted
from .schemas import HTTPError, json_response
from .settings import Settings
from .task_bodies import (
    CohereRerankRequest,
    EmbedAllRequest,
    PredictRequest,
    SparseRequest,
    TEIRerankRequest,
    classification_parameters,
    document_texts,
    one_text,
    predict_inputs,
    top,
)


class API(Protocol):
    """What the task endpoints use of the embedding API (:class:`.app.Endpoints`)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def bounds(self) -> Bounds: ...
    def within_limits(self, texts: list[Any], name: str) -> list[Any]: ...
    async def tokenized(self, call: Call, work: Any, *args: Any, **kwargs: Any) -> Any: ...
    async def ready_or_503(self) -> None: ...
    async def encode(
        self,
        call: Call,
        model: ModelSettings,
        texts: list[Any],
        options: Asked,
        *,
        is_tokenized: bool = False,
    ) -> Reply: ...
    async def refuse_over_long(
        self,
        call: Call,
        model: ModelSettings,
        info: dict[str, Any],
        texts: list[str],
        options: Asked,
        *,
        chunkable: bool = True,
    ) -> None: ...


class TaskEndpoints:
    """The task endpoints, over the embedding API's gateway, catalog and checks."""

    def __init__(self, api: API) -> None:
        self.api = api

    async def model_for(self, name: str | None, task: str) -> tuple[ModelSettings, dict[str, Any]]:
        """The model ``name`` picks and its ``CONFIG`` answer, once ready; 400 unless its task is ``task``."""
        model = self.api.catalog.pick(name, task)
        await self.api.ready_or_503()
        info = await self.api.catalog.info(model)
        if not answers(info, task):
            served = self.api.catalog.of_task(task)
            own = str(info.get("task", "embed"))
            raise HTTPError(400, wrong_task(model.name, own, task, served), param="model", code="task")
        return model, info

    async def truncated(
        self, call: Call, model: ModelSettings, texts: list[str], name: str, *, refuse: bool
    ) -> np.ndarray:
        """Which of ``texts`` the model cuts; with ``refuse`` a 413 for the first."""
        truncated = await self.api.tokenized(call, model.tokenizer.truncated, texts)
        if refuse and truncated.any():
            raise _too_long(model, name, int(np.argmax(truncated)))
        return truncated

    async def rerank_logits(
        self,
        call: Call,
        name: str | None,
        query: Any,
        documents: Any,
        field: str,
        *,
        direction_: str | None,
        refuse_long: bool = False,
    ) -> tuple[ModelSettings, dict[str, Any], np.ndarray, np.ndarray, int]:
        """The logits of ``documents`` against ``query``, which pairs the model cut, and the tokens.

        Its cost is counted before anything is tokenized, the query in every pair. A long
        query or document is tokenized once here and cut to what its pairs keep of it
        (:func:`~.lengths.rerank_sides`), so the workers never tokenize a long side whole
        again, once for each pair. Which pairs are cut, the workers say with the scores (the
        reply's ``truncated``); only a request that refuses over-long pairs (``truncate:
        false``) has its pairs tokenized here, to be refused before anything is sent."""
        try:
            query, texts = t.rerank_sides(query, documents)
        except ValueError as exc:
            raise HTTPError(422, str(exc).replace("documents", field), param=field) from None
        settings = self.api.settings
        check_pair_limits(query, texts, field, max_inputs=settings.max_inputs, max_chars=settings.max_text_chars)
        model, info = await self.model_for(name, "rerank")
        rule = model.token_rule
        self.api.bounds.reply(len(texts), info, costs.JSON_FLOAT_BYTES, form=" as JSON")
        self.api.bounds.tokens(costs.pair_tokens(rule, costs.utf8_bytes(query), map(costs.utf8_bytes, texts)))

        async def turn(work: Any, *args: Any) -> Any:
            return await self.api.tokenized(call, work, *args)

        late = bool(info.get("late"))  # MaxSim: the workers cut the query and each document on its own
        if not late:
            query, texts = await rerank_sides(turn, model.tokenizer, query, texts, direction_ or "right")
            if refuse_long and (first := await first_cut_pair(turn, model.tokenizer, query, texts)) is not None:
                raise _too_long(model, field, first)
        self.api.bounds.frame(len(texts) * (costs.utf8_bytes(query) + 8) + sum(map(costs.utf8_bytes, texts)))
        pairs = [t.rerank_pair(query, document) for document in texts]
        reply = await self.api.encode(call, model, pairs, Asked(truncation_direction=direction_, task="rerank"))
        logits = reply.array().astype(np.float32, copy=False).reshape(len(pairs), -1)[:, 0]
        cut = _pairs_cut(reply, len(pairs))
        if refuse_long and late and cut.any():
            raise _too_long(model, field, int(np.argmax(cut)), late=True)
        return model, info, logits, cut, int(reply.header.get("token_count", 0))

    async def tei_rerank(self, body: TEIRerankRequest, request: Request) -> Response:
        top_n = top(body.top_n, "top_n")
        if (body.texts is None) == (body.documents is None):
            raise HTTPError(
                422, "give the documents as texts (TEI's shape) or as documents (Infinity's)", param="texts"
            )
        field = "texts" if body.texts is not None else "documents"
        texts = body.texts if body.texts is not None else body.documents
        model, info, logits, truncated, tokens = await self.rerank_logits(
            http_call(request),
            body.model,
            body.query,
            texts,
            field,
            direction_=direction(body.truncation_direction),
            refuse_long=body.truncate is False,
        )
        if body.documents is not None:
            scores = logits if body.raw_scores else t.activate(logits, str(info.get("activation", "identity")))
            return json_response(
                {
                    "object": "rerank",
                    "id": str(uuid.uuid4()),
                    "created": int(time.time()),
                    "model": body.model or model.name,
                    "results": [
                        {
                            "index": index,
                            "relevance_score": float(scores[index]),
                            "document": texts[index] if body.return_documents else None,
                            "truncated": bool(truncated[index]),
                        }
                        for index in t.ranking(scores, top_n)
                    ],
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                }
            )
        scores = logits if body.raw_scores else t.activate(logits, str(info.get("activation", "identity")))
        results = []
        for index in t.ranking(scores, top_n):
            item: dict[str, Any] = {"index": index, "score": float(scores[index])}
            if body.return_text:
                item["text"] = body.texts[index]
            item["truncated"] = bool(truncated[index])
            results.append(item)
        return json_response(results)

    async def cohere_rerank(self, body: CohereRerankRequest, request: Request) -> Response:
        top_n = top(body.top_n, "top_n")
        texts = document_texts(body.documents)
        model, info, logits, truncated, tokens = await self.rerank_logits(
            http_call(request), body.model, body.query, texts, "documents", direction_=None
        )
        scores = t.activate(logits, str(info.get("activation", "identity")))
        results = []
        for index in t.ranking(scores, top_n):
            item: dict[str, Any] = {"index": index, "relevance_score": float(scores[index])}
            if body.return_documents:
                item["document"] = {"text": texts[index]}
            item["truncated"] = bool(truncated[index])
            results.append(item)
        return json_response(
            {
                "id": str(uuid.uuid4()),
                "model": body.model or model.name,
                "results": results,
                "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
                "usage": {"total_tokens": tokens},
                "created": int(time.time()),
            }
        )

    async def predict(self, body: PredictRequest, request: Request) -> Response:
        texts, single = predict_inputs(body.inputs)
        top_k, function = classification_parameters(body.parameters)
        logits, labels, _ = await self.classified(http_call(request), texts, body)
        scores = logits if body.raw_scores or function == "none" else t.label_probabilities(logits)
        if function == "sigmoid" and not body.raw_scores:
            scores = 1.0 / (1.0 + np.exp(-logits))
        answers = [[{"label": labels[j], "score": float(row[j])} for j in t.ranking(row, top_k)] for row in scores]
        # one input's labels as a list, as TEI answers; with parameters (huggingface_hub's shape) as the
        # Inference API answers it, a list of one list, of which huggingface_hub reads the first
        return json_response(answers[0] if single and body.parameters is None else answers)

    async def classified(
        self, call: Call, texts: list[str], body: PredictRequest
    ) -> tuple[np.ndarray, list[str], Reply]:
        """The logits of ``texts`` (inputs of :func:`predict_inputs`) by the classifier ``body``
        names, its labels, and the reply they came in."""
        self.api.within_limits(texts, "inputs")
        model, info = await self.model_for(body.model, "classify")
        options = Asked(truncation_direction=direction(body.truncation_direction), task="classify")
        self.api.bounds.request(model, info, texts, options, costs.JSON_FLOAT_BYTES + 24)  # each label's name and score
        if not self.api.settings.cuts(body.truncate):
            await self.truncated(call, model, texts, "inputs", refuse=True)
        reply = await self.api.encode(call, model, texts, options)
        logits = reply.array().astype(np.float32, copy=False).reshape(len(texts), -1)
        labels = [str(label) for label in info.get("labels") or ()] or [f"LABEL_{i}" for i in range(logits.shape[1])]
        return logits, labels, reply

    async def embed_sparse(self, body: SparseRequest, request: Request) -> Response:
        top_k = top(body.top_k, "top_k")
        rows, _ = await self.sparse(http_call(request), body, top_k)
        terms = sum(len(row.indices) for row in rows)  # counted before at every vocabulary entry: now known
        self.api.bounds.answer(
            terms * costs.JSON_SPARSE_TERM_BYTES, "send fewer inputs per request, or ask for each one's top_k terms"
        )
        return json_response(
            [
                [{"index": int(i), "value": float(v)} for i, v in zip(row.indices, row.values, strict=True)]
                for row in rows
            ]
        )

    async def sparse(self, call: Call, body: SparseRequest, top_k: int | None = None) -> tuple[list[Any], Reply]:
        """The sparse rows of ``body``'s inputs (each its term indexes and weights), and their reply."""
        texts = self.texts_of(body.inputs)
        model, info = await self.model_for(body.model, "sparse")
        options = await self.prompted_options(call, model, info, texts, body, "sparse")
        reply = await self.api.encode(call, model, texts, options)
        return t.sparse_rows(reply.array(), top_k), reply

    async def embed_all(self, body: EmbedAllRequest, request: Request) -> Response:
        rows, _ = await self.token_vectors(http_call(request), body)
        return json_response(rows)

    async def token_vectors(self, call: Call, body: EmbedAllRequest) -> tuple[list[np.ndarray], Reply]:
        """Each of ``body``'s inputs' token vectors (one row a token, specials included), and their reply."""
        texts = self.texts_of(body.inputs)
        model, info = await self.model_for(body.model, "embed")
        if not info.get("token_level"):
            raise HTTPError(
                422,
                f"the model {model.name!r} pools its tokens into one vector: /embed_all answers a model served "
                "with pooling_strategy=NONE (serve the same directory again: --model NAME=DIR,pooling_strategy=NONE)",
                param="model",
            )
        options = await self.prompted_options(call, model, info, texts, body, "embed")
        counts = await self.api.tokenized(
            call, model.tokenizer.count_tokens, prompted(texts, options.prompt_name, info)
        )
        reply = await self.api.encode(call, model, texts, options)
        vectors = reply.array().astype(np.float32, copy=False)
        return [vectors[i, : int(n)] for i, n in enumerate(counts)], reply

    def texts_of(self, inputs: Any) -> list[str]:
        """TEI's ``inputs``: a text or a non-empty list of texts, each one sentence."""
        texts = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(texts, list) or not texts:
            raise HTTPError(422, "inputs must be a text or a non-empty list of texts", param="inputs")
        self.api.within_limits(texts if all(isinstance(x, str) for x in texts) else [], "inputs")
        return [one_text(item, f"inputs[{i}]") for i, item in enumerate(texts)]

    async def prompted_options(
        self, call: Call, model: ModelSettings, info: dict[str, Any], texts: list[str], body: Any, task: str
    ) -> Asked:
        """The options of a request of ``texts`` with a prompt, checked; its cost counted
        (a sparse answer at every vocabulary entry, as the workers may send it); and, unless
        it asks for truncation, a 413 for the first input longer than the model takes."""
        options = Asked(
            prompt_name=checked_prompt_name(body.prompt_name, info),
            truncation_direction=direction(body.truncation_direction),
            task=task,
        )
        if task == "sparse":
            self.api.bounds.request(model, info, texts, options, costs.SPARSE_TERM_BYTES)
        else:
            self.api.bounds.request(model, info, texts, options)
        if not self.api.settings.cuts(body.truncate):
            await self.api.refuse_over_long(call, model, info, texts, options, chunkable=task == "embed")
        return options


def _too_long(model: ModelSettings, name: str, first: int, late: bool = False) -> HTTPError:
    what = f"is longer than the {model.tokenizer.max_len} tokens the model"
    if late:  # a late-interaction model's own lengths: its query's and its documents'
        what = "or the query is longer than the model"
    return HTTPError(413, f"{name}[{first}] {what} {model.name!r} takes; pass truncate=true to cut it", param=name)


def _pairs_cut(reply: Reply, count: int) -> np.ndarray:
    """Which of a rerank's ``count`` pairs the model cut, as its reply says (``truncated``: the
    indexes of the pairs cut); a 502 if it does not say it right."""
    cut = reply.header.get("truncated")
    flags = np.zeros(count, bool)
    if not isinstance(cut, list) or not all(type(i) is int and 0 <= i < count for i in cut):
        raise HTTPError(502, "the server's reply did not say which pairs the model cut", code="internal")
    flags[cut] = True
    return flags
