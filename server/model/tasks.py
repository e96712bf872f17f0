"""What a model computes, beside sentence vectors: its task, read from ``config.json`` and
``modules.json``, or named (``--model NAME=DIR,task=rerank``).

========  ==========================================  =============================================
task      the model                                   one output row per input
========  ==========================================  =============================================
embed     an encoder (``BertModel``...) and its        the sentence vector
          sentence-transformers modules
rerank    ``*ForSequenceClassification``, one label    the pair's logit (a cross-encoder: query and
          (sentence-transformers' ``CrossEncoder``)    document written as a sentence pair)
          or Qwen3's ``*ForCausalLM`` without          logit(yes) - logit(no) at the last token of
          sentence-transformers' Pooling               the model's template (:mod:`.yes_no`)
classify  ``*ForSequenceClassification``, its labels   one logit per label (``id2label``)
sparse    ``*ForMaskedLM`` with SPLADE pooling          log(1 + ReLU(logits)), the maximum over the
          (``SparseEncoder``)                          real tokens: one weight per vocabulary entry
========  ==========================================  =============================================

Two kinds of model answer several tasks from one model run (:mod:`.late`): BGE-M3
(``colbert_linear.pt`` and ``sparse_linear.pt`` beside the encoder) answers embed, sparse,
multivector (one vector per token) and rerank (MaxSim of its token vectors); a ColBERT model
in PyLate's format answers multivector and rerank (MaxSim).

Each task's graph is the encoder's, through the same path (frozen, pruned, cached; fp32, bf16
and int8), with the task's head on its last layer in place of pooling (:mod:`.task_heads`).
The activation a score gets (a reranker's sigmoid, a classifier's softmax) is applied where the
answer is made, so that raw scores can be asked for too.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ModelError, ModelFileError
from .json_file import read_json
from .yes_no import QWEN3_RERANKER, PairTemplate, answer_ids

#: the task a request asks for, by what it calls; ENCODE without one asks for vectors
TASK_NAMES = {
    "embed": "an embedding model",
    "rerank": "a reranker (cross-encoder)",
    "classify": "a classifier",
    "sparse": "a sparse (SPLADE) model",
    "multivector": "a multi-vector (ColBERT) model",
}

#: what a request of each task is sent to, for the errors that name it
TASK_ENDPOINTS = {
    "embed": "/v1/embeddings, /embed or BertClient.encode",
    "rerank": "/rerank, /v1/rerank or BertClient.rerank",
    "classify": "/predict or BertClient.predict",
    "sparse": "/embed_sparse or BertClient.encode_sparse",
    "multivector": "/embed_multivector or BertClient.encode_multivector",
}

#: the tasks each kind of late-interaction model answers, its own (its default) first
LATE_TASKS = {
    "bge-m3": ("embed", "sparse", "multivector", "rerank"),
    "colbert": ("multivector", "rerank"),
}

#: the families whose masked-language-model head bertserve runs for SPLADE
SPARSE_FAMILIES = ("bert", "distilbert", "roberta")

#: sentence-transformers' names for a cross-encoder's activation (config.json's
#: ``sentence_transformers.activation_fn``; ``sbert_ce_default_activation_function`` before v4)
_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
}
_MAX_LABELS = 4096  # the labels a worker may report (the link's schema bounds them alike)


@dataclass(frozen=True)
class TaskHead:
    """A model's task and what its head needs to be built and its scores read."""

    task: str = "embed"
    labels: tuple[str, ...] = ()  # classify and rerank: id2label in id order
    activation: str = "identity"  # rerank: the model's own (sigmoid, identity, tanh)
    pooling: str = "cls"  # ModernBERT's classifier_pooling: cls or mean
    head_act: str = "gelu"  # ModernBERT's classifier_activation
    head_bias: bool = True  # whether the head's dense layer has a bias (ModernBERT's classifier_bias)
    # a causal language model as a reranker (.yes_no): its "yes" and "no" token ids, its template
    answers: tuple[int, ...] = ()
    template: PairTemplate | None = None
    late: str = ""  # a model of several outputs from one run (.late): "bge-m3" or "colbert"

    @property
    def scores(self) -> bool:
        return self.task in ("rerank", "classify") and not self.late

    @property
    def tasks(self) -> tuple[str, ...]:
        """Every task the model answers, its own first."""
        if not self.late:
            return (self.task,)
        return (self.task, *(task for task in LATE_TASKS[self.late] if task != self.task))

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task": self.task}
        if self.scores:
            out.update(labels=list(self.labels), activation=self.activation)
        if self.late:  # MaxSim scores are answered as they are: no activation
            out.update(tasks=list(self.tasks), late=self.late, labels=["score"], activation="identity")
        return out


