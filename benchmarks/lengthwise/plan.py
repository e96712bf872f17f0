"""What ``lengths.py`` measures: the contenders' names, the plan of the whole sweep and of
``--quick``, and the targets at each length."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from comparing.onnx_contenders import ONNX_FP32
from lib.contenders import ST_NAME
from lib.report import tagged_log
from lib.stats import ratio

MAX_SEQ_LEN = 512
SERVER_FLAGS = ("--num-worker", "1", "--cpu", "--max-seq-len", str(MAX_SEQ_LEN))
AUTO, FP32, SERVER = "Encoder auto", "Encoder fp32", "server"
BULK = (AUTO, FP32, ST_NAME, ONNX_FP32)
SINGLE = (AUTO, ONNX_FP32, ST_NAME, SERVER)
CHECKED_ROWS = 8  # vectors of the warm-up batch sent back, to check the contenders agree
COLOURS = {AUTO: "C0", FP32: "C1", ST_NAME: "C2", ONNX_FP32: "C3", SERVER: "C4"}  # the same in both panels


@dataclass(frozen=True)
class Plan:
    """How much is measured: the whole sweep, or ``--quick``'s seconds."""

    lengths: tuple[int, ...]
    bulk_tokens: int
    repeats: int
    single: int
    warmup: int


FULL = Plan(lengths=(16, 64, 128, 256, 512), bulk_tokens=32_768, repeats=3, single=30, warmup=3)
QUICK = Plan(lengths=(16, 64), bulk_tokens=1_024, repeats=1, single=5, warmup=2)


@dataclass(frozen=True)
class Target:
    """A ratio of two contenders' figures at one length, and its goal."""

    name: str
    kind: str  # "bulk" (inputs/s) or "single" (p50 ms)
    over: str
    goal: float
    at_least: bool

    def measure(self, row: dict[str, Any]) -> float:
        key = "per_s" if self.kind == "bulk" else "p50_ms"
        figures = row[self.kind]
        if AUTO not in figures or self.over not in figures:
            return float("nan")
        return ratio(figures[AUTO][key], figures[self.over][key])

    def verdict(self, value: float) -> str:
        if math.isnan(value):  # a contender left out
            return "n/a"
        return "PASS" if (value >= self.goal if self.at_least else value <= self.goal) else "MISS"

    @property
    def goal_text(self) -> str:
        return f"{'>=' if self.at_least else '<='} {self.goal:g}"


TARGETS = (
    Target("bulk / sentence-transformers", "bulk", ST_NAME, 2.0, at_least=True),
    Target("bulk / ONNX Runtime fp32", "bulk", ONNX_FP32, 1.5, at_least=True),
    Target("one-input p50 / ONNX Runtime fp32 p50", "single", ONNX_FP32, 1.0, at_least=False),
)


log = tagged_log("lengths")
