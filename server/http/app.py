"""The HTTP API: OpenAI's ``/v1/embeddings``, TEI's ``/embed``, bert-as-service's ``/encode``,
health, readiness, status and Prometheus metrics, as a FastAPI application.

Every encode request goes to the ventilator through the :class:`~.gateway.Gateway`, so HTTP
callers share the server's batching, bounds and turns with ZeroMQ clients. Inputs are
checked (:mod:`.schemas`), with messages that name the element at fault, before anything is
sent. The server's error kinds map to status codes (:data:`~.schemas.STATUS_OF_KIND`); each
API answers errors in its own format. Every request passes :class:`~.front.Front` first.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from bertserve.client import __version__
from bertserve.client import protocol as p
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from .. import metrics
from .bodies import BodyBudget
from .front import Front, caller
from .gateway import Gateway, GatewayError
from .principals import Principals
from .schemas import (
    STATUS_OF_KIND,
    EmbeddingRequest,
    EmbedRequest,
    EncodeRequest,
    HTTPError,
    checked_texts,
    chunked_count,
    error_response,
    json_response,
    openai_input,
)


@dataclass(frozen=True)
class Settings:
    """What the HTTP process needs to know about the server it fronts."""

    model_name: str
    aliases: tuple[str, ...]
    principals: Principals  # none: no key needed, and each peer address is a principal
    max_body_bytes: int
    max_bodies_bytes: int  # what the bodies in flight may hold at once (see .bodies)
    max_inputs: int
    request_timeout_s: float
    tokenizer: Any  # WordPieceTokenizer: finds over-long inputs, maps token ids back to tokens


def create_app(settings: Settings, gateway_factory: Callable[[], Awaitable[Gateway]]) -> FastAPI:
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        state["gateway"] = await gateway_factory()
        try:
            yield
        finally:
            await state["gateway"].close()

    app = FastAPI(
        title="bertserve", version=__version__, lifespan=lifespan,
        description="BERT sentence embeddings over HTTP: OpenAI-, TEI- and bert-as-service-compatible.",
    )  # fmt: skip
    app.add_middleware(
        Front, principals=settings.principals, limit=settings.max_body_bytes,
        budget=BodyBudget(settings.max_bodies_bytes),
    )  # fmt: skip

    def gateway() -> Gateway:
        return state["gateway"]

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError) -> Response:
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ())[1:] if part != "body") or "body"
        message = f"{where}: {first.get('msg', 'invalid request')}"
        return error_response(request.url.path, HTTPError(422, message, param=where))

    # -- encoding --

    def check_count(texts: list[Any]) -> list[Any]:
        if len(texts) > settings.max_inputs:
            raise HTTPError(413, f"the request has {len(texts)} inputs; this server takes at most "
                            f"{settings.max_inputs} per request")  # fmt: skip
        return texts

    async def encode(
        request: Request, texts: list[Any], *, is_tokenized: bool = False, long_inputs: str | None = None
    ) -> p.Reply:
        gw = gateway()
        try:
            reply = await gw.request(
                gw.client_id(caller(request)), p.ENCODE, texts, is_tokenized=is_tokenized, long_inputs=long_inputs,
                timeout_s=settings.request_timeout_s + 5,
            )  # fmt: skip
        except GatewayError as exc:
            raise HTTPError(504, f"the server did not answer in time: {exc}") from None
        if not reply.ok:
            kind = str(reply.header.get("kind", "internal"))
            raise HTTPError(STATUS_OF_KIND.get(kind, 500), str(reply.header.get("error")), code=kind)
        return reply

    async def model_info() -> dict[str, Any]:
        gw = gateway()
        if "output_dim" not in gw.config:  # asked before a worker was ready
            try:
                reply = await gw.request(gw.client_id("bertserve"), p.CONFIG, timeout_s=2.0)
            except GatewayError as exc:
                raise HTTPError(503, f"the server is not answering: {exc}") from None
            if reply.ok:
                gw.config = reply.header
        return gw.config

    async def server_status() -> dict[str, Any]:
        try:
            return await gateway().status()
        except GatewayError as exc:
            raise HTTPError(503, f"the server is not answering: {exc}") from None

    async def ready_or_503() -> None:
        if state.get("was_ready"):
            return  # once up, a server answers for itself: it queues while a worker restarts, 503s at shutdown
        if not (await server_status()).get("ready"):
            raise HTTPError(503, "the server is starting: no worker has loaded the model yet")
        state["was_ready"] = True

    @app.post("/v1/embeddings", summary="OpenAI-compatible embeddings")
    async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
        served = (settings.model_name, *settings.aliases)
        if body.model is not None and body.model not in served:
            raise HTTPError(404, f"the model {body.model!r} is not served here; this server serves "
                            f"{', '.join(map(repr, served))}", param="model", code="model_not_found")  # fmt: skip
        texts, is_tokenized = openai_input(body.input, settings.tokenizer)
        check_count(texts)
        await ready_or_503()
        info = await model_info()
        if info.get("token_level"):
            raise HTTPError(422, "this server returns one vector per token (pooling NONE); /v1/embeddings "
                            "needs one vector per input")  # fmt: skip
        dim = info.get("output_dim")
        if body.dimensions is not None and body.dimensions != dim:
            raise HTTPError(422, f"dimensions={body.dimensions} is not supported: this model's vectors have {dim} "
                            "dimensions", param="dimensions")  # fmt: skip
        reply = await encode(request, texts, is_tokenized=is_tokenized, long_inputs=body.long_inputs)
        vectors = reply.array().astype("<f4", copy=False)
        tokens = int(reply.header.get("token_count", 0))  # counted by the workers' tokenizer
        if body.encoding_format == "base64":
            data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(row.tobytes()).decode()}
                    for i, row in enumerate(vectors)]  # fmt: skip
        else:
            data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(vectors)]
        return json_response({
            "object": "list", "data": data, "model": body.model or settings.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "chunked_inputs": chunked_count(reply),
        }, reply)  # fmt: skip

    @app.get("/v1/models", summary="The served model and its aliases (OpenAI-compatible)")
    async def models() -> Response:
        created = int(time.time())
        names = (settings.model_name, *settings.aliases)
        data = [{"id": name, "object": "model", "created": created, "owned_by": "bertserve"} for name in names]
        return json_response({"object": "list", "data": data})

    @app.post("/embed", summary="Text Embeddings Inference-compatible embeddings")
    async def embed(body: EmbedRequest, request: Request) -> Response:
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        texts = check_count(checked_texts(texts, "inputs"))
        await ready_or_503()
        info = await model_info()
        if info.get("token_level"):
            raise HTTPError(422, "this server returns one vector per token (pooling NONE); /embed needs one per input")
        if not body.normalize and info.get("normalize"):
            raise HTTPError(422, "this server's model L2-normalizes its vectors; normalize=false is not available")
        if not body.truncate and body.long_inputs != "chunk":
            over = await asyncio.to_thread(settings.tokenizer.truncated, texts)
            if over.any():
                first = int(np.argmax(over))
                raise HTTPError(413, f"inputs[{first}] is longer than the {settings.tokenizer.max_len} tokens this "
                                "server takes; pass truncate=true to cut it, or long_inputs=chunk")  # fmt: skip
        reply = await encode(request, texts, long_inputs=body.long_inputs)
        vectors = reply.array().astype(np.float32, copy=False)
        if body.normalize and not info.get("normalize"):
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return json_response(vectors, reply)

    @app.post("/encode", summary="bert-as-service-compatible encoding")
    async def encode_legacy(body: EncodeRequest, request: Request) -> Response:
        texts = check_count(checked_texts(body.texts, "texts", is_tokenized=body.is_tokenized))
        await ready_or_503()
        reply = await encode(request, texts, is_tokenized=body.is_tokenized, long_inputs=body.long_inputs)
        result = reply.array().astype(np.float32, copy=False)
        return json_response({"id": body.id, "result": result, "chunked": chunked_count(reply)}, reply)

    # -- operations --

    @app.get("/health", summary="Liveness: 200 while this process serves")
    async def health() -> Response:
        return json_response({"status": "ok"})

    @app.get("/ready", summary="Readiness: 200 while a worker has the model loaded, else 503")
    async def ready() -> Response:
        if not (await server_status()).get("ready"):
            raise HTTPError(503, "no worker has the model loaded: the server is starting, or its workers restart")
        return json_response({"status": "ready"})

    @app.get("/status", summary="The server's status, as `bertserve status` shows it")
    async def status() -> Response:
        return json_response(await server_status())

    @app.get("/metrics", summary="Prometheus metrics of every server process")
    async def prometheus() -> Response:
        body, content_type = await asyncio.to_thread(metrics.render)
        return Response(body, media_type=content_type)

    return app
