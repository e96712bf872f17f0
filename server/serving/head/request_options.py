"""The options of one ENCODE request, read from its header and checked at the edge: each
field against its declared type and range (:data:`bertserve.client.protocol.ENCODE_OPTIONS`),
with a refusal that names the field, before anything is queued.

Pure: no sockets, no clock. The ventilator turns :class:`EncodeOptions` into the request's
deadline, its prompt, the side its inputs are cut on, and the dimensions the sink keeps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bertserve.client import protocol as p
from bertserve.client.late import OUTPUTS_TASK, check_outputs

from ...config.server import ServerConfig
from ...model.prompts import Prompts, UnknownPrompt
from ...model.tasks import late_kind, model_tasks, wrong_task
from ...tracing import checked_traceparent
from ..policy.admission import Refusal, chunking


@dataclass(frozen=True)
class EncodeOptions:
    is_tokenized: bool
    show_tokens: bool
    chunk: bool  # long inputs are encoded in windows
    timeout_s: float  # the request's deadline, from its arrival: the client's, at most the server's
    prompt: str  # put before every text ("" for none)
    truncation: str  # "right" or "left"
    dimensions: int | None  # keep the first k dimensions of each vector
    task: str = "embed"  # what the request asks of the model (its own task: checked)
    trace: str | None = None  # the caller's W3C traceparent, which the head's span continues
    normalize: bool | None = None  # unit-length vectors or not; None: as the model's modules say
    adapter: int = 0  # the LoRA task adapter the prompt chooses (.model.lora): its place + 1, 0 for none
    reads: str = ""  # how a late-interaction model reads the texts: as documents (""), "query" or "pairs"


def read_options(
    header: dict[str, Any],
    config: ServerConfig,
    model: dict[str, Any],
    prompts: Prompts,
    name: str = "",
    of_task: Callable[[str], list[str]] | None = None,
) -> EncodeOptions | Refusal:
    """The options ``header`` asks for, or the :class:`Refusal` of the first one at fault.
    ``model`` is what the workers reported (empty before the first is ready); ``name`` the
    model's name and ``of_task`` the served models of a task, for the refusal of a request of
    another task than the model's."""
    task = _task(header, config, model, name, of_task)
    if isinstance(task, Refusal):
        return task
    is_tokenized, show_tokens = header.get("is_tokenized", False), header.get("show_tokens", False)
    for name, value in (("is_tokenized", is_tokenized), ("show_tokens", show_tokens)):
        if not isinstance(value, bool):
            return Refusal(f"the header field {name} must be true or false, not {value!r}", "protocol")
    chunk, refusal = chunking(header.get("long_inputs"), config.model.long_inputs, model)
    if refusal is not None:
        return refusal
    timeout_s = _timeout(header.get("timeout_ms"), config)
    if isinstance(timeout_s, Refusal):
        return timeout_s
    prompt = _prompt(header.get("prompt_name"), is_tokenized, prompts)
    if isinstance(prompt, Refusal):
        return prompt
    truncation = header.get("truncation_direction", "right")
    if truncation not in p.TRUNCATION_DIRECTIONS:
        return Refusal(f"truncation_direction must be 'right' or 'left', not {truncation!r}")
    dimensions = _dimensions(header.get("dimensions"), model, task)
    if isinstance(dimensions, Refusal):
        return dimensions
    normalize = _normalize(header, model, task)
    if isinstance(normalize, Refusal):
        return normalize
    trace = header.get(p.TRACEPARENT_FIELD)
    if trace is not None and checked_traceparent(trace) is None:
        shown = repr(trace)[:80]
        return Refusal(f"traceparent must be a W3C traceparent, 00-<32 hex>-<16 hex>-<2 hex>, not {shown}", "protocol")
    adapter = 0 if is_tokenized else prompts.adapter_of(header.get("prompt_name"))
    reads = _reads(header, config, model, task)
    if isinstance(reads, Refusal):
        return reads
    return EncodeOptions(
        is_tokenized,
        show_tokens,
        chunk,
        timeout_s,
        prompt,
        truncation,
        dimensions,
        task,
        trace,
        normalize,
        adapter,
        reads,
    )


