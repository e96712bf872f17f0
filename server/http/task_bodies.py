"""The request bodies of the task endpoints (rerank, classification, sparse, token vectors),
in the shapes the clients already send: TEI's ``/rerank``, ``/predict``, ``/embed_sparse`` and
``/embed_all``, and Cohere's and Jina's ``/v1/rerank`` and ``/v2/rerank``. The inputs are
``SkipValidation`` and checked by hand (:mod:`.tasks`), so that an error names the element at
fault; ``model`` is bertserve's own in TEI's shapes (a TEI server serves one model)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SkipValidation

from .schemas import _MODEL, _PROMPT_NAME, _TRUNCATE, _TRUNCATION, Truncation

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
