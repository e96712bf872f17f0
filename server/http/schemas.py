"""What goes in and out of the HTTP API: the request bodies and their inputs, checked with
messages that name the element at fault, and the JSON answers, errors in each API's own format.

The server's error kinds map to status codes (:data:`STATUS_OF_KIND`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from bertserve.client import protocol as p
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, SkipValidation

CHUNKED_HEADER = "X-Chunked-Inputs"  # how many inputs were encoded in windows (long_inputs=chunk)
TRUNCATED_HEADER = "X-Truncated-Inputs"  # how many inputs were cut to the model's length (/v1/embeddings)
VERSION_HEADER = "X-Model-Version"  # the model version that made the vectors (a repository of versions)
CLIENT_CLOSED = 499  # nginx's "client closed request": the caller left, and its request was withdrawn

STATUS_OF_KIND = {
    "input": 422,
    "protocol": 422,
    "limit": 413,
    "busy": 429,
    "timeout": 504,
    "expired": 504,
    "shutdown": 503,
    "forbidden": 403,
    "duplicate": 409,
    "worker": 500,
    "internal": 500,
    "cancelled": CLIENT_CLOSED,
    p.UNKNOWN_MODEL: 404,
    p.WRONG_TASK: 400,
    p.DROPPED: 503,
}
_TEI_PATHS = (
    "/",
    "/invocations",
    "/embed",
    "/similarity",
    "/tokenize",
    "/rerank",
    "/predict",
    "/embed_sparse",
    "/embed_all",
)
_COHERE_PATHS = ("/v1/rerank", "/v2/rerank")
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


QUOTED_CHARS = 100
"""The most characters of a received value an error message quotes."""
MESSAGE_CHARS = 2000
"""The most characters of any error message: what a caller sent never comes back larger."""


class HTTPError(Exception):
    """An answer other than 200; its message is cut to :data:`MESSAGE_CHARS` characters, so an
    error's size never follows what the caller sent (quote received values with :func:`quoted`)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        message = bounded(message, MESSAGE_CHARS)
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.param = bounded(param) if param is not None else None


def bounded(text: str, most: int = QUOTED_CHARS) -> str:
    """``text`` cut to ``most`` characters, saying how long it was."""
    if len(text) <= most:
        return text
    return f"{text[:most]}... ({len(text)} characters)"


def quoted(value: object, most: int = QUOTED_CHARS) -> str:
    """``repr(value)`` for an error message, of at most a ``most``-character prefix of a string."""
    if isinstance(value, str) and len(value) > most:
        return f"{value[:most]!r}... ({len(value)} characters)"
    return bounded(repr(value), most)


# -- request bodies (their schemas are what /docs shows; inputs are checked by hand, to name the element) --


_LONG_INPUTS = (
    "an input longer than the model takes: truncate it, or chunk it (encode it in windows and combine their "
    "vectors); by default what the server was started with"
)
_DIMENSIONS = "keep the first k dimensions of each vector (1 to the model's; renormalized if the model normalizes)"
_PROMPT_NAME = (
    "one of the server's prompts (GET /v1/models lists them), put before every input; by default the server's "
    "default prompt, if it has one"
)
_TRUNCATION = "which end of an over-long input is cut: right (the default) or left"
_EMBEDDING_TYPES = (
    "Cohere's: the forms to answer each vector in, of float, int8, uint8 (these two need the model's calibration "
    "ranges), binary and ubinary (sign bits, 8 to a byte)"
)
_TRUNCATE = "cut an over-long input (else it is a 413); by default as the server's --auto-truncate says (off)"
_MODEL = "the name of one of the served models (GET /v1/models lists them); by default the server's default model"

LongInputs = Literal["truncate", "chunk"]
Dimensions = Annotated[int, Field(strict=True)]  # "8" or 8.0 is refused, as OpenAI refuses it
Truncation = Literal["right", "left", "Right", "Left"]  # TEI's spellings


