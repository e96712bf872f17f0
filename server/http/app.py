"""The HTTP API: OpenAI's ``/v1/embeddings``, TEI's ``/embed`` and ``/tokenize``,
bert-as-service's ``/encode``, health, readiness, status and Prometheus metrics, as a FastAPI
application.

Every encode request goes to the ventilator through the :class:`~.gateway.Gateway`, so HTTP
callers share the server's batching, bounds and turns with ZeroMQ clients. A request's
``model`` field picks one of the served models (:class:`~.catalog.Catalog`; without it, the
default one), whose tokenizer and ``CONFIG`` answer its checks use. Inputs and options
are checked (:mod:`.schemas`, :mod:`.options`), with messages that name the element at fault,
before anything is sent. Each request carries the HTTP request timeout as its deadline, and
is withdrawn from the server if its caller disconnects while it waits (:mod:`.disconnects`).
The server's error kinds map to status codes (:data:`~.schemas.STATUS_OF_KIND`); each API
answers errors in its own format. Every request passes :class:`~.front.Front` first.
``/docs`` (Swagger UI) and ``/redoc`` load their scripts and styles from this server
(:data:`DOCS_ASSETS`, the files the ``fastapi-offline`` package ships), not from a CDN, so
they work on a machine without internet access.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from bertserve.client import __version__, protocol as p
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi_offline import FastAPIOffline

from .. import metrics, tracing
from . import compact
from .bounds import Bounds
from .catalog import Catalog, ModelSettings
from .disconnects import Call, ClientGone, unless_disconnected
from .front import http_call
from .gateway import FrameTooLarge, Gateway, GatewayError
from .late import LateEndpoints
from .layers import add_layers
from .lengths import check_text_limits, first_over_long, over_long
from .options import Asked, asked, prompt_text, prompted
from .schemas import (
    CLIENT_CLOSED,
    STATUS_OF_KIND,
    EmbeddingRequest,
    EncodeRequest,
    HTTPError,
    checked_texts,
    chunked_count,
    http_error,
    invalid,
    json_response,
    openai_input,
)
from .settings import Settings
from .tasks import TaskEndpoints
from .tei import TEIEndpoints
from .turns import Tokenizing

DOCS_ASSETS = "/docs/assets"
"""Where Swagger UI's and ReDoc's JavaScript, CSS and icon are served from."""


def create_app(settings: Settings, gateway_factory: Callable[[], Awaitable[Gateway]]) -> FastAPI:
    api = Endpoints(settings)
    tasks = TaskEndpoints(api)
    late = LateEndpoints(api, tasks)
    tei = TEIEndpoints(api, tasks, late)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        await api.open(gateway_factory)
        try:
            yield
        finally:
            await api.close()

    app = FastAPIOffline(  # FastAPI, with /docs and /redoc on local copies of their assets
        title="bertserve",
        version=__version__,
        lifespan=lifespan,
        static_url=DOCS_ASSETS,
        description="BERT sentence embeddings over HTTP: OpenAI-, TEI- and bert-as-service-compatible.",
    )
    app.add_exception_handler(HTTPError, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, invalid)  # type: ignore[arg-type]
    routes: list[tuple[str, str, Callable[..., Any], str]] = [
        ("POST", "/v1/embeddings", api.embeddings, "OpenAI-compatible embeddings"),
        (
            "GET",
            "/v1/models",
            api.models,
            "The served models, the default first (OpenAI-compatible), with their prompts",
        ),
        (
            "POST",
            "/",
            tei.root,
            "Text Embeddings Inference's root: /embed, /rerank, /predict or /embed_sparse, by task",
        ),
        (
            "POST",
            "/invocations",
            tei.root,
            "The root's answer, at SageMaker's path, as Text Embeddings Inference has it",
        ),
        ("POST", "/embed", tei.embed, "Text Embeddings Inference-compatible embeddings"),
        ("POST", "/similarity", tei.similarity, "Text Embeddings Inference-compatible sentence similarity (cosines)"),
        (
            "POST",
            "/tokenize",
            tei.tokenize,
            "Text Embeddings Inference-compatible tokenization, with the model's tokenizer",
        ),
        ("POST", "/encode", api.encode_legacy, "bert-as-service-compatible encoding"),
        ("POST", "/rerank", tasks.tei_rerank, "Text Embeddings Inference-compatible rerank, with a cross-encoder"),
        ("POST", "/v1/rerank", tasks.cohere_rerank, "Cohere- and Jina-compatible rerank, with a cross-encoder"),
        ("POST", "/v2/rerank", tasks.cohere_rerank, "Cohere-compatible rerank (API v2), with a cross-encoder"),
        ("POST", "/predict", tasks.predict, "Text Embeddings Inference-compatible sequence classification"),
        ("POST", "/embed_sparse", tasks.embed_sparse, "Text Embeddings Inference-compatible sparse (SPLADE) vectors"),
        ("POST", "/embed_all", tasks.embed_all, "Text Embeddings Inference-compatible token vectors (pooling NONE)"),
        ("POST", "/embed_multivector", late.embed_multivector, "Multi-vectors of a ColBERT or BGE-M3 model"),
        ("POST", "/embed_outputs", late.embed_outputs, "Several outputs of BGE-M3 from one model run"),
        ("GET", "/health", api.health, "Liveness: 200 while this process serves"),
        ("GET", "/ready", api.ready, "Readiness: 200 while every served model has a worker with it loaded, else 503"),
        ("GET", "/status", api.status, "The server's status, as `bertserve status` shows it"),
        ("GET", "/metrics", api.prometheus, "Prometheus metrics of every server process"),
    ]
    for method, path, endpoint, summary in routes:
        app.add_api_route(path, endpoint, methods=[method], summary=summary)
    add_layers(app, settings)  # once the routes are there: the traces name them
    return app


class Endpoints:
    """The HTTP API's endpoints, over one gateway to the ventilator opened with the app."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tokenizing = Tokenizing()
        self._gateway: Gateway | None = None
        self._catalog: Catalog | None = None
        self._bounds: Bounds | None = None
        self._was_ready = False

    async def open(self, gateway_factory: Callable[[], Awaitable[Gateway]]) -> None:
        self._gateway = await gateway_factory()
        self._catalog = Catalog(self.settings.models, self._gateway)
        limit = self._gateway.config.get("max_message_bytes")
        self._bounds = Bounds(
            request_tokens=self.settings.max_request_tokens,
            reply_bytes=self.settings.max_reply_bytes,
            message_bytes=limit if isinstance(limit, int) and not isinstance(limit, bool) else None,
        )

    async def close(self) -> None:
        if self._gateway is not None:
            await self._gateway.close()

    @property
    def gateway(self) -> Gateway:
        assert self._gateway is not None, "the app's lifespan opens the gateway before any request"
        return self._gateway

    @property
    def catalog(self) -> Catalog:
        assert self._catalog is not None, "the app's lifespan opens the catalog before any request"
        return self._catalog

    @property
    def bounds(self) -> Bounds:
        """What a request may cost (:mod:`.bounds`), known once the head has said its frame limit."""
        assert self._bounds is not None, "the app's lifespan sets the bounds before any request"
        return self._bounds

    # -- encoding --

    def within_limits(self, texts: list[Any], name: str) -> list[Any]:
        """``texts`` if within the request and text size limits: checked before anything tokenizes them."""
        settings = self.settings
        return check_text_limits(texts, name, max_inputs=settings.max_inputs, max_chars=settings.max_text_chars)

    async def tokenized(self, call: Call, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``work`` run in the tokenizing pool, in a turn of the call's owner; a 499 if the
        caller leaves first (a turn not begun is given up, none is begun after)."""
        turn = self.tokenizing.run(work, *args, owner=call.owner, **kwargs)
        try:
            return await unless_disconnected(turn, call.left())
        except ClientGone:
            raise HTTPError(
                CLIENT_CLOSED, "the client closed the connection; its request was withdrawn", code="cancelled"
            ) from None

    async def encode(
        self,
        call: Call,
        model: ModelSettings,
        texts: list[Any],
        options: Asked,
        *,
        is_tokenized: bool = False,
    ) -> p.Reply:
        """The reply to ``texts``, within the request timeout or the call's deadline if sooner."""
        gw = self.gateway
        timeout_s = call.timeout_s(self.settings.request_timeout_s)
        if timeout_s <= 0:
            raise HTTPError(504, "the call's deadline passed before its request was sent", code="expired")
        header = options.header(timeout_s)
        if self.settings.traced and (trace := tracing.current_traceparent()) is not None:
            header[p.TRACEPARENT_FIELD] = trace  # the head's span of it is this request's span's child
        ask = gw.request(
            gw.client_id(call.owner),
            p.ENCODE,
            texts,
            is_tokenized=is_tokenized,
            model=model.name,
            options=header,
            timeout_s=timeout_s + 5,
        )
        try:
            reply = await unless_disconnected(ask, call.left())
        except FrameTooLarge as exc:
            raise HTTPError(413, str(exc), code="limit") from None
        except GatewayError as exc:
            if gw.closed:  # this front end is stopping: the head has answered all it will
                raise HTTPError(503, "the server is shutting down", code="shutdown") from None
            raise HTTPError(504, f"the server did not answer in time: {exc}") from None
        except ClientGone:  # nobody reads this answer; the metrics count it
            raise HTTPError(
                CLIENT_CLOSED, "the client closed the connection; its request was withdrawn", code="cancelled"
            ) from None
        if not reply.ok:
            kind = str(reply.header.get("kind", "internal"))
            unknown = kind == p.UNKNOWN_MODEL  # the head serves other models than this process knows: as any unknown
            raise HTTPError(
                STATUS_OF_KIND.get(kind, 500),
                str(reply.header.get("error")),
                param="model" if unknown else None,
                code="model_not_found" if unknown else kind,
            )
        return reply

    async def server_status(self) -> dict[str, Any]:
        try:
            return await self.gateway.status()
        except GatewayError as exc:
            raise HTTPError(503, f"the server is not answering: {exc}") from None

    async def ready_or_503(self) -> None:
        if self._was_ready:
            return  # once up, a server answers for itself: it queues while a worker restarts, 503s at shutdown
        if not (await self.server_status()).get("ready"):
            raise HTTPError(503, "the server is starting: not every model has a worker with it loaded yet")
        self._was_ready = True

    async def embeddings(self, body: EmbeddingRequest, request: Request) -> Response:
        model = self.catalog.pick(body.model, "embed")
        texts, is_tokenized = openai_input(body.input, model.tokenizer, token_ids=self.settings.token_id_input)
        self.within_limits(texts, "input")
        await self.ready_or_503()
        info = await self.catalog.info(model)
        if info.get("token_level"):
            raise HTTPError(
                422,
                f"the model {model.name!r} returns one vector per token (pooling NONE); "
                "/v1/embeddings needs one vector per input",
            )
        types = compact.requested(body.embedding_types) or ("float",)
        options = asked(body, info)
        self.bounds.request(model, info, texts, options, compact.json_value_bytes(types, body.encoding_format))
        call = http_call(request)
        truncated = await self.cut_or_refused(call, model, info, texts, options, body.truncate, is_tokenized)
        reply = await self.encode(call, model, texts, options, is_tokenized=is_tokenized)
        vectors = reply.array().astype("<f4", copy=False)
        tokens = int(reply.header.get("token_count", 0))  # counted by the workers' tokenizer, prompts included
        data: list[dict[str, Any]] = [{"object": "embedding", "index": i} for i in range(len(vectors))]
        answered = {
            kind: compact.encoded(array, body.encoding_format)
            for kind, array in compact.forms(vectors, types, info).items()
        }
        for i, item in enumerate(data):
            item["embedding"] = answered[types[0]][i]
            if body.embedding_types is not None:
                item["embeddings"] = {kind: rows[i] for kind, rows in answered.items()}
        computed = reply.header.get("model")  # the head names the model that ran it
        if not isinstance(computed, str):
            computed = model.name
        named = body.model if body.model in model.aliases else computed  # an alias asked for is echoed, as OpenAI does
        return json_response(
            {
                "object": "list",
                "data": data,
                "model": named,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "chunked_inputs": chunked_count(reply),
                "truncated_inputs": truncated,
            },
            reply,
            truncated=truncated,
        )

    async def models(self) -> Response:
        return json_response({"object": "list", "data": await self.catalog.listed()})

    async def cut_or_refused(
        self,
        call: Call,
        model: ModelSettings,
        info: dict[str, Any],
        texts: list[Any],
        options: Asked,
        truncate: bool | None,
        is_tokenized: bool,
    ) -> int:
        """How many of ``texts`` (``/v1/embeddings``'s) the model will cut to its length; 413
        for the first, unless the request lets it cut them: with ``truncate``, or
        ``long_inputs=truncate``, or on a server started with ``--auto-truncate``. Inputs
        encoded in windows (``long_inputs=chunk``) are not cut."""
        if options.long_inputs == "chunk" or (options.long_inputs is None and info.get("long_inputs") == "chunk"):
            return 0
        allowed = options.long_inputs == "truncate" or self.settings.cuts(truncate)
        tokenizer = model.tokenizer
        if is_tokenized:
            room = tokenizer.max_len - tokenizer.num_special_tokens()
            over = [i for i, tokens in enumerate(texts) if len(tokens) > room]
        else:
            over = await self.tokenized(
                call, over_long, tokenizer, prompted(texts, options.prompt_name, info), first=not allowed
            )
        if over and not allowed:
            raise HTTPError(
                413,
                f"input[{over[0]}] is longer than the {tokenizer.max_len} tokens the model {model.name!r} takes; "
                "ask for truncation with truncate=true (the answer's truncated_inputs counts the inputs cut), "
                "or long_inputs=chunk to encode it whole in windows",
                param="input",
                code="context_length_exceeded",
            )
        return len(over)

    async def refuse_over_long(
        self,
        call: Call,
        model: ModelSettings,
        info: dict[str, Any],
        texts: list[str],
        options: Asked,
        *,
        chunkable: bool = True,
    ) -> None:
        """413 for the first input longer than ``model`` takes, the prompt the workers put
        before it counted (``info``: the model's ``CONFIG`` answer)."""
        prompt = prompt_text(options.prompt_name, info)
        first = await self.tokenized(call, first_over_long, model.tokenizer, prompted(texts, options.prompt_name, info))
        if first is not None:
            with_prompt = " with its prompt" if prompt else ""
            raise HTTPError(
                413,
                f"inputs[{first}] is longer{with_prompt} than the {model.tokenizer.max_len} tokens "
                f"the model {model.name!r} takes; pass truncate=true to cut it"
                + (", or long_inputs=chunk" if chunkable else ""),
            )

    async def encode_legacy(self, body: EncodeRequest, request: Request) -> Response:
        model = self.catalog.pick(body.model, "embed")
        texts = self.within_limits(checked_texts(body.texts, "texts", is_tokenized=body.is_tokenized), "texts")
        await self.ready_or_503()
        info = await self.catalog.info(model)
        options = asked(body, info)
        self.bounds.request(model, info, texts, options)
        reply = await self.encode(http_call(request), model, texts, options, is_tokenized=body.is_tokenized)
        result = reply.array().astype(np.float32, copy=False)
        return json_response({"id": body.id, "result": result, "chunked": chunked_count(reply)}, reply)

    # -- operations --

    async def health(self) -> Response:
        return json_response({"status": "ok"})

    async def ready(self) -> Response:
        status = await self.server_status()
        if status.get("stopping"):
            raise HTTPError(503, "the server is shutting down", code="shutdown")
        if not status.get("ready"):
            raise HTTPError(
                503, "not every model has a worker with it loaded: the server is starting, or its workers restart"
            )
        return json_response({"status": "ready"})

    async def status(self) -> Response:
        return json_response(await self.server_status())

    async def prometheus(self) -> Response:
        body, content_type = await asyncio.to_thread(metrics.render)
        return Response(body, media_type=content_type)
