"""``suite.py compare``, its targets: each a measured figure against a goal, PASS, MISS or n/a
(not measured: a contender left out, a dtype this server refuses)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lib.contenders import ST_NAME
from lib.stats import fmt, ratio

from comparing.latency import LatencyResult
from comparing.onnx_contenders import ONNX_INT8

SERVER_FP32, SERVER_BF16 = "server fp32", "server bf16"
SERVER_INT8, SERVER_AUTO = "server int8", "server auto"
SERVER_NO_MERGE = "server fp32 no-merge"
CLIENTS_MERGE, CLIENTS_NO_MERGE = "single-sentence clients, merging on", "single-sentence clients, merging off"
ENCODER_FP32 = "Encoder fp32"  # the fp32 reference of the in-process contenders' vectors
AUTO_NOISE = 0.10  # "within noise": the auto server's bulk rate within 10 % of the fp32 server's


@dataclass
class Target:
    name: str
    measured: float | None
    target: str
    passed: bool | None
    detail: str


@dataclass
class TargetInputs:
    """What the targets are computed from (the report's figures, gathered)."""

    rates: dict[str, float]  # median sentences/s per throughput row
    runs: dict[str, list[float]]  # per repeat
    latency: LatencyResult
    padding: float
    warm_to_cold: float
    startup_detail: str
    st_targets: tuple[float, float]
    accuracy: dict[str, dict[str, Any]]  # name -> {"min", "mean", "reference"}: cosines to fp32
    single_p50_ms: dict[str, float]  # server -> one-sentence p50, the servers taking turns
    fp32_ceiling: float | None  # sentences/s
    native_bf16: bool
    bf16_ceiling: float | None = None  # sentences/s
    int8_units: bool = False  # the CPU has VNNI or AMX-int8


def target(name: str, measured: float, op: str, bound: float, detail: str) -> Target:
    """A target row; ``op`` is ``>=`` or ``<=``; NaN (not measured), on either side, is neither
    PASS nor MISS."""
    if math.isnan(bound):  # a bound measured on a contender left out
        return Target(name, None if math.isnan(measured) else round(measured, 3), f"{op} n/a", None, detail)
    if math.isnan(measured):
        return Target(name, None, f"{op} {bound:g}", None, detail)
    passed = measured >= bound if op == ">=" else measured <= bound
    return Target(name, round(measured, 3), f"{op} {bound:g}", passed, detail)


def throughput_target(inputs: TargetInputs, name: str, top: str, bottom: str, bound: float) -> Target:
    """``top``/``bottom`` as a ratio of medians; the detail lists the ratio within each repeat."""
    if top not in inputs.rates or bottom not in inputs.rates:
        return target(name, math.nan, ">=", bound, f"not measured: no {top if top not in inputs.rates else bottom}")
    paired = ", ".join(f"{x / y:.2f}" for x, y in zip(inputs.runs[top], inputs.runs[bottom], strict=False) if y)
    measured = ratio(inputs.rates[top], inputs.rates[bottom])
    return target(name, measured, ">=", bound, f"ratio of medians; per repeat: {paired}")


def cosine_target(inputs: TargetInputs, row: str, kind: str, bound: float) -> Target:
    found = inputs.accuracy.get(row)
    measured = math.nan if found is None else found[kind]
    detail = f"{row} vs {found['reference']}, per sentence" if found else f"not measured: no {row}"
    return target(f"{row}: {kind} cosine to fp32", measured, ">=", bound, detail)


def base_targets(inputs: TargetInputs) -> list[Target]:
    lat = inputs.latency
    p99, limit = lat.under_load.p99, lat.limit_ms
    st_fp32, st_bf16 = inputs.st_targets
    return [
        throughput_target(inputs, "server fp32 / sentence-transformers", SERVER_FP32, ST_NAME, st_fp32),
        throughput_target(inputs, "server bf16 / sentence-transformers", SERVER_BF16, ST_NAME, st_bf16),
        throughput_target(inputs, "server fp32 / Encoder fp32", SERVER_FP32, ENCODER_FP32, 0.95),
        throughput_target(inputs, "server bf16 / Encoder bf16", SERVER_BF16, "Encoder bf16", 0.95),
        throughput_target(inputs, "single-sentence clients / one bulk client", CLIENTS_MERGE, SERVER_FP32, 0.6),
        target(
            "p99 under load / (idle p50 + 1.5 x bulk job)",
            ratio(p99, math.nan if limit is None else limit),
            "<=",
            1.0,
            f"p99 {p99:.0f} ms vs limit {fmt(limit, 0)} ms",
        ),
        target("padding fraction (bulk corpus)", inputs.padding, "<=", 0.15, "server fp32, median of repeats"),
        target("warm start / cold start", inputs.warm_to_cold, "<=", 0.5, inputs.startup_detail),
    ]


def int8_targets(inputs: TargetInputs) -> list[Target]:
    p50 = inputs.single_p50_ms
    fp32_p50, int8_p50 = p50.get(SERVER_FP32, math.nan), p50.get(SERVER_INT8, math.nan)
    latency_detail = (
        f"p50 {int8_p50:.1f} ms vs {fp32_p50:.1f} ms, idle servers taking turns"
        if SERVER_INT8 in p50
        else f"not measured: no {SERVER_INT8}"
    )
    return [
        throughput_target(inputs, "server int8 / server fp32", SERVER_INT8, SERVER_FP32, 1.8),
        target("one-sentence p50: server int8 / server fp32", ratio(int8_p50, fp32_p50), "<=", 0.6, latency_detail),
        throughput_target(inputs, f"server int8 / {ONNX_INT8}", SERVER_INT8, ONNX_INT8, 1.5),
        cosine_target(inputs, SERVER_INT8, "min", 0.99),
        cosine_target(inputs, SERVER_INT8, "mean", 0.998),
    ]


def roofline_target(inputs: TargetInputs, row: str = SERVER_FP32, dtype: str = "fp32") -> Target:
    ceilings = {"fp32": inputs.fp32_ceiling, "bf16": inputs.bf16_ceiling}
    ceiling = math.nan if ceilings[dtype] is None else ceilings[dtype]
    rate = inputs.rates.get(row, math.nan)
    detail = f"{rate:.0f} of {ceiling:.0f} sentences/s" if not math.isnan(ceiling) else "matmul rate not measured"
    return target(f"{row} / {dtype} matmul ceiling", ratio(rate, ceiling), ">=", 0.70, detail)


def native_targets(inputs: TargetInputs) -> list[Target]:
    """Where the CPU has bf16 and int8 matrix units: the default dtype near the bf16 ceiling,
    and int8 ahead of bf16 (not measurable on a CPU without them: left out)."""
    found = []
    if inputs.native_bf16:
        found.append(roofline_target(inputs, SERVER_AUTO, "bf16"))
    if inputs.int8_units:
        found.append(throughput_target(inputs, "server int8 / server bf16 (int8 units)", SERVER_INT8, SERVER_BF16, 1.3))
    return found


def bf16_targets(inputs: TargetInputs) -> list[Target]:
    """With native bf16, bf16 must pay; without, ``--dtype auto`` must be fp32 and cost nothing."""
    if inputs.native_bf16:
        return [
            throughput_target(inputs, "server bf16 / server fp32 (native bf16)", SERVER_BF16, SERVER_FP32, 1.8),
            cosine_target(inputs, SERVER_BF16, "min", 0.999),
        ]
    name = "server auto / server fp32 (no native bf16: auto = fp32 here)"
    if SERVER_AUTO not in inputs.rates or SERVER_FP32 not in inputs.rates:
        return [Target(name, None, f"within {AUTO_NOISE:.0%}", None, f"not measured: no {SERVER_AUTO}")]
    measured = ratio(inputs.rates[SERVER_AUTO], inputs.rates[SERVER_FP32])
    paired = ", ".join(
        f"{x / y:.2f}" for x, y in zip(inputs.runs[SERVER_AUTO], inputs.runs[SERVER_FP32], strict=False) if y
    )
    passed = abs(measured - 1) <= AUTO_NOISE
    return [Target(name, round(measured, 3), f"within {AUTO_NOISE:.0%}", passed, f"per repeat: {paired}")]


def compute_targets(inputs: TargetInputs) -> list[Target]:
    return [
        *base_targets(inputs),
        *int8_targets(inputs),
        roofline_target(inputs),
        *bf16_targets(inputs),
        *native_targets(inputs),
    ]


def targets_markdown(targets: Sequence[Target]) -> str:
    lines = ["| target | measured | goal | result | detail |", "| --- | ---: | --- | --- | --- |"]
    for t in targets:
        result = "n/a" if t.passed is None else ("PASS" if t.passed else "MISS")
        lines.append(f"| {t.name} | {fmt(t.measured, 3)} | {t.target} | {result} | {t.detail} |")
    return "\n".join(lines)
