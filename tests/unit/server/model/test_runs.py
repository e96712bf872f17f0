"""How a batch is cut into model runs (server/model/runs.py), and the Encoder's use of it."""

from __future__ import annotations

import numpy as np
import pytest
from bertserve.server import Encoder
from bertserve.server.model.runs import MIN_SIDE_BY_SIDE_ROWS, RUN_COST_TOKENS, plan_runs


def rows_of(runs: list[np.ndarray]) -> list[list[int]]:
    return [run.tolist() for run in runs]


def test_every_row_is_in_exactly_one_run_sorted_by_length() -> None:
    rng = np.random.default_rng(7)
    for n in range(1, 80):
        lengths = rng.integers(3, 120, n)
        for side_by_side in (False, True):
            runs = plan_runs(lengths, 16, side_by_side=side_by_side)
            together = np.concatenate(runs)
            assert sorted(together.tolist()) == list(range(n))
            assert all(len(run) <= 16 for run in runs)
            ordered = lengths[together]
            assert (np.diff(ordered) >= 0).all()  # runs in length order, each run's rows too


def test_a_lone_run_of_enough_rows_is_cut_in_two_to_go_side_by_side() -> None:
    lengths = np.array([12, 10, 11, 9, 10, 12, 11, 9])
    assert len(plan_runs(lengths, 64, side_by_side=False)) == 1
    halves = plan_runs(lengths, 64, side_by_side=True)
    assert len(halves) == 2 and all(len(half) >= MIN_SIDE_BY_SIDE_ROWS for half in halves)
    few = np.arange(2 * MIN_SIDE_BY_SIDE_ROWS - 1) + 10  # too few rows for two halves
    assert len(plan_runs(few, 64, side_by_side=True)) == 1
    one = plan_runs(np.array([5]), 64, side_by_side=True)
    assert rows_of(one) == [[0]]


def test_the_cut_evens_the_halves_padded_tokens() -> None:
    # Ten short rows and three long ones: the long half's padding decides, so it stays small.
    lengths = np.array([8] * 10 + [40] * 3)
    short, long = plan_runs(lengths, 64, side_by_side=True)
    assert len(long) == MIN_SIDE_BY_SIDE_ROWS and int(lengths[long].min()) == 40
    assert int(lengths[short].max()) == 8
    equal = plan_runs(np.full(10, 20), 64, side_by_side=True)
    assert [len(half) for half in equal] == [5, 5]


def test_runs_already_cut_are_not_cut_again() -> None:
    lengths = np.array([4] * 6 + [4 + RUN_COST_TOKENS] * 6)  # padding the short rows costs more than a run
    assert [len(run) for run in plan_runs(lengths, 64, side_by_side=True)] == [6, 6]
    assert [len(run) for run in plan_runs(np.full(20, 9), 8, side_by_side=True)] == [8, 8, 4]


@pytest.mark.parametrize("lite_max_tokens", [0, 10_000])
def test_the_encoder_runs_halves_side_by_side_only_on_tensorflow(
    tiny_google: str, session_graph_dir: str, lite_max_tokens: int
) -> None:
    texts = [" ".join(["the dog"] * (i % 5 + 1)) for i in range(12)]
    encoder = Encoder(tiny_google, lite_max_tokens=lite_max_tokens, graph_dir=session_graph_dir)
    runs = encoder.plan(encoder.tokenize(texts))
    assert len(runs) == (2 if lite_max_tokens == 0 else 1)  # LiteRT runs one at a time: whole
    whole = Encoder(tiny_google, batch_size=128, lite_max_tokens=0, graph_dir=session_graph_dir)
    one_by_one = np.concatenate([whole.encode([text]) for text in texts])
    np.testing.assert_allclose(encoder.encode(texts), one_by_one, atol=2e-5)
