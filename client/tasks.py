"""What the answers of the tasks beside embedding mean, shared by the clients and the HTTP API:
the sentence pairs a rerank sends, the scores a model's logits become, the ranking, the
non-zero terms of a sparse vector, and the compact forms of sentence vectors.

A reranker (a cross-encoder) reads the query and a document as one sentence pair and answers
one logit per pair; its score is the logit through the model's own activation (a sigmoid for
most), as sentence-transformers' ``CrossEncoder.predict`` gives it. A classifier answers a
logit per label: a softmax makes them probabilities (a sigmoid, for one label), as
``CrossEncoder.predict(apply_softmax=True)`` and TEI's ``/predict`` do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .protocol import PAIR_SEPARATOR, one_sentence

ACTIVATIONS = ("identity", "sigmoid", "tanh")

EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary")
"""The forms a sentence vector can be answered in (Cohere's ``embedding_types``), as
sentence-transformers' ``quantize_embeddings`` makes them:

- ``binary``: one bit a dimension (1 where the value is above 0), packed 8 to a byte, each
  byte as int8 (offset by -128): D/8 bytes, 1/32 of float32;
- ``ubinary``: the same bits, each byte as uint8;
- ``int8``, ``uint8``: each dimension cut into 256 steps of its range over a calibration set
  (the model's own ranges: see the docs), D bytes, 1/4 of float32; a value outside the
  range takes its nearest end."""


def rerank_pairs(query: object, documents: object) -> list[str]:
    """The sentence pairs of a rerank of ``documents`` by ``query``, written as the protocol
    writes a pair (``"query ||| document"``); ``ValueError`` naming the element at fault."""
    first, texts = rerank_sides(query, documents)
    return [rerank_pair(first, document) for document in texts]


def rerank_sides(query: object, documents: object) -> tuple[str, list[str]]:
    """The query of a rerank as one sentence, and its documents, checked: ``ValueError``
    naming the element at fault. No pair is written yet (:func:`rerank_pair`)."""
    if not isinstance(query, str):
        raise ValueError(f"query must be a string, not {type(query).__name__}")
    if not query.strip():
        raise ValueError("query is empty")
    if isinstance(documents, (str, bytes)) or not isinstance(documents, Sequence):
        raise ValueError(f"documents must be a list of strings, not {type(documents).__name__}")
    if not documents:
        raise ValueError("documents is empty: give at least one document to rank")
    for i, document in enumerate(documents):
        if not isinstance(document, str):
            raise ValueError(f"documents[{i}] must be a string, not {type(document).__name__}")
        if not document.strip():
            raise ValueError(f"documents[{i}] is empty")
    return one_sentence(query), list(documents)  # the server cuts a pair at its first |||: the query holds none


def rerank_pair(query: str, document: str) -> str:
    """One sentence pair of a rerank, as the protocol writes it."""
    return f"{query} {PAIR_SEPARATOR} {document}"


def activate(logits: np.ndarray, activation: str) -> np.ndarray:
    """``logits`` through a cross-encoder's activation, in float32."""
    logits = np.asarray(logits, dtype=np.float32)
    if activation == "sigmoid":
        return sigmoid(logits)
    if activation == "tanh":
        return np.tanh(logits)
    if activation == "identity":
        return logits
    raise ValueError(f"unknown activation {activation!r}; one of {', '.join(ACTIVATIONS)}")


def sigmoid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def label_probabilities(logits: np.ndarray) -> np.ndarray:
    """A classifier's ``(N, labels)`` logits as probabilities: a softmax over the labels, or
    a sigmoid for a model of one label."""
    logits = np.asarray(logits, dtype=np.float32)
    if logits.shape[1] == 1:
        return sigmoid(logits)
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)


def ranking(scores: np.ndarray, top_n: int | None = None) -> list[int]:
    """The indexes of ``scores``, highest first (ties in input order), the first ``top_n``."""
    order = np.argsort(-np.asarray(scores, dtype=np.float32), kind="stable")
    return [int(i) for i in order[: top_n if top_n is not None else len(order)]]


def check_top(value: object, name: str) -> int | None:
    """``top_n``/``top_k``: None, or an integer of 1 or more."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer of 1 or more, not {value!r}")
    return value


@dataclass(frozen=True)
class Ranked:
    """One document of a rerank: its index among the documents given, and its score."""

    index: int
    score: float
    document: str | None = None


def ranked(scores: np.ndarray, documents: Sequence[str] | None = None, top_n: int | None = None) -> list[Ranked]:
    """``scores`` (one a document) as the documents ranked, highest first, the first ``top_n``,
    each with its text when ``documents`` is given."""
    flat = np.asarray(scores, dtype=np.float32).reshape(-1)
    return [Ranked(i, float(flat[i]), None if documents is None else documents[i]) for i in ranking(flat, top_n)]


def rerank_answer(
    rows: np.ndarray,
    config: dict[str, Any],
    documents: Sequence[str],
    top_n: int | None,
    *,
    raw_scores: bool,
    return_documents: bool,
) -> list[Ranked]:
    """A rerank's answer from the model's rows (one logit a document) and its configuration
    (its activation): the documents ranked, their scores the logits through the activation
    unless ``raw_scores``."""
    logits = np.asarray(rows, dtype=np.float32).reshape(len(documents), -1)[:, 0]
    scores = logits if raw_scores else activate(logits, str(config.get("activation", "identity")))
    return ranked(scores, list(documents) if return_documents else None, top_n)


@dataclass(frozen=True)
class SparseVector:
    """The non-zero terms of one sparse vector: vocabulary ids ascending, with their weights."""

    indices: np.ndarray  # int32
    values: np.ndarray  # float32

    def as_dict(self) -> dict[int, float]:
        return {int(i): float(v) for i, v in zip(self.indices, self.values, strict=True)}


def sparse_pairs(weights: np.ndarray) -> np.ndarray:
    """``(N, vocabulary)`` weights as the server sends sparse rows: ``(N, K, 2)`` float32, each
    row's non-zero terms as ``[id, weight]`` pairs, ids ascending, padded with ``[0, 0]`` to the
    ``K`` terms of the fullest row. Vocabulary ids below 2**24 are exact in float32."""
    weights = np.asarray(weights, dtype=np.float32)
    nonzero = weights != 0
    counts = nonzero.sum(axis=1)
    out = np.zeros((len(weights), int(counts.max(initial=0)), 2), np.float32)
    for i, row in enumerate(weights):
        (ids,) = np.nonzero(nonzero[i])
        out[i, : len(ids), 0] = ids
        out[i, : len(ids), 1] = row[ids]
    return out


def sparse_rows(weights: np.ndarray, top_k: int | None = None) -> list[SparseVector]:
    """Each row of sparse ``weights`` as its non-zero terms, only the ``top_k`` largest if
    given (ties to the lower id): ``(N, vocabulary)`` weights, or ``(N, K, 2)`` ``[id, weight]``
    pairs as :func:`sparse_pairs` lays them out (padding, of weight 0, left out)."""
    weights = np.asarray(weights, dtype=np.float32)
    rows = []
    for row in weights:
        if weights.ndim == 3:
            kept = row[row[:, 1] != 0]
            ids, values = kept[:, 0].astype(np.int32), kept[:, 1]
        else:
            (ids,) = np.nonzero(row)
            ids, values = ids.astype(np.int32), row[ids]
        if top_k is not None and len(ids) > top_k:
            keep = np.sort(np.argsort(-values, kind="stable")[:top_k])
            ids, values = ids[keep], values[keep]
        rows.append(SparseVector(ids, values))
    return rows


def check_embedding_types(value: object, name: str = "embedding_types") -> tuple[str, ...]:
    """Cohere's ``embedding_types``: a type or a non-empty list of them, each once."""
    types = [value] if isinstance(value, str) else value
    if not isinstance(types, (list, tuple)) or not types:
        raise ValueError(f"{name} must be one of {', '.join(EMBEDDING_TYPES)} or a non-empty list of them")
    for i, kind in enumerate(types):
        if kind not in EMBEDDING_TYPES:
            raise ValueError(f"{name}[{i}] is {kind!r}, not one of {', '.join(EMBEDDING_TYPES)}")
    if len(set(types)) != len(types):
        raise ValueError(f"{name} names a type twice")
    return tuple(types)


CALIBRATION_ADVICE = (
    "int8 and uint8 cut each dimension by its range over a calibration set, and this model has none: make one "
    "with `bertserve calibrate SENTENCES.txt --model-dir DIR` (it writes DIR/calibration.json, which the "
    "server reads at start), or start the server with --calibration FILE"
)


def quantize(vectors: np.ndarray, kind: str, ranges: Any = None) -> np.ndarray:
    """``vectors`` ``(N, D)`` in the form ``kind`` (:data:`EMBEDDING_TYPES`), as
    sentence-transformers' ``quantize_embeddings`` makes it; ``ranges`` ``(2, D)`` (each
    dimension's minimum and maximum over a calibration set) for int8 and uint8."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if kind == "float":
        return vectors
    if kind in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0, axis=-1)
        return (packed.astype(np.int16) - 128).astype(np.int8) if kind == "binary" else packed
    if kind not in ("int8", "uint8"):
        raise ValueError(f"unknown embedding type {kind!r}; one of {', '.join(EMBEDDING_TYPES)}")
    if ranges is None:
        raise ValueError(CALIBRATION_ADVICE)
    ranges = np.asarray(ranges, dtype=np.float32)
    if ranges.shape != (2, vectors.shape[1]):
        raise ValueError(f"calibration ranges of shape {ranges.shape} do not fit {vectors.shape[1]}-wide vectors")
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    steps = np.where(steps == 0, 1, steps)  # a dimension constant over the calibration set
    # a value outside the calibration range takes the nearest end
    levels = np.clip(np.floor((vectors - starts) / steps), 0, 255)
    if kind == "uint8":
        return levels.astype(np.uint8)
    return (levels - 128).astype(np.int8)


def predict_inputs(inputs: object) -> list[str]:
    """A classifier's inputs, each a text or a sentence pair ``(first, second)``, written as
    the protocol writes them (a text is one sentence, whatever ``|||`` it holds)."""
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
        raise ValueError(f"inputs must be a list of texts or of (first, second) pairs, not {type(inputs).__name__}")
    texts = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            texts.append(_one_text(item, f"inputs[{i}]"))
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            first, second = (_one_text(side, f"inputs[{i}][{j}]") for j, side in enumerate(item))
            texts.append(f"{first} {PAIR_SEPARATOR} {second}")
        else:
            raise ValueError(f"inputs[{i}] must be a text or a (first, second) pair, not {type(item).__name__}")
    return texts


def _one_text(item: object, name: str) -> str:
    if not isinstance(item, str):
        raise ValueError(f"{name} must be a string, not {type(item).__name__}")
    if not item.strip():
        raise ValueError(f"{name} is empty")
    return one_sentence(item)


@dataclass(frozen=True)
class Prediction:
    """One label's score for one input: a probability, or the logit with raw scores."""

    label: str
    score: float


def predictions(logits: np.ndarray, labels: Sequence[str], *, raw_scores: bool = False) -> list[list[Prediction]]:
    """Each input's labels with their scores, best first."""
    logits = np.asarray(logits, dtype=np.float32).reshape(len(logits), -1)
    names = list(labels) if len(labels) == logits.shape[1] else [f"LABEL_{i}" for i in range(logits.shape[1])]
    scores = logits if raw_scores else label_probabilities(logits)
    return [[Prediction(names[j], float(row[j])) for j in ranking(row)] for row in scores]


def compact(vectors: Any, kind: str, config: dict[str, Any]) -> np.ndarray:
    """``vectors`` in the form ``kind``, with the calibration ranges ``config`` (a model's
    configuration) carries, of the first dimensions when the vectors were cut to fewer."""
    floats = np.asarray(vectors, dtype=np.float32)
    ranges = calibration_ranges(config)
    return quantize(floats, kind, None if ranges is None else ranges[:, : floats.shape[1]])


def check_calibrated(
    kinds: Sequence[str], normalize: bool | None, config: Mapping[str, Any], name: str = "output"
) -> None:
    """``ValueError`` for ``int8`` or ``uint8`` among ``kinds`` (the field ``name``) of vectors
    asked for with another ``normalize`` than the model's own (``config``): their ranges are
    calibrated on the model's own vectors."""
    own = bool(config.get("normalize"))
    kind = next((kind for kind in kinds if kind in ("int8", "uint8")), None)
    if kind is not None and normalize is not None and normalize != own:
        raise ValueError(
            f"{name}={kind} cuts ranges calibrated on the model's own vectors, which are "
            f"{'' if own else 'not '}normalized: leave normalize as the model has it, or ask for float, binary "
            "or ubinary"
        )


def calibration_ranges(config: dict[str, Any]) -> np.ndarray | None:
    """The calibration ranges ``(2, D)`` a model's configuration carries, if it does."""
    ranges = config.get("calibration_ranges")
    if ranges is None:
        return None
    array = np.asarray(ranges, dtype=np.float32)
    return array if array.ndim == 2 and array.shape[0] == 2 else None


_CALLS = {
    "embed": "encode",
    "rerank": "rerank",
    "classify": "predict",
    "sparse": "encode_sparse",
    "multivector": "encode_multivector",
}


def check_task(config: Mapping[str, Any], task: str, model: str | None) -> None:
    """``ValueError`` if ``config`` (the server's configuration of ``model``) says the model does
    another task than ``task``; a server that does not say answers for itself."""
    own = config.get("task")
    tasks = config.get("tasks")
    if own is None or own == task or (isinstance(tasks, list) and task in tasks):
        return
    named = "the server's model" if model is None else f"the model {model!r}"
    call = _CALLS.get(str(own), str(own))
    served = config.get("models")
    names = (
        [m.get("name") for m in served if isinstance(m, dict) and task in (m.get("tasks") or [m.get("task")])]
        if isinstance(served, list)
        else []
    )
    which = (
        f"the served models of task {task}: {', '.join(map(repr, names))}"
        if names
        else f"no model served has task {task}"
    )
    raise ValueError(
        f"{named} does the task {own}, not {task}: call {call}() on it, or pass model= one of task {task} ({which})"
    )


def task_default(config: Mapping[str, Any], task: str) -> str | None:
    """The model a request of ``task`` that names none gets, as ``config`` (the server's
    default configuration, ``default_models``) says; None if it does not."""
    chosen = config.get("default_models")
    name = chosen.get(task) if isinstance(chosen, dict) else None
    return name if isinstance(name, str) else None
