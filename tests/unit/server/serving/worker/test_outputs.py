"""A job of a late-interaction model, answered: one model run for its rows, one RESULT for each
task its parts ask, each with those parts' rows alone (their tokens, lengths and cuts), the
dense vectors left to the sink to normalize; a model that answers too few rows is an error."""

from __future__ import annotations

import numpy as np
import pytest
from bertserve.client import late
from bertserve.server.model.tokenization import TokenizedBatch
from bertserve.server.serving.worker.outputs import task_results


class Answering:
    """Each task's answer: the rows' first ids, in a shape of the task's."""

    def __init__(self, short: bool = False) -> None:
        self.calls: list[dict[str, list[int]]] = []
        self.short = short

    def run_tasks(self, batch: TokenizedBatch, tasks: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append({task: rows.tolist() for task, rows in tasks.items()})
        shapes = {"embed": (4,), "sparse": (3, 2), "multivector": (5, 4)}
        out = {}
        for task, rows in tasks.items():
            first = batch.input_ids[rows, 0].astype(np.float32)
            out[task] = np.broadcast_to(first.reshape(-1, *[1] * len(shapes[task])), (len(rows), *shapes[task])).copy()
        if self.short:
            out = {task: array[:-1] for task, array in out.items()}
        return out


def batch_of(n: int) -> TokenizedBatch:
    ids = np.arange(n, dtype=np.int32)[:, None] + np.zeros((n, 3), np.int32)
    return TokenizedBatch(ids, np.zeros_like(ids), np.full(n, 3, np.int32), np.arange(n) % 2 == 0)


def test_each_task_gets_one_result_of_its_parts_rows_from_one_run() -> None:
    model = Answering()
    header = {
        "parts": [
            {"key": "a", "rows": [0, 1]},
            {"key": "b", "rows": [0], "task": "sparse"},
            {"key": "c", "rows": [0, 1], "task": "multivector"},
            {"key": "d", "rows": [2], "task": "sparse"},
        ],
        "tokens": [["t0"], ["t1"], ["t2"], ["t3"], ["t4"], ["t5"]],
    }
    results = list(task_results(model, batch_of(6), header, version=3))
    assert model.calls == [{"embed": [0, 1], "sparse": [2, 5], "multivector": [3, 4]}]  # one run, every task
    by_task = {out["parts"][0].get("task", "embed"): (out, array) for out, array in results}
    dense, array = by_task["embed"]
    assert dense["normalizes"] and dense["shape"] == [2, 4] and array[:, 0].tolist() == [0, 1]
    sparse, array = by_task["sparse"]
    assert [part["key"] for part in sparse["parts"]] == ["b", "d"] and "normalizes" not in sparse
    assert array[:, 0, 0].tolist() == [2, 5] and sparse["tokens"] == [["t2"], ["t5"]]
    assert sparse["truncated"] == [True, False] and sparse["lengths"] == [3, 3] and sparse["model_version"] == 3
    tokens, array = by_task["multivector"]
    assert tokens["shape"] == [2, 5, 4] and array[:, 0, 0].tolist() == [3, 4]


def test_a_model_that_answers_too_few_rows_fails_the_job() -> None:
    header = {"parts": [{"key": "a", "rows": [0, 1], "task": "multivector"}]}
    with pytest.raises(RuntimeError, match="returned 1 rows of multivector for 2 inputs"):
        list(task_results(Answering(short=True), batch_of(2), header, version=None))
    with pytest.raises(RuntimeError, match="hold 2 rows and its batch 3"):
        list(task_results(Answering(), batch_of(3), header, version=None))


@pytest.mark.parametrize("outputs", [["sparse"], ["embed", "multivector"], ["multivector", "sparse", "embed"]])
def test_a_request_for_several_outputs_gets_them_packed_from_the_same_run(outputs: list[str]) -> None:
    model = Answering()
    task = "outputs:" + ",".join(outputs)
    header = {"parts": [{"key": "a", "rows": [0, 1], "task": task}, {"key": "b", "rows": [0], "task": "sparse"}]}
    results = {out["parts"][0]["key"]: (out, array) for out, array in task_results(model, batch_of(3), header, None)}
    expected = {output: [0, 1] for output in outputs}
    expected["sparse"] = [*expected.get("sparse", []), 2]  # b's row too, in the same run
    assert model.calls == [expected]
    out, packed = results["a"]
    assert "normalizes" not in out and packed.ndim == 3  # packed: the worker normalized the dense vectors
    answers = late.unpack_outputs(packed, outputs, {"embed": 4, "multivector": 4})
    assert [sorted(answer) for answer in answers] == [sorted(outputs)] * 2
    if "embed" in outputs:
        assert [float(np.linalg.norm(answer["embed"])) for answer in answers] == pytest.approx([0.0, 1.0])
    if "multivector" in outputs:
        assert answers[1]["multivector"].shape == (5, 4) and answers[0]["multivector"].shape == (0, 4)  # row 0: zeros
    assert results["b"][1].shape == (1, 3, 2)
