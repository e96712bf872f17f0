"""What a worker sends the sink for a job it ran: the RESULT of a model of one task, or, for a
model that answers several tasks from one run (a late-interaction model, :mod:`...model.late`),
one RESULT per task the job's parts ask for, each holding the parts of that task and their rows
alone, so that the sink places each as it places any result."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
from bertserve.client import protocol as p
from bertserve.client.late import OUTPUTS_TASK, pack_outputs
from bertserve.client.tasks import sparse_pairs

from ...model.tokenization import TokenizedBatch


class Answers(Protocol):
    """What the worker asks of a model of several tasks."""

    def run_tasks(self, batch: TokenizedBatch, tasks: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


def job_result(
    model: Any,
    batch: TokenizedBatch,
    header: dict[str, Any],
    vectors: np.ndarray,
    version: int | None,
    normalizes: bool,
    sparse: bool,
) -> tuple[dict[str, Any], np.ndarray]:
    """The RESULT of a job of ``batch`` whose model gave ``vectors``: a chunked input's windows
    combined into one row (by the ``model``'s ``combine``), a SPLADE model's rows as
    ``[id, weight]`` pairs; ``normalizes`` says the model leaves its Normalize module to the sink."""
    out: dict[str, Any] = {"parts": header["parts"], "tokens": header.get("tokens"), "model_version": version}
    if normalizes:
        out["normalizes"] = True
    owners = batch.owners
    if owners is not None:  # windows of long inputs: one row per input again
        vectors = np.ascontiguousarray(model.combine(batch, vectors))
        out["windows"] = np.bincount(owners).tolist()
        out["lengths"] = np.bincount(owners, weights=batch.lengths).astype(np.int64).tolist()
        out["truncated"] = (np.bincount(owners, weights=batch.truncated) > 0).tolist()
    else:
        out["lengths"] = np.asarray(batch.lengths).tolist()
        out["truncated"] = batch.truncated.tolist()  # each input cut to the model's length, or not
    if sparse:
        vectors = sparse_pairs(vectors)
    out.update(p.array_header(vectors))
    return out, vectors


def task_results(
    model: Answers, batch: TokenizedBatch, header: dict[str, Any], version: int | None
) -> Iterator[tuple[dict[str, Any], np.ndarray]]:
    """The header and array of each RESULT of the job ``header`` describes, ``batch`` its
    tokenized rows: every task asked is computed in one run of the rows (:meth:`run_tasks`);
    a request for several outputs (``outputs:embed,sparse``) gets them packed in one array
    (:func:`bertserve.client.late.pack_outputs`), its dense vectors normalized."""
    rows: dict[str, list[int]] = {}
    parts: dict[str, list[dict[str, Any]]] = {}
    offset = 0
    for part in header["parts"]:
        count = len(part["rows"])
        task = str(part.get("task") or "embed")
        rows.setdefault(task, []).extend(range(offset, offset + count))
        parts.setdefault(task, []).append(part)
        offset += count
    if offset != len(batch):
        raise RuntimeError(f"the job's parts hold {offset} rows and its batch {len(batch)}")
    wanted: dict[str, list[int]] = {}
    for task, index in rows.items():
        for output in _outputs(task):
            wanted.setdefault(output, []).extend(index)
    answers = model.run_tasks(batch, {task: np.asarray(index, np.int64) for task, index in wanted.items()})
    for task, answer in answers.items():
        if len(answer) != len(wanted[task]):
            raise RuntimeError(f"the model returned {len(answer)} rows of {task} for {len(wanted[task])} inputs")
    places = {task: {row: place for place, row in enumerate(index)} for task, index in wanted.items()}
    tokens = header.get("tokens")
    for task, index in rows.items():
        outputs = _outputs(task)
        mine = {output: answers[output][[places[output][row] for row in index]] for output in outputs}
        vectors = _packed(mine, outputs) if task.startswith(OUTPUTS_TASK) else np.ascontiguousarray(mine[task])
        out: dict[str, Any] = {
            "parts": parts[task],
            "tokens": [tokens[i] for i in index] if tokens is not None else None,
            "model_version": version,
            "lengths": batch.lengths[index].tolist(),
            "truncated": batch.truncated[index].tolist(),
            **({"normalizes": True} if task == "embed" else {}),  # the dense vector, normalized as any model's
        }
        out.update(p.array_header(vectors))
        yield out, vectors


def _outputs(task: str) -> list[str]:
    """The tasks the model computes for a part's ``task``: itself, or a request's outputs."""
    return task[len(OUTPUTS_TASK) :].split(",") if task.startswith(OUTPUTS_TASK) else [task]


def _packed(answers: dict[str, np.ndarray], outputs: list[str]) -> np.ndarray:
    """Several outputs of each row in one array, the dense vectors normalized (the sink
    normalizes sentence vectors only)."""
    if "embed" in answers:
        dense = answers["embed"].astype(np.float32)
        answers = {**answers, "embed": dense / np.maximum(np.linalg.norm(dense, axis=-1, keepdims=True), 1e-12)}
    width = max([2, *(array.shape[-1] for output, array in answers.items() if output != "sparse")])
    return pack_outputs(answers, outputs, width)
