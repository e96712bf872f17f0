"""The keyword options of the client API's calls, written once for every client.

``encode`` (and ``encode_async``, and ``ConcurrentBertClient.encode``), ``rerank``, ``predict``,
``encode_sparse``, ``encode_multivector`` and ``encode_outputs`` take their options as
``**options``, typed by a TypedDict here (PEP 692), so that a type checker flags a misspelt or
mistyped one; :func:`read_options` reads them where
a call is planned, their defaults filled in from here, and refuses an unknown one with the
``TypeError`` Python raises for an explicit signature. The options:

- ``is_tokenized``: the inputs are token lists, not texts (default ``False``);
- ``pairs``: an input holding ``|||`` is a sentence pair (default ``True``);
- ``long_inputs``, ``dimensions``, ``prompt_name``, ``truncation_direction``, ``normalize``
  and ``model``: the request's options, each sent only when given (see
  :class:`~bertserve.client.core.options.EncodeOptions`); ``model`` (``None``: the client's)
  sends the call to another of the server's models;
- ``output``: the vectors in a compact form (``"int8"``, ``"uint8"``, ``"binary"``,
  ``"ubinary"``; ``None`` or ``"float"``: as computed);
- ``raw_scores``: a model's logits rather than its scores (``rerank``, ``predict``);
- ``return_documents``: each ranked document's text with it (``rerank``);
- ``top_k``: only the largest weights of each sparse vector (``encode_sparse``);
- ``is_query``: the texts are queries, read as the model reads a query (``encode_multivector``:
  ColBERT's query prefix and expansion; default ``False``, documents);
- ``outputs``: which of a late-interaction model's outputs ``encode_outputs`` asks for, all from
  one model run (default ``("embed", "sparse", "multivector")``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict


class RequestOptions(TypedDict, total=False):
    """The options of an encode request, as the clients' ``encode`` and ``encode_async`` take them."""

    is_tokenized: bool
    pairs: bool
    long_inputs: str | None
    dimensions: int | None
    prompt_name: str | None
    truncation_direction: str | None
    normalize: bool | None
    model: str | None


class EncodeKeywords(RequestOptions, total=False):
    """``BertClient.encode``'s and ``AsyncBertClient.encode``'s options: the request's, and its answer's form."""

    output: str | None


class RerankOptions(TypedDict, total=False):
    """``rerank``'s options."""

    raw_scores: bool
    return_documents: bool
    truncation_direction: str | None
    model: str | None


class PredictOptions(TypedDict, total=False):
    """``predict``'s options."""

    raw_scores: bool
    truncation_direction: str | None
    model: str | None


class SparseOptions(TypedDict, total=False):
    """``encode_sparse``'s options."""

    top_k: int | None
    prompt_name: str | None
    truncation_direction: str | None
    model: str | None


class MultivectorOptions(TypedDict, total=False):
    """``encode_multivector``'s options."""

    is_query: bool
    prompt_name: str | None
    truncation_direction: str | None
    model: str | None


class OutputsOptions(TypedDict, total=False):
    """``encode_outputs``' options."""

    outputs: tuple[str, ...] | list[str]
    prompt_name: str | None
    truncation_direction: str | None
    model: str | None


REQUEST_DEFAULTS: RequestOptions = {
    "is_tokenized": False,
    "pairs": True,
    "long_inputs": None,
    "dimensions": None,
    "prompt_name": None,
    "truncation_direction": None,
    "normalize": None,
    "model": None,
}
ENCODE_DEFAULTS: EncodeKeywords = {**REQUEST_DEFAULTS, "output": None}
RERANK_DEFAULTS: RerankOptions = {
    "raw_scores": False,
    "return_documents": False,
    "truncation_direction": None,
    "model": None,
}
PREDICT_DEFAULTS: PredictOptions = {"raw_scores": False, "truncation_direction": None, "model": None}
SPARSE_DEFAULTS: SparseOptions = {"top_k": None, "prompt_name": None, "truncation_direction": None, "model": None}
OUTPUTS_DEFAULTS: OutputsOptions = {
    "outputs": ("embed", "sparse", "multivector"),
    "prompt_name": None,
    "truncation_direction": None,
    "model": None,
}
MULTIVECTOR_DEFAULTS: MultivectorOptions = {
    "is_query": False,
    "prompt_name": None,
    "truncation_direction": None,
    "model": None,
}


def read_options(where: str, given: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The options ``given`` to the method ``where`` (``"BertClient.encode"``, say), each one not
    given its default; ``TypeError`` naming the first that is not one of ``defaults``, as Python
    words it for a keyword a signature does not have."""
    for name in given:
        if name not in defaults:
            raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")
    return {**defaults, **given}