def read_task(model_dir: str, family: str, requested: str | None) -> TaskHead:
    """The task of the Hugging Face model in ``model_dir`` (whose family is ``family``), or the
    one ``requested`` when the model has what it needs; a :class:`ModelError` that says what
    the model is when it has not."""
    path = os.path.join(model_dir, "config.json")
    raw = read_json(path) if os.path.isfile(path) else {}
    kind = _kind(path, raw)
    splade = _has_module(model_dir, "SpladePooling")
    pooling = _has_module(model_dir, ".Pooling")
    detected = "embed"
    yes_no = kind == "causal_lm" and raw.get("model_type") == "qwen3"  # Qwen3-Reranker; Qwen3-Embedding has Pooling
    if kind == "classification":
        detected = "rerank" if len(_labels(path, raw)) == 1 else "classify"
    elif kind == "masked_lm" and (splade or not pooling):
        detected = "sparse"
    elif yes_no and not pooling:
        detected = "rerank"
    late = late_kind(model_dir)
    if late or requested == "multivector":
        return _late_head(model_dir, late, requested, raw)
    task = requested or detected
    if task == "embed":
        return TaskHead()
    if task == "rerank" and yes_no:
        return TaskHead("rerank", ("yes",), "sigmoid", answers=answer_ids(model_dir), template=QWEN3_RERANKER)
    if task in ("rerank", "classify"):
        if kind != "classification":
            raise ModelError(
                f"task={task} needs a sequence classification model (a cross-encoder, *ForSequenceClassification); "
                f"{model_dir} is {_what(raw)}"
            )
        labels = _labels(path, raw)
        if task == "rerank" and len(labels) != 1:
            raise ModelError(
                f"task=rerank needs a model with one output (a relevance score); {model_dir} has {len(labels)} "
                f"labels ({', '.join(labels[:5])}): serve it with task=classify"
            )
        activation = _activation(model_dir, path, raw, len(labels))
        return TaskHead(task, labels, activation, *_modernbert_head(path, raw))
    if kind != "masked_lm":
        raise ModelError(f"task=sparse needs a masked language model (*ForMaskedLM); {model_dir} is {_what(raw)}")
    if family not in SPARSE_FAMILIES:
        raise ModelError(f"task=sparse runs {', '.join(SPARSE_FAMILIES)} models, and {model_dir} is {family}")
    return TaskHead("sparse")


@functools.lru_cache(maxsize=64)
def late_kind(model_dir: str) -> str:
    """``"bge-m3"`` for FlagEmbedding's BGE-M3 layout (``colbert_linear.pt`` beside the
    encoder), ``"colbert"`` for a ColBERT model in PyLate's format, else ``""``."""
    if os.path.isfile(os.path.join(model_dir, "colbert_linear.pt")):
        return "bge-m3"
    path = os.path.join(model_dir, "config_sentence_transformers.json")
    if os.path.isfile(path):
        raw = read_json(path)
        if all(key in raw for key in ("query_prefix", "document_prefix", "query_length", "document_length")):
            return "colbert"
    return ""


def _late_head(model_dir: str, late: str, requested: str | None, raw: dict[str, Any]) -> TaskHead:
    if not late:
        raise ModelError(
            f"task=multivector needs a late-interaction model (BGE-M3's colbert_linear.pt, or a ColBERT model in "
            f"PyLate's format); {model_dir} is {_what(raw)}"
        )
    tasks = LATE_TASKS[late]
    if late == "bge-m3" and not os.path.isfile(os.path.join(model_dir, "sparse_linear.pt")):
        tasks = tuple(task for task in tasks if task != "sparse")
    if requested is not None and requested not in tasks:
        raise ModelError(
            f"task={requested}: {model_dir} is {'BGE-M3' if late == 'bge-m3' else 'a ColBERT model'}, which answers "
            f"{', '.join(tasks)}"
        )
    return TaskHead(requested or tasks[0], late=late)


@functools.lru_cache(maxsize=64)
def model_tasks(model_dir: str, requested: str | None) -> tuple[str, ...]:
    """The tasks of the model in ``model_dir`` for the head's checks, without reading weights,
    its own first: ``requested`` (and a late-interaction model's others), else what its files
    say (``embed`` for a directory that cannot say, whose faults its workers report)."""
    try:
        return read_task(model_dir, "bert", requested).tasks
    except (ValueError, TypeError, OSError):  # ModelError too: the head must not fail on a model's files
        return (requested or "embed",)


def model_task(model_dir: str, requested: str | None) -> str:
    """The task of the model in ``model_dir`` (its own, of :func:`model_tasks`)."""
    return model_tasks(model_dir, requested)[0]