class EmbeddingRequest(BaseModel):
    """OpenAI's ``/v1/embeddings``, and bertserve's own fields beside (the ``openai`` package
    sends those through ``extra_body``)."""

    model_config = ConfigDict(extra="allow")
    input: SkipValidation[str | list[str] | list[int] | list[list[int]]] = Field(
        description="A string or a list of strings; token ids (a list of ids, or a list of such lists) only on a "
        "server started with --token-id-input, as ids of the model's own WordPiece vocabulary"
    )
    model: str | None = Field(None, description=_MODEL + ", or one of its aliases")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Dimensions | None = Field(None, description=_DIMENSIONS)
    user: str | None = Field(
        None,
        description="accepted and ignored: the server's bounds and turns go by API key (without keys, by "
        "the caller's address), never by this field",
    )
    long_inputs: LongInputs | None = Field(None, description=_LONG_INPUTS)
    truncate: bool | None = Field(
        None,
        description="cut an over-long input, and say how many were cut (truncated_inputs); else it is a 413. By "
        "default as the server's --auto-truncate says (off); long_inputs=truncate or chunk asks too",
    )
    prompt_name: str | None = Field(None, description=_PROMPT_NAME)
    truncation_direction: Truncation | None = Field(None, description=_TRUNCATION)
    embedding_types: SkipValidation[Any] = Field(None, description=_EMBEDDING_TYPES)


class EmbedRequest(BaseModel):
    """Text Embeddings Inference's ``/embed``; ``model`` is bertserve's own (a TEI server
    serves one model)."""

    inputs: SkipValidation[str | list[str]]
    normalize: bool = Field(
        True,
        description="unit-length vectors; false gives a normalizing model's vectors before its Normalize module",
    )
    truncate: bool | None = Field(None, description=_TRUNCATE)
    truncation_direction: Truncation | None = Field(None, description=_TRUNCATION)
    prompt_name: str | None = Field(None, description=_PROMPT_NAME)
    dimensions: Dimensions | None = Field(None, description=_DIMENSIONS)
    long_inputs: LongInputs | None = Field(None, description=_LONG_INPUTS)
    model: str | None = Field(None, description=_MODEL)
    embedding_types: SkipValidation[Any] = Field(None, description=_EMBEDDING_TYPES)


class SimilarityRequest(BaseModel):
    """Text Embeddings Inference's ``/similarity``: the cosine of the source sentence with each
    of the others. ``truncate``, ``truncation_direction`` and ``prompt_name`` may also be
    given in ``parameters``, as TEI takes them."""

    inputs: SkipValidation[Any] = Field(description="{source_sentence: text, sentences: [texts]}")
    truncate: bool | None = Field(None, description=_TRUNCATE)
    truncation_direction: Truncation | None = Field(None, description=_TRUNCATION)
    prompt_name: str | None = Field(None, description=_PROMPT_NAME)
    parameters: SkipValidation[Any] = None
    model: str | None = Field(None, description=_MODEL)


class TokenizeRequest(BaseModel):
    """Text Embeddings Inference's ``/tokenize``; ``truncate``, ``truncation_direction`` and
    ``model`` are bertserve's own."""

    inputs: SkipValidation[str | list[str]]
    add_special_tokens: bool = True
    prompt_name: str | None = Field(None, description=_PROMPT_NAME)
    truncate: bool | None = Field(
        False, description="cut each input to the model's max_seq_len as encoding does (by default the whole input)"
    )
    truncation_direction: Truncation | None = Field(None, description=_TRUNCATION)
    model: str | None = Field(None, description=_MODEL)


class EncodeRequest(BaseModel):
    """bert-as-service's HTTP ``/encode``, and bertserve's own fields beside."""

    id: SkipValidation[Any] = None
    texts: SkipValidation[list[str] | list[list[str]]]
    is_tokenized: bool = False
    long_inputs: LongInputs | None = Field(None, description=_LONG_INPUTS)
    prompt_name: str | None = Field(None, description=_PROMPT_NAME)
    dimensions: Dimensions | None = Field(None, description=_DIMENSIONS)
    truncation_direction: Truncation | None = Field(None, description=_TRUNCATION)
    model: str | None = Field(None, description=_MODEL)


# -- inputs ------------------------------------------------------------------------------


def checked_texts(texts: Any, name: str, *, is_tokenized: bool = False) -> list[Any]:
    """``texts`` (the body's field ``name``) as a non-empty list of inputs; raises :class:`HTTPError`."""
    try:
        texts = p.check_texts(texts, is_tokenized)
    except (TypeError, ValueError) as exc:
        raise HTTPError(422, str(exc).replace("texts", name, 1), param=name) from None
    if not texts:
        raise HTTPError(422, f"{name} is empty", param=name)
    return texts


TOKEN_IDS_REFUSED = (
    "input holds token ids, and this server takes text: it cannot tell which tokenizer made the ids (OpenAI "
    "clients count with tiktoken, whose ids stand for other words in this model's vocabulary). Send the texts as "
    "strings: with LangChain, OpenAIEmbeddings(..., check_embedding_ctx_length=False). A server started with "
    "--token-id-input takes ids of its own model's WordPiece vocabulary"
)


