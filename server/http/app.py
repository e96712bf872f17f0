"""The HTTP API: OpenAI's ``/v1/embeddings``, TEI's ``/embed``, bert-as-service's ``/encode``,
health, readiness, status and Prometheus metrics, as a FastAPI application.

Every encode request goes to the ventilator through the :class:`~.gateway.Gateway`, so HTTP
callers share the server's batching, bounds and turns with ZeroMQ clients. Inputs are
checked here, with messages that name the element at fault, before anything is sent. The
server's error kinds map to status codes (:data:`STATUS_OF_KIND`); each API answers errors
in its own format.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson
from bertserve.client import __version__
from bertserve.client import protocol as p
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, SkipValidation
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import metrics
from .bodies import ARRAY_COST, COMMA_COST, OBJECT_COST, BodyBudget, parse_cost
from .gateway import Gateway, GatewayError
from .principals import Principals

CHUNKED_HEADER = "X-Chunked-Inputs"  # how many inputs were encoded in windows (long_inputs=chunk)
VERSION_HEADER = "X-Model-Version"  # the model version that made the vectors (a repository of versions)

STATUS_OF_KIND = {
    "input": 422, "protocol": 422, "limit": 413, "busy": 429, "timeout": 504, "shutdown": 503,
    "forbidden": 403, "duplicate": 409, "worker": 500, "internal": 500,
}  # fmt: skip
_OPENAI_TYPES = {401: "authentication_error", 404: "invalid_request_error", 413: "invalid_request_error",
                 422: "invalid_request_error", 429: "rate_limit_error"}  # fmt: skip
_OPEN_PATHS = {"/health", "/ready"}  # probes need no key
_PRINCIPAL = "bertserve.principal"  # the scope key of the principal's name, once its API key is checked
ANONYMOUS = "anonymous"  # the metrics' principal label on a server without keys


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


class HTTPError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


# -- request bodies (their schemas are what /docs shows; inputs are checked by hand, to name the element) --


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    input: SkipValidation[str | list[str] | list[int] | list[list[int]]] = Field(
        description="A string, a list of strings, a list of token ids, or a list of such lists"
    )
    model: str | None = Field(None, description="the served model's name or one of its aliases (GET /v1/models)")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="must be the model's own dimension if given")
    user: str | None = Field(
        None, description="accepted and ignored: the server's bounds and turns go by API key (without keys, by "
        "the caller's address), never by this field",
    )  # fmt: skip
    long_inputs: Literal["truncate", "chunk"] | None = Field(
        None,
        description="an input longer than the model takes: truncate it, or chunk it (encode it in windows and "
        "combine their vectors); by default what the server was started with",
    )


class EmbedRequest(BaseModel):
    """Text Embeddings Inference's ``/embed``."""

    inputs: SkipValidation[str | list[str]]
    normalize: bool = True
    truncate: bool = False
    long_inputs: Literal["truncate", "chunk"] | None = Field(
        None,
        description="an input longer than the model takes: truncate it, or chunk it (encode it in windows and "
        "combine their vectors); by default what the server was started with",
    )


class EncodeRequest(BaseModel):
    """bert-as-service's HTTP ``/encode``."""

    id: SkipValidation[Any] = None
    texts: SkipValidation[list[str] | list[list[str]]]
    is_tokenized: bool = False
    long_inputs: Literal["truncate", "chunk"] | None = Field(
        None,
        description="an input longer than the model takes: truncate it, or chunk it (encode it in windows and "
        "combine their vectors); by default what the server was started with",
    )


