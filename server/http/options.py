"""What an HTTP request asks of the server beside its inputs, checked against the served
model before anything is sent, with messages that name the field at fault: the ENCODE
header options of :data:`bertserve.client.protocol.ENCODE_OPTIONS` (``dimensions``,
``prompt_name``, ``truncation_direction``, ``long_inputs``), and the prompts the server
knows (its ``CONFIG`` answer: ``prompts``, ``default_prompt_name``).

The server checks the same fields again; checking them here first gives each API's own
error format, names the model's dimension and the known prompts, and lets ``/tokenize``
and ``/embed``'s length check apply the prompt the workers will apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bertserve.client.late import OUTPUTS_TASK

from ..model.prompts import apply_prompt
from .schemas import HTTPError, quoted


@dataclass(frozen=True)
class Asked:
    """The options of one encode request, checked; :meth:`header` is what ENCODE carries."""

    long_inputs: str | None = None
    dimensions: int | None = None
    prompt_name: str | None = None
    truncation_direction: str | None = None
    task: str | None = None  # what the request asks of the model; None: vectors
    normalize: bool | None = None  # unit-length vectors or not; None: as the model's modules say
    is_query: bool | None = None  # a multivector request's inputs are queries (ColBERT's reading)
    outputs: tuple[str, ...] | None = None  # several outputs of a late-interaction model, from one run

    @property
    def answered(self) -> str | None:
        """The task the answer is counted as (:mod:`..serving.policy.costs`): a request for
        several outputs, their packing (``outputs:embed,sparse``); else its task."""
        return OUTPUTS_TASK + ",".join(self.outputs) if self.outputs else self.task

    def header(self, timeout_s: float) -> dict[str, Any]:
        """The ENCODE header fields: these options, and the request's deadline."""
        fields = {
            "long_inputs": self.long_inputs,
            "dimensions": self.dimensions,
            "prompt_name": self.prompt_name,
            "truncation_direction": self.truncation_direction,
            "task": self.task,
            "normalize": self.normalize,
            "is_query": self.is_query,
            "outputs": list(self.outputs) if self.outputs else None,
        }
        return {"timeout_ms": max(1, round(timeout_s * 1000)), **{k: v for k, v in fields.items() if v is not None}}


def asked(body: Any, info: dict[str, Any]) -> Asked:
    """The options of ``body`` (any encode request body), checked against ``info`` (the
    server's ``CONFIG`` answer); :class:`HTTPError` 422 naming the first at fault."""
    return Asked(
        long_inputs=getattr(body, "long_inputs", None),
        dimensions=checked_dimensions(getattr(body, "dimensions", None), info),
        prompt_name=checked_prompt_name(getattr(body, "prompt_name", None), info),
        truncation_direction=direction(getattr(body, "truncation_direction", None)),
    )


def direction(value: str | None) -> str | None:
    """TEI's ``Left``/``Right`` as the protocol's ``left``/``right``."""
    return value.lower() if value is not None else None


def checked_dimensions(k: int | None, info: dict[str, Any]) -> int | None:
    if k is None:
        return None
    dim = info.get("output_dim")
    if isinstance(dim, int) and not 1 <= k <= dim:
        raise HTTPError(
            422,
            f"dimensions={k} is out of range: this model's vectors have {dim} dimensions; ask for 1 to {dim}",
            param="dimensions",
        )
    return k


def prompts(info: dict[str, Any]) -> dict[str, str]:
    """The server's prompts, name to text."""
    known = info.get("prompts")
    if not isinstance(known, dict):
        return {}
    return {str(name): str(text) for name, text in known.items()}


def default_prompt_name(info: dict[str, Any]) -> str | None:
    name = info.get("default_prompt_name")
    return name if isinstance(name, str) and name in prompts(info) else None


def checked_prompt_name(name: str | None, info: dict[str, Any]) -> str | None:
    if name is None:
        return None
    known = prompts(info)
    if name not in known:
        listed = ", ".join(map(repr, sorted(known))) if known else "none (start it with --prompt NAME=TEXT)"
        raise HTTPError(
            422, f"prompt_name={quoted(name)} is not one of this server's prompts: {listed}", param="prompt_name"
        )
    return name


def prompt_text(name: str | None, info: dict[str, Any]) -> str:
    """The text the workers put before each input of a request that names ``name`` (None:
    the server's default prompt); "" for none."""
    chosen = name if name is not None else default_prompt_name(info)
    return prompts(info).get(chosen, "") if chosen is not None else ""


def prompted(texts: list[Any], name: str | None, info: dict[str, Any]) -> list[Any]:
    """``texts`` as the workers encode them: each after the text of the prompt ``name`` (None:
    the server's default prompt, if any; see :func:`prompt_text`)."""
    prompt = prompt_text(name, info)
    return apply_prompt(texts, prompt) if prompt else texts