def openai_input(value: Any, tokenizer: Any, *, token_ids: bool) -> tuple[list[Any], bool]:
    """OpenAI's ``input`` as texts; or, if ``token_ids`` are taken, as token lists
    (``is_tokenized``) of the model's own vocabulary."""
    if isinstance(value, str):
        return checked_texts([value], "input"), False
    if not isinstance(value, list) or not value:
        raise HTTPError(422, "input must be a non-empty string or list", param="input")
    if all(isinstance(item, str) for item in value):
        return checked_texts(value, "input"), False
    flat = all(isinstance(item, int) and not isinstance(item, bool) for item in value)
    if flat or all(isinstance(item, list) for item in value):
        if not token_ids:
            raise HTTPError(422, TOKEN_IDS_REFUSED, param="input", code="token_ids_not_accepted")
        if flat:
            return [_tokens_of(value, tokenizer, "input")], True
        return [_tokens_of(ids, tokenizer, f"input[{i}]") for i, ids in enumerate(value)], True
    # the first item unlike the first (a bool is no id), else the first: all of one type none of these are
    bad = next((i for i, item in enumerate(value) if not isinstance(item, type(value[0])) or isinstance(item, bool)), 0)
    raise HTTPError(
        422,
        f"input[{bad}] is a {type(value[bad]).__name__}; input must be a string, a list of "
        "strings, a list of token ids or a list of such lists",
        param="input",
    )


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


# -- answers -----------------------------------------------------------------------------


def json_response(content: Any, reply: p.Reply | None = None, *, truncated: int | None = None) -> Response:
    """``content`` as JSON; with the ``reply`` it came from, its ``X-Chunked-Inputs`` header
    (and ``X-Truncated-Inputs``, ``truncated``, where counted) and, from a repository of model
    versions, ``X-Model-Version``."""
    headers = None
    if reply is not None:
        headers = {CHUNKED_HEADER: str(chunked_count(reply))}
        if truncated is not None:
            headers[TRUNCATED_HEADER] = str(truncated)
        version = reply.header.get("model_version")
        if isinstance(version, int) and not isinstance(version, bool):
            headers[VERSION_HEADER] = str(version)
    body = orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, media_type="application/json", headers=headers)


def chunked_count(reply: p.Reply) -> int:
    """How many inputs of a reply were encoded in windows (long_inputs=chunk)."""
    chunked = reply.header.get("chunked", 0)
    return chunked if isinstance(chunked, int) and not isinstance(chunked, bool) else 0


def error_response(path: str, error: HTTPError) -> Response:
    """``error`` in the format of the API that ``path`` belongs to."""
    if path in _TEI_PATHS:
        body: Any = {"error": error.message, "error_type": error.code or "Validation"}
    elif path == "/encode":
        body = {"error": error.message, "kind": error.code}
    elif path in _COHERE_PATHS:  # Cohere's shape, with OpenAI's error object beside it for clients that read that
        body = {"message": error.message, "error": {"message": error.message, "param": error.param, "code": error.code}}
    else:
        body = {
            "error": {
                "message": error.message,
                "type": _OPENAI_TYPES.get(error.status, "server_error"),
                "param": error.param,
                "code": error.code,
            }
        }
    response = Response(orjson.dumps(body), status_code=error.status, media_type="application/json")
    if error.status == 429:
        response.headers["Retry-After"] = "1"
    if error.status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    if error.code == "shutdown":  # the server is going: the caller's next request goes elsewhere
        response.headers["Connection"] = "close"
    return response


JSON_ERROR = "the body is not valid JSON"


def not_json(exc: Exception | str, at: object = None) -> HTTPError:
    """The 400 for a body that is not JSON: what the parser says, and where."""
    where = f" at character {at}" if isinstance(at, int) else ""
    return HTTPError(400, f"{JSON_ERROR}: {exc}{where}", param="body", code="json_invalid")


async def http_error(request: Request, exc: HTTPError) -> Response:
    return error_response(request.url.path, exc)


async def invalid(request: Request, exc: RequestValidationError) -> Response:
    """The first problem, by where it is and what pydantic says of it: never the input it
    quotes (``input``, ``ctx``), which may be as large as the body. A body that is not JSON
    is a 400 that says what the parser said, and where."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        loc = first.get("loc", ())
        parser = str((first.get("ctx") or {}).get("error", "JSON decode error"))
        return error_response(request.url.path, not_json(parser, loc[1] if len(loc) > 1 else None))
    where = ".".join(str(part) for part in first.get("loc", ())[1:] if part != "body") or "body"
    message = f"{where}: {first.get('msg', 'invalid request')}"
    return error_response(request.url.path, HTTPError(422, message, param=where))
