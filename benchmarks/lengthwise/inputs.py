"""``lengths.py``'s inputs at each length: a warm-up batch, and each repeat's bulk and one-input
sets, every one of exactly that many tokens (:func:`lib.token_lengths.exact_inputs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lib.token_lengths import TokenStream, exact_inputs

from lengthwise.plan import Plan


@dataclass(frozen=True)
class LengthInputs:
    """Every input at one length: a warm-up batch, and each repeat's bulk and one-input sets."""

    tokens: int
    warm: list[str]
    bulk: list[list[str]]
    single: list[list[str]]  # the warm-up inputs first

    def everything(self) -> list[str]:
        return [*self.warm, *(t for texts in self.bulk for t in texts), *(t for texts in self.single for t in texts)]


def length_inputs(stream: TokenStream, tokenizer: Any, length: int, plan: Plan, batch_size: int) -> LengthInputs:
    per_bulk, per_single = max(plan.bulk_tokens // length, 1), plan.warmup + plan.single
    texts = exact_inputs(stream, tokenizer, length, batch_size + plan.repeats * (per_bulk + per_single), seed=length)
    warm, rest = texts[:batch_size], texts[batch_size:]
    bulk = [rest[r * per_bulk : (r + 1) * per_bulk] for r in range(plan.repeats)]
    rest = rest[plan.repeats * per_bulk :]
    single = [rest[r * per_single : (r + 1) * per_single] for r in range(plan.repeats)]
    return LengthInputs(length, warm, bulk, single)