# -- the application ---------------------------------------------------------------------


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
        _Front, principals=settings.principals, limit=settings.max_body_bytes,
        budget=BodyBudget(settings.max_bodies_bytes),
    )  # fmt: skip

    def gateway() -> Gateway:
        return state["gateway"]

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError) -> Response:
        return _error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ())[1:] if part != "body") or "body"
        message = f"{where}: {first.get('msg', 'invalid request')}"
        return _error_response(request.url.path, HTTPError(422, message, param=where))

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
                gw.client_id(_caller(request)), p.ENCODE, texts, is_tokenized=is_tokenized, long_inputs=long_inputs,
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
        texts, is_tokenized = _openai_input(body.input, settings.tokenizer)
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
        return _json({
            "object": "list", "data": data, "model": body.model or settings.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "chunked_inputs": _chunked(reply),
        }, reply)  # fmt: skip

    @app.get("/v1/models", summary="The served model and its aliases (OpenAI-compatible)")
    async def models() -> Response:
        created = int(time.time())
        names = (settings.model_name, *settings.aliases)
        data = [{"id": name, "object": "model", "created": created, "owned_by": "bertserve"} for name in names]
        return _json({"object": "list", "data": data})

    @app.post("/embed", summary="Text Embeddings Inference-compatible embeddings")
    async def embed(body: EmbedRequest, request: Request) -> Response:
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        texts = check_count(_checked(texts, "inputs"))
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
        return _json(vectors, reply)

    @app.post("/encode", summary="bert-as-service-compatible encoding")
    async def encode_legacy(body: EncodeRequest, request: Request) -> Response:
        texts = check_count(_checked(body.texts, "texts", is_tokenized=body.is_tokenized))
        await ready_or_503()
        reply = await encode(request, texts, is_tokenized=body.is_tokenized, long_inputs=body.long_inputs)
        result = reply.array().astype(np.float32, copy=False)
        return _json({"id": body.id, "result": result, "chunked": _chunked(reply)}, reply)

    # -- operations --

    @app.get("/health", summary="Liveness: 200 while this process serves")
    async def health() -> Response:
        return _json({"status": "ok"})

    @app.get("/ready", summary="Readiness: 200 while a worker has the model loaded, else 503")
    async def ready() -> Response:
        if not (await server_status()).get("ready"):
            raise HTTPError(503, "no worker has the model loaded: the server is starting, or its workers restart")
        return _json({"status": "ready"})

    @app.get("/status", summary="The server's status, as `bertserve status` shows it")
    async def status() -> Response:
        return _json(await server_status())

    @app.get("/metrics", summary="Prometheus metrics of every server process")
    async def prometheus() -> Response:
        body, content_type = await asyncio.to_thread(metrics.render)
        return Response(body, media_type=content_type)

    return app


# -- helpers ------------------------------------------------------------------------------


def _json(content: Any, reply: p.Reply | None = None) -> Response:
    """``content`` as JSON; with the ``reply`` it came from, its ``X-Chunked-Inputs`` header
    and, from a repository of model versions, ``X-Model-Version``."""
    headers = None
    if reply is not None:
        headers = {CHUNKED_HEADER: str(_chunked(reply))}
        version = reply.header.get("model_version")
        if isinstance(version, int) and not isinstance(version, bool):
            headers[VERSION_HEADER] = str(version)
    body = orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, media_type="application/json", headers=headers)


def _chunked(reply: p.Reply) -> int:
    """How many inputs of a reply were encoded in windows (long_inputs=chunk)."""
    chunked = reply.header.get("chunked", 0)
    return chunked if isinstance(chunked, int) and not isinstance(chunked, bool) else 0


def _authenticated(headers: dict[bytes, bytes], principals: Principals) -> str | None:
    """The name of the principal whose key the request's ``Authorization: Bearer`` holds."""
    scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
    return principals.authenticate(token.strip()) if scheme.lower() == b"bearer" else None


def _caller(request: Request) -> str:
    """Whom the server's bounds and turns count an encode request to: its API key's principal,
    or without keys its peer address (never the body's ``user``)."""
    name = request.scope.get(_PRINCIPAL)
    if name is not None:
        return "key:" + name
    return "address:" + (request.client.host if request.client else "unknown")


def _checked(texts: Any, name: str, *, is_tokenized: bool = False) -> list[Any]:
    try:
        texts = p.check_texts(texts, is_tokenized)
    except (TypeError, ValueError) as exc:
        raise HTTPError(422, str(exc).replace("texts", name, 1), param=name) from None
    if not texts:
        raise HTTPError(422, f"{name} is empty", param=name)
    return texts


def _openai_input(value: Any, tokenizer: Any) -> tuple[list[Any], bool]:
    """OpenAI's ``input`` as texts, or as token lists (``is_tokenized``) for token ids."""
    if isinstance(value, str):
        return _checked([value], "input"), False
    if not isinstance(value, list) or not value:
        raise HTTPError(422, "input must be a non-empty string or list", param="input")
    if all(isinstance(item, str) for item in value):
        return _checked(value, "input"), False
    if all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        return [_tokens_of(value, tokenizer, "input")], True
    if all(isinstance(item, list) for item in value):
        return [_tokens_of(ids, tokenizer, f"input[{i}]") for i, ids in enumerate(value)], True
    bad = next(i for i, item in enumerate(value) if not isinstance(item, type(value[0])) or isinstance(item, bool))
    raise HTTPError(422, f"input[{bad}] is a {type(value[bad]).__name__}; input must be a string, a list of "
                    "strings, a list of token ids or a list of such lists", param="input")  # fmt: skip


def _tokens_of(ids: list[Any], tokenizer: Any, name: str) -> list[str]:
    if not ids:
        raise HTTPError(422, f"{name} is an empty list of token ids", param="input")
    bad = next((i for i, t in enumerate(ids) if not isinstance(t, int) or isinstance(t, bool)), None)
    if bad is not None:
        raise HTTPError(422, f"{name}[{bad}] is not a token id (an integer)", param="input")
    try:
        return tokenizer.tokens_of(ids)
    except ValueError as exc:
        raise HTTPError(422, f"{name}: {exc}", param="input") from None