def _reads(header: dict[str, Any], config: ServerConfig, model: dict[str, Any], task: str) -> str | Refusal:
    """How a late-interaction model reads the request's texts (``is_query``: a ColBERT query)."""
    is_query = header.get("is_query", False)
    if not isinstance(is_query, bool):
        return Refusal(f"is_query must be true or false, not {is_query!r}")
    if is_query and task != "multivector":
        return Refusal(f"is_query applies to multivector requests, not to a {task} request")
    try:
        late = model.get("late") or late_kind(config.model.model_dir)
    except (ValueError, OSError):  # a directory its workers will report on
        late = ""
    if not late:
        return ""
    if task == "rerank":
        return "pairs"
    return "query" if is_query and late == "colbert" else ""


def _timeout(raw: Any, config: ServerConfig) -> float | Refusal:
    """The request's deadline in seconds from its arrival: the client's, at most the server's."""
    timeout_s = config.limits.request_timeout_ms / 1000
    if raw is None:
        return timeout_s
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not raw > 0:
        return Refusal(f"timeout_ms must be a number of milliseconds > 0, not {raw!r}")
    return min(timeout_s, raw / 1000) if math.isfinite(raw) else timeout_s


def _normalize(header: dict[str, Any], model: dict[str, Any], task: str) -> bool | Refusal | None:
    """Whether the request asks for unit-length vectors (None: as the model's modules say)."""
    normalize = header.get("normalize")
    if normalize is None:
        return None
    if not isinstance(normalize, bool):
        return Refusal(f"normalize must be true or false, not {normalize!r}")
    if task != "embed":
        return Refusal(f"normalize applies to sentence vectors, not to a {task} model's scores")
    if model.get("token_level"):
        return Refusal("normalize applies to sentence vectors, not to a model's token vectors (pooling NONE)")
    return normalize


def _dimensions(dimensions: Any, model: dict[str, Any], task: str) -> int | Refusal | None:
    """The dimensions the request keeps, checked against the model's (``model``: what the workers reported)."""
    if dimensions is None:
        return None
    if task != "embed":
        return Refusal(f"dimensions applies to sentence vectors, not to a {task} model's scores")
    dim = model.get("output_dim")
    most = dim if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0 else None
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
        return Refusal(f"dimensions must be an integer from 1 to {most or 'the model dimension'}, not {dimensions!r}")
    if most is not None and dimensions > most:
        return Refusal(f"dimensions={dimensions} is more than this model's {most} dimensions: ask for 1 to {most}")
    return dimensions


def _task(
    header: dict[str, Any],
    config: ServerConfig,
    model: dict[str, Any],
    name: str,
    of_task: Callable[[str], list[str]] | None,
) -> str | Refusal:
    """The task the request asks for (vectors unless it says), if it is the model's."""
    if header.get("outputs") is not None:
        return _outputs(header, config, model, name, of_task)
    task = header.get("task", "embed")
    if task not in p.TASKS:
        return Refusal(f"task must be one of {', '.join(p.TASKS)}, not {task!r}")
    tasks = model.get("tasks") or ([model["task"]] if model.get("task") else None)
    tasks = tasks or model_tasks(config.model.model_dir, config.model.task)
    own = tasks[0]
    if task not in tasks:
        served = of_task(task) if of_task is not None else None
        return Refusal(wrong_task(name or config.serving.served_model_name or "", own, task, served), p.WRONG_TASK)
    return str(task)


def _outputs(
    header: dict[str, Any],
    config: ServerConfig,
    model: dict[str, Any],
    name: str,
    of_task: Callable[[str], list[str]] | None,
) -> str | Refusal:
    """The task of a request for several outputs of a late-interaction model (``outputs``):
    ``outputs:`` and their names, each one the model answers."""
    if header.get("task") is not None:
        return Refusal("a request asks for a task or for outputs, not both: leave task out")
    try:
        outputs = check_outputs(header["outputs"])
    except ValueError as exc:
        return Refusal(str(exc))
    for output in outputs:
        refusal = _task({"task": output}, config, model, name, of_task)
        if isinstance(refusal, Refusal):
            return refusal
    return OUTPUTS_TASK + ",".join(outputs)


def _prompt(name: Any, is_tokenized: bool, prompts: Prompts) -> str | Refusal:
    if name is not None and not isinstance(name, str):
        return Refusal(f"prompt_name must be a string, not {type(name).__name__}")
    if is_tokenized:  # a prompt is text: a tokenized input is taken as it is
        if name is not None:
            return Refusal("prompt_name needs text inputs: tokenized inputs are encoded as they are")
        return ""
    try:
        return prompts.text_of(name)
    except UnknownPrompt as exc:
        return Refusal(str(exc))
