"""How the ``Encoder`` cuts a batch into model runs, and how many of them run at once.

A batch's rows are sorted by length and cut into runs of at most ``batch_size`` rows, where
padding the run to the next length would cost more than a run does (:data:`RUN_COST_TOKENS`).
On the CPU, :data:`CONCURRENT_RUNS` runs go side by side (``Encoder._runner``): one run's small
ops leave a core idle, so a second run fills it. A batch that would be one run is cut in two
when each half keeps at least :data:`MIN_SIDE_BY_SIDE_ROWS` rows, at the row that evens the
two halves' padded tokens. That is a merged job of a few clients' sentences, the usual job of
a server with many one-sentence clients. Measured with all-MiniLM-L6-v2 on a 2-core AMD EPYC
(avx512_bf16), in bf16, as one run against two side by side: 6 rows 0.89x the time, 8 rows
0.82x, 16 rows 0.72x, 32 rows 0.73x; 4 rows 0.93-1.03x and 2 rows 1.33x, so those stay whole.
"""

from __future__ import annotations

import numpy as np

# What one more model run costs beyond its tokens, in padded token positions: a run is padded
# rather than another started only while the padding is cheaper than this. A TensorFlow run
# costs 6 ms (bf16) to 10 ms (fp32) before its first token on a 2-core Xeon with AMX, 120 to
# 200 tokens' time in bulk. At 160 the benchmark corpus pads 4.3% in bulk (1.5% at 32) in 41
# runs (46), and a merged job of 17 random sentences takes 1.4 runs (2.4).
RUN_COST_TOKENS = 160
CONCURRENT_RUNS = 2  # model runs of one batch at once on the CPU (Encoder._runner)
MIN_SIDE_BY_SIDE_ROWS = 3  # rows of each half of a run cut in two to go side by side


def plan_runs(lengths: np.ndarray, batch_size: int, *, side_by_side: bool) -> list[np.ndarray]:
    """The row indexes of each model run over rows of ``lengths`` tokens: sorted by length, at
    most ``batch_size`` rows each, cut where padding costs more than a run; with
    ``side_by_side`` (runs go :data:`CONCURRENT_RUNS` at a time), a lone run of enough rows is
    cut in two."""
    order = np.argsort(lengths, kind="stable")
    ordered = lengths[order].tolist()
    runs, start = [], 0
    for i in range(1, len(order)):
        rows = i - start
        if rows >= batch_size or rows * (ordered[i] - ordered[i - 1]) > RUN_COST_TOKENS:
            runs.append(order[start:i])
            start = i
    runs.append(order[start:])
    if side_by_side and len(runs) == 1 and len(order) >= 2 * MIN_SIDE_BY_SIDE_ROWS:
        cut = _even_cut(ordered)
        runs = [order[:cut], order[cut:]]
    return runs


def _even_cut(ordered: list[int]) -> int:
    """Where to cut rows of ``ordered`` (ascending) lengths in two so the longer half's padded
    tokens (its rows x its longest) are fewest: each half keeps MIN_SIDE_BY_SIDE_ROWS rows."""
    n, longest = len(ordered), ordered[-1]
    cuts = range(MIN_SIDE_BY_SIDE_ROWS, n - MIN_SIDE_BY_SIDE_ROWS + 1)
    return min(cuts, key=lambda i: (max(i * ordered[i - 1], (n - i) * longest), abs(n - 2 * i)))
