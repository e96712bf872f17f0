"""The sweep of ``lengths.py``: every length, the contenders taking turns in an order that
rotates, and each length's row of figures and targets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from bertserve.client import BertClient
from lib.load import timed
from lib.stats import cosine_rows, latency_row, median

from lengthwise.children import Child
from lengthwise.inputs import LengthInputs
from lengthwise.plan import AUTO, BULK, CHECKED_ROWS, FP32, SERVER, SINGLE, TARGETS, Plan, log


def rotated(names: Sequence[str], turn: int) -> list[str]:
    shift = turn % len(names)
    return [*names[shift:], *names[:shift]]


def server_seconds(client: BertClient, texts: list[str], warmup: int) -> list[float]:
    for text in texts[:warmup]:
        client.encode([text])
    return [timed(lambda t=text: client.encode([t]))[0] for text in texts[warmup:]]


def sweep(
    plan: Plan, inputs: dict[int, LengthInputs], children: dict[str, Child], client: BertClient | None
) -> list[dict]:
    """Every length, ``plan.repeats`` times, the contenders taking turns at each: bulk, then
    one input at a time. One untimed batch per contender and length first."""
    bulk_names = [name for name in BULK if name in children]
    single_names = [name for name in SINGLE if name in children or (name == SERVER and client is not None)]
    rates = {length: {name: [] for name in bulk_names} for length in inputs}
    seconds = {length: {name: [] for name in single_names} for length in inputs}
    cosines = {}
    for length, planned in inputs.items():
        warm = {name: children[name].ask(op="bulk", texts=planned.warm, rows=CHECKED_ROWS) for name in bulk_names}
        cosines[length] = agreement(warm)
        if client is not None:
            client.encode(planned.warm)
        log(f"{length} tokens, warm-up batch: " + ", ".join(f"{n} {r['seconds']:.2f} s" for n, r in warm.items()))
    for repeat in range(plan.repeats):
        for index, (length, planned) in enumerate(inputs.items()):
            turn = repeat * len(inputs) + index
            bulk, single = planned.bulk[repeat], planned.single[repeat]
            for name in rotated(bulk_names, turn):
                rates[length][name].append(len(bulk) / children[name].ask(op="bulk", texts=bulk)["seconds"])
            for name in rotated(single_names, turn):
                if name == SERVER:
                    assert client is not None
                    seconds[length][name].append(server_seconds(client, single, plan.warmup))
                else:
                    reply = children[name].ask(op="single", texts=single, warmup=plan.warmup)
                    seconds[length][name].append(reply["seconds"])
            log(
                f"repeat {repeat + 1}/{plan.repeats}, {length} tokens: "
                + ", ".join(f"{n} {rates[length][n][-1]:.0f}/s" for n in bulk_names)
                + "; p50 "
                + ", ".join(f"{n} {1000 * median(seconds[length][n][-1]):.1f} ms" for n in single_names)
            )
    return [row(length, inputs[length], rates[length], seconds[length], cosines[length]) for length in inputs]


def agreement(warm: dict[str, dict]) -> dict[str, float]:
    """Each contender's least cosine to the ``Encoder`` at fp32 (else at auto) on the first
    rows of the warm-up batch: a check that all encode the same inputs alike."""
    reference = FP32 if FP32 in warm else AUTO
    base = np.asarray(warm[reference]["vectors"], dtype=np.float64)
    return {
        name: round(float(cosine_rows(np.asarray(reply["vectors"], dtype=np.float64), base).min()), 5)
        for name, reply in warm.items()
        if name != reference
    }


def row(length: int, planned: LengthInputs, rates: dict, seconds: dict, cosines: dict) -> dict[str, Any]:
    out: dict[str, Any] = {
        "tokens": length,
        "bulk_inputs": len(planned.bulk[0]),
        "bulk": {name: {"per_s": median(runs), "runs": runs} for name, runs in rates.items()},
        "single": {
            name: {**latency_row([s for run in runs for s in run]), "p50_ms_by_run": [1000 * median(r) for r in runs]}
            for name, runs in seconds.items()
        },
        "min_cosine": cosines,
    }
    values = {target: target.measure(out) for target in TARGETS}
    out["targets"] = {
        t.name: {"value": value, "goal": t.goal_text, "verdict": t.verdict(value)} for t, value in values.items()
    }
    return out