def answers(info: dict[str, Any], task: str) -> bool:
    """Whether a model answers ``task``, by what its workers said (``info``)."""
    tasks = info.get("tasks")
    if isinstance(tasks, list):
        return task in tasks
    return (info.get("task") or "embed") == task


def wrong_task(name: str, task: str, asked: str, served: Sequence[str] | None = None) -> str:
    """The message for a request of task ``asked`` to the model ``name``, whose task is
    ``task``; ``served``, when known, names the served models of ``asked``."""
    message = (
        f"the model {name!r} is {TASK_NAMES[task]} (task {task}): it does not answer {asked} requests; "
        f"send {task} requests to {TASK_ENDPOINTS[task]}"
    )
    if served is None:
        return f"{message}, or {asked} requests to a model of that task"
    if not served:
        return f"{message}; {served_with(asked, served)}"
    return f"{message}; {served_with(asked, served)}: name one as the request's model"


def served_with(task: str, names: Sequence[str]) -> str:
    """``names``, the served models of ``task``, in words."""
    if not names:
        return f"no model served here has task {task}"
    return f"the served models of task {task}: {', '.join(map(repr, names))}"


def _architecture(raw: dict[str, Any]) -> str:
    architectures = raw.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    return ""


def _kind(path: str, raw: dict[str, Any]) -> str:
    architecture = _architecture(raw)
    if architecture.endswith("ForSequenceClassification"):
        return "classification"
    if architecture.endswith("ForMaskedLM"):
        return "masked_lm"
    if architecture.endswith("ForCausalLM"):
        return "causal_lm"
    return "encoder"


def _what(raw: dict[str, Any]) -> str:
    architecture = _architecture(raw)
    return f"a {architecture}" if architecture else "an encoder without a task head"


def _has_module(model_dir: str, suffix: str) -> bool:
    from .st_modules import read_modules

    return any(str(module.get("type", "")).endswith(suffix) for module in read_modules(model_dir))


def _labels(path: str, raw: dict[str, Any]) -> tuple[str, ...]:
    """The labels in id order: ``id2label``, else ``num_labels`` of them named LABEL_i."""
    id2label = raw.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            by_id = {int(key): str(value) for key, value in id2label.items()}
        except (TypeError, ValueError):
            raise ModelFileError(f"{path}: id2label's keys should be label ids, 0 to N - 1") from None
        if sorted(by_id) != list(range(len(by_id))) or len(by_id) > _MAX_LABELS:
            raise ModelFileError(f"{path}: id2label should name the labels 0 to N - 1 (N at most {_MAX_LABELS:,})")
        return tuple(by_id[i] for i in range(len(by_id)))
    count = raw.get("num_labels", 2)  # transformers' default
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= _MAX_LABELS:
        raise ModelFileError(f"{path}: num_labels should be an integer from 1 to {_MAX_LABELS:,}, not {count!r}")
    return tuple(f"LABEL_{i}" for i in range(count))


def _activation(model_dir: str, path: str, raw: dict[str, Any], labels: int) -> str:
    """The activation sentence-transformers' ``CrossEncoder.predict`` applies: the model's own
    (``config_sentence_transformers.json`` as version 6 saves it, else config.json's
    ``sentence_transformers`` section as versions 4 and 5 did, else the key before them), else a
    sigmoid for one label and none for several."""
    own = os.path.join(model_dir, "config_sentence_transformers.json")
    if os.path.isfile(own):
        path = own
        declared = read_json(own).get("activation_fn")
    else:
        declared = None
    if declared is None:
        section = raw.get("sentence_transformers")
        declared = section.get("activation_fn") if isinstance(section, dict) else None
        path = os.path.join(model_dir, "config.json")
    if declared is None:
        declared = raw.get("sbert_ce_default_activation_function")
    if declared is None:
        return "sigmoid" if labels == 1 else "identity"
    activation = _ACTIVATIONS.get(str(declared))
    if activation is None:
        raise ModelError(
            f"{path}: the cross-encoder's activation {declared!r} is not supported ({', '.join(_ACTIVATIONS)})"
        )
    return activation


def _modernbert_head(path: str, raw: dict[str, Any]) -> tuple[str, str, bool]:
    pooling = raw.get("classifier_pooling", "cls")
    if pooling not in ("cls", "mean"):
        raise ModelError(f"{path}: classifier_pooling {pooling!r} is not supported (cls or mean)")
    act = raw.get("classifier_activation", "gelu")
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "tanh"):
        raise ModelError(f"{path}: classifier_activation {act!r} is not supported")
    return str(pooling), str(act), _modernbert_bias(raw)


def _modernbert_bias(raw: dict[str, Any]) -> bool:
    if raw.get("model_type") != "modernbert":
        return True
    return bool(raw.get("classifier_bias", False))