def _error_response(path: str, error: HTTPError) -> Response:
    if path == "/embed":
        body: Any = {"error": error.message, "error_type": error.code or "Validation"}
    elif path == "/encode":
        body = {"error": error.message, "kind": error.code}
    else:
        body = {"error": {
            "message": error.message, "type": _OPENAI_TYPES.get(error.status, "server_error"),
            "param": error.param, "code": error.code,
        }}  # fmt: skip
    response = Response(orjson.dumps(body), status_code=error.status, media_type="application/json")
    if error.status == 429:
        response.headers["Retry-After"] = "1"
    if error.status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


class _Front:
    """What every request passes first, as plain ASGI (no per-request task): the API key and
    its principal, the body limits, and the request's count and time for ``/metrics``.

    The body is read here, whole, before the application sees the request, so a body refused
    on the way is dropped at once (no half-read body lingers in the application's exception
    handling). A body larger than ``limit`` bytes is refused with 413: at once by its
    Content-Length, or as soon as a chunked body passes the limit. Every body also holds its
    part of ``budget`` (:mod:`.bodies`) from its first byte until its response is sent: one
    whose Content-Length does not fit what is left is refused with 429 before it is read, and
    one that outgrows what is left as it arrives (a chunked body, or its commas) is cut off
    with 429, or with 413 if it alone costs more than the whole budget.
    """

    def __init__(self, app: ASGIApp, principals: Principals, limit: int, budget: BodyBudget) -> None:
        self.app, self.principals, self.limit, self.budget = app, principals, limit, budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500
        principal: str | None = None
        held = 0  # what this request holds of the budget

        async def reply(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        def hold(amount: int) -> HTTPError | None:
            """Take ``amount`` more of the budget for this body; the error if it does not fit."""
            nonlocal held
            if held + amount > self.budget.total:
                return HTTPError(413, f"the request body would take about {_mib(held + amount)} of memory once "
                                 f"parsed (its bytes, and {COMMA_COST} bytes for each comma, {OBJECT_COST} for "
                                 f"each '{{' and {ARRAY_COST} for each '['); "
                                 f"this server holds at most {_mib(self.budget.total)} of bodies at once: send "
                                 "fewer inputs per request", code="limit")  # fmt: skip
            if not self.budget.take(amount):
                return HTTPError(429, f"the server holds as many request bodies as it can at once "
                                 f"({_mib(self.budget.total)}); retry later", code="busy")  # fmt: skip
            held += amount
            metrics.HTTP_BODY_BYTES.set(self.budget.in_use)
            return None

        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        too_large = HTTPError(413, f"the request body is larger than this server's limit of {self.limit} bytes",
                              code="limit")  # fmt: skip
        try:
            if scope["path"] not in _OPEN_PATHS:
                principal = _authenticated(headers, self.principals) if self.principals.required else ANONYMOUS
                if principal is None:
                    unknown = HTTPError(401, "a valid API key is needed: Authorization: Bearer KEY")
                    return await _error_response(scope["path"], unknown)(scope, receive, reply)
                if self.principals.required:
                    scope[_PRINCIPAL] = principal
            if length is not None and (not length.isdigit() or int(length) > self.limit):
                return await _error_response(scope["path"], too_large)(scope, receive, reply)
            error = hold(int(length)) if length is not None else None
            if error is not None:
                return await _error_response(scope["path"], error)(scope, receive, reply)
            chunks: list[bytes] = []
            received = 0
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    status = 499  # the client left before its body was whole: no one to answer
                    return None
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > self.limit:
                    error = too_large
                elif chunk:
                    error = hold(parse_cost(chunk) + (len(chunk) if length is None else 0))
                if error is not None:
                    chunks.clear()
                    return await _error_response(scope["path"], error)(scope, receive, reply)
                if chunk:
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            whole = [b"".join(chunks)]  # one chunk is passed on as it is, without a copy
            chunks.clear()

            async def replay() -> Message:
                if whole:  # the body once, whole; then whatever the client does next
                    return {"type": "http.request", "body": whole.pop(), "more_body": False}
                return await receive()

            await self.app(scope, replay, reply)
        finally:
            if held:
                self.budget.give(held)
                metrics.HTTP_BODY_BYTES.set(self.budget.in_use)
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "other"
            metrics.HTTP_REQUESTS.labels(endpoint, str(status)).inc()
            metrics.HTTP_SECONDS.labels(endpoint).observe(time.perf_counter() - started)
            if principal is not None:
                metrics.HTTP_PRINCIPAL_REQUESTS.labels(principal, str(status)).inc()


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
