"""The request bodies of the task endpoints (rerank, classification, sparse, token vectors,
multi-vectors), in the shapes the clients already send: TEI's ``/rerank``, ``/predict``,
``/embed_sparse`` and ``/embed_all`` (and ``/embed_multivector`` in their shape), and Cohere's
and Jina's ``/v1/rerank`` and ``/v2/rerank``. The inputs are ``SkipValidation`` and checked by
hand (here, and in :mod:`.tasks`), so that an error names the
element at fault; ``model`` is bertserve's own in TEI's shapes (a TEI server serves one model)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bertserve.client import tasks as t
from bertserve.client.protocol import PAIR_SEPARATOR, one_sentence
from pydantic import BaseModel, ConfigDict, Field, SkipValidation

from .schemas import _MODEL, _PROMPT_NAME, _TRUNCATE, _TRUNCATION, HTTPError, Truncation, quoted

_TOP_N = "return only the n best documents (by default all of them), best first"
_RETURN_TEXT = "give each result its document's text"


class TEIRerankRequest(BaseModel):
    """TEI's ``/rerank``: the texts' scores for the query, best first. Infinity's shape of it
    (``documents`` instead of ``texts``, as LangChain's ``InfinityRerank`` sends) is answered
    in Infinity's shape."""

    query: SkipValidation[Any]
    texts: SkipValidation[Any] = Field(None, description="the documents (TEI)")
    documents: SkipValidation[Any] = Field(None, description="the documents (Infinity), instead of texts")
    return_documents: bool | None = Field(None, description="with documents: give each result its text")
    raw_scores: bool = Field(False, description="the model's logits, without its activation (a sigmoid, for most)")
    return_text: bool = Field(False, description=_RETURN_TEXT)
    truncate: bool | None = Field(
        True,
        description="cut a pair longer than the model takes, the longer side first (the document, for a short "
        "query); false refuses it with a 413",
    )
    truncation_direction: Truncation | None = Field(None, description=_TRUNCATION)
    top_n: int | None = Field(None, description=_TOP_N)
    model: str | None = Field(None, description=_MODEL)


class CohereRerankRequest(BaseModel):
    """Cohere's and Jina's rerank (``/v1/rerank``, ``/v2/rerank``), as LangChain, LlamaIndex and
    Haystack send it. ``documents`` are strings, or objects with a ``text``."""

    model_config = ConfigDict(extra="allow")  # max_chunks_per_doc, rank_fields...: accepted and ignored
    query: SkipValidation[Any]
    documents: SkipValidation[Any]
    model: str | None = Field(None, description=_MODEL)
    top_n: SkipValidation[Any] = Field(None, description=_TOP_N)
    return_documents: bool | None = Field(None, description=_RETURN_TEXT)
    max_tokens_per_doc: SkipValidation[Any] = Field(
        None, description="accepted; every pair is cut to what the model takes"
    )


class PredictRequest(BaseModel):
    """TEI's ``/predict``: each input's label scores, best first. An input is a text or a
    sentence pair ``[first, second]``; one input answers a list of labels, a list of inputs a
    list of such lists."""

    inputs: SkipValidation[Any]
    raw_scores: bool = Field(False, description="the model's logits, without the softmax")
    parameters: SkipValidation[Any] = Field(
        None,
        description="huggingface_hub's text_classification: top_k (the k best labels) and function_to_apply "
        "(softmax, sigmoid or none)",
    )
    truncate: bool | None = Field(None, description=_TRUNCATE)
    truncation_direction: Truncation | None = Field(None, description=_TRUNCATION)
    model: str | None = Field(None, description=_MODEL)


class SparseRequest(BaseModel):
    """TEI's ``/embed_sparse``: each input's non-zero vocabulary weights."""

    inputs: SkipValidation[Any]
    truncate: bool | None = Field(None, description=_TRUNCATE)
    truncation_direction: Truncation | None = Field(None, description=_TRUNCATION)
    prompt_name: str | None = Field(None, description=_PROMPT_NAME)
    top_k: SkipValidation[Any] = Field(None, description="keep only each input's k largest weights")
    model: str | None = Field(None, description=_MODEL)


class EmbedAllRequest(BaseModel):
    """TEI's ``/embed_all``: every token's vector, of a model served with pooling NONE."""

    inputs: SkipValidation[Any]
    truncate: bool | None = Field(None, description=_TRUNCATE)
    truncation_direction: Truncation | None = Field(None, description=_TRUNCATION)
    prompt_name: str | None = Field(None, description=_PROMPT_NAME)
    model: str | None = Field(None, description=_MODEL)


class MultivectorRequest(BaseModel):
    """``/embed_multivector``: each input's token vectors, by a late-interaction model (a
    ColBERT model, BGE-M3), in TEI's shape of a request."""

    inputs: SkipValidation[Any]
    is_query: SkipValidation[Any] = Field(
        False, description="the inputs are queries: a ColBERT model reads them with its query prefix and expansion"
    )
    truncate: bool | None = Field(None, description=_TRUNCATE)
    truncation_direction: Truncation | None = Field(None, description=_TRUNCATION)
    prompt_name: str | None = Field(None, description=_PROMPT_NAME)
    embedding_types: SkipValidation[Any] = Field(
        None,
        description="float (the default), float16, binary or ubinary, or a list of them: each asked for is answered, "
        "by its name",
    )
    model: str | None = Field(None, description=_MODEL)


class OutputsRequest(BaseModel):
    """``/embed_outputs``: several outputs of each input by a late-interaction model (BGE-M3),
    all from one model run, in TEI's shape of a request."""

    inputs: SkipValidation[Any]
    outputs: SkipValidation[Any] = Field(
        ["embed", "sparse", "multivector"], description="which of embed, sparse and multivector to answer"
    )
    truncate: bool | None = Field(None, description=_TRUNCATE)
    truncation_direction: Truncation | None = Field(None, description=_TRUNCATION)
    prompt_name: str | None = Field(None, description=_PROMPT_NAME)
    model: str | None = Field(None, description=_MODEL)


def top(value: Any, name: str) -> int | None:
    try:
        return t.check_top(value, name)
    except ValueError as exc:
        raise HTTPError(422, str(exc), param=name) from None


def classification_parameters(parameters: Any) -> tuple[int | None, str | None]:
    """``huggingface_hub``'s ``text_classification`` parameters: ``top_k`` (the k best labels)
    and ``function_to_apply`` (``softmax``, the default; ``sigmoid``; ``none``: the logits)."""
    if parameters is None:
        return None, None
    if not isinstance(parameters, dict):
        raise HTTPError(422, "parameters must be an object: {top_k, function_to_apply}", param="parameters")
    unknown = sorted(set(parameters) - {"top_k", "function_to_apply"})
    if unknown:
        raise HTTPError(
            422, f"parameters.{unknown[0]} is not taken: /predict takes top_k and function_to_apply", param="parameters"
        )
    function = parameters.get("function_to_apply")
    if function is not None and function not in ("softmax", "sigmoid", "none"):
        raise HTTPError(
            422,
            f"parameters.function_to_apply must be softmax, sigmoid or none, not {quoted(function)}",
            param="parameters",
        )
    return top(parameters.get("top_k"), "top_k"), function


def document_texts(documents: Any) -> list[Any]:
    """Cohere's documents, strings or objects with a ``text``, as strings (a bad one as it
    is, for :func:`~bertserve.client.tasks.rerank_pairs` to name)."""
    if not isinstance(documents, list):
        return documents
    return [doc["text"] if isinstance(doc, dict) and isinstance(doc.get("text"), str) else doc for doc in documents]


def predict_inputs(inputs: Any) -> tuple[list[str], bool]:
    """TEI's ``/predict`` inputs as texts (a pair written ``first ||| second``), and whether
    there was one input: a text, a list of one text, or a list of two texts (a pair). A batch
    is a list of texts or of such lists: ``[["a"], ["b", "c"]]``."""
    if isinstance(inputs, str):
        return [one_text(inputs, "inputs")], True
    if isinstance(inputs, list) and 1 <= len(inputs) <= 2 and all(isinstance(side, str) for side in inputs):
        return [pair_input(inputs, "inputs")], True
    if not isinstance(inputs, list) or not inputs:
        raise HTTPError(
            422, "inputs must be a text, a pair [first, second], or a non-empty list of those", param="inputs"
        )
    texts = []
    for i, item in enumerate(inputs):
        if isinstance(item, list):
            if not 1 <= len(item) <= 2:
                raise HTTPError(422, f"inputs[{i}] must be [text] or a pair [first, second]", param="inputs")
            texts.append(pair_input(item, f"inputs[{i}]"))
        else:
            texts.append(one_text(item, f"inputs[{i}]"))
    return texts, False


def pair_input(sides: Sequence[Any], name: str) -> str:
    """``[text]`` or ``[first, second]`` as one input."""
    if len(sides) == 1:
        return one_text(sides[0], f"{name}[0]")
    first, second = (one_text(side, f"{name}[{j}]") for j, side in enumerate(sides))
    return f"{first} {PAIR_SEPARATOR} {second}"


def one_text(item: Any, name: str) -> str:
    """One text input, as one sentence whatever ``|||`` it holds."""
    if not isinstance(item, str):
        raise HTTPError(422, f"{name} must be a string, not {type(item).__name__}", param="inputs")
    if not item.strip():
        raise HTTPError(422, f"{name} is empty", param="inputs")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in item):
        raise HTTPError(422, f"{name} holds a lone surrogate, which is not valid Unicode text", param="inputs")
    return one_sentence(item)
