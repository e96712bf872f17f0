"""The models the HTTP API serves, as its callers name them: which one a request's ``model``
field picks (a name not served is a 404 listing those that are), and what the head says of
each (its ``CONFIG`` answer for that model), asked once a model and kept.

The head owns which model is the default: the front end's first ``CONFIG``, which names no
model, is answered for it and says its name (``default_model``). Every request the front end
sends names its model, so the HTTP API's default cannot drift from the one ZeroMQ clients get.
A model's name and its tokenizer are known without asking (:class:`ModelSettings`); its
dimension, prompts, normalization and version are the head's to say.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bertserve.client import protocol as p

from ..logs import ANSWERED_BY
from ..serving.policy.costs import TokenRule
from .gateway import Gateway, GatewayError
from .options import default_prompt_name, prompts
from .schemas import HTTPError, quoted

logger = logging.getLogger("bertserve.http")

_CONFIG_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ModelSettings:
    """What the HTTP process knows of one served model without asking the head."""

    name: str
    aliases: tuple[str, ...]  # --model-alias: other names of the model (a server of one model only)
    tokenizer: Any  # WordPieceTokenizer, the workers' own: /tokenize, over-long inputs, token ids to tokens

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def token_rule(self) -> TokenRule:
        """How the model's tokenizer turns bytes into tokens, at most (:mod:`..serving.policy.costs`)."""
        tokenizer = self.tokenizer
        return TokenRule(
            max_len=tokenizer.max_len,
            single=tokenizer.num_special_tokens(),
            pair=tokenizer.num_special_tokens(pair=True),
            stride=tokenizer.stride,
        )


def not_served(name: str, served: Sequence[str]) -> HTTPError:
    """The 404 for a request naming a model this server does not serve."""
    return HTTPError(
        404,
        f"the model {quoted(name)} is not served here; this server serves {', '.join(map(repr, served))}",
        param="model",
        code="model_not_found",
    )


class Catalog:
    """The served models by every name a request may give, the default one first, and the
    head's ``CONFIG`` answer for each: kept once a worker has reported the model (its
    dimension), asked again until then."""

    def __init__(self, models: Sequence[ModelSettings], gateway: Gateway) -> None:
        if not models:
            raise ValueError("the HTTP API serves at least one model")
        self._gateway = gateway
        self._by_name = {name: model for model in models for name in model.names}
        head_default = gateway.config.get("default_model")
        default = next((model for model in models if model.name == head_default), models[0])
        if head_default is not None and default.name != head_default:
            logger.warning(
                "the server's default model %r is not among those the HTTP API serves; its default is %r",
                head_default,
                default.name,
            )
        self.default = default
        self.models = (default, *(model for model in models if model is not default))
        said = gateway.config.get("models")
        summaries = [entry for entry in said if isinstance(entry, dict)] if isinstance(said, list) else []
        self._tasks = {str(e.get("name")): _tasks(e) for e in summaries}  # as the head says
        chosen = gateway.config.get("default_models")
        self._task_defaults = {
            task: self._by_name[name]
            for task, name in (chosen.items() if isinstance(chosen, dict) else ())
            if isinstance(name, str) and name in self._by_name
        }
        self._said: dict[str, dict[str, Any]] = {}
        if gateway.config.get("model_name", default.name) == default.name:  # the answer at start is the default's
            self._said[default.name] = gateway.config

    @property
    def names(self) -> list[str]:
        """Every name a request may give, the default model's first."""
        return [name for model in self.models for name in model.names]

    def pick(self, name: str | None, task: str | None = None) -> ModelSettings:
        """The model a request's ``model`` field names; 404 for none. Without a name, the
        default model of ``task`` (the endpoint's: ``/rerank`` asks for ``rerank``), as the
        head says it (``--default-model TASK=NAME``, else the one served with the task), else
        the default one."""
        if name is None:
            model = self._task_defaults.get(task, self.default) if task is not None else self.default
        elif (found := self._by_name.get(name)) is not None:
            model = found
        else:
            raise not_served(name, self.names)
        ANSWERED_BY.set(model.name)  # the access line names it
        return model

    def of_task(self, task: str) -> list[str]:
        """The names of the served models of ``task``, as the head said at start."""
        return [model.name for model in self.models if task in self._tasks.get(model.name, ())]

    def last(self, model: ModelSettings) -> dict[str, Any]:
        """What the head said of ``model`` last (empty: nothing yet)."""
        return self._said.get(model.name, {})

    async def said(self, model: ModelSettings) -> dict[str, Any]:
        """What the head said of ``model``, asked if it never did: its prompts are known from
        the start, before any worker is up."""
        return self._said.get(model.name) or await self.ask(model)

    async def info(self, model: ModelSettings) -> dict[str, Any]:
        """What the head says of ``model`` once a worker has reported it (``output_dim`` and
        the rest); 503 if the head does not answer."""
        said = self._said.get(model.name)
        if said is None or "output_dim" not in said:  # asked before a worker was ready
            said = await self.ask(model)
        return said

    async def ask(self, model: ModelSettings) -> dict[str, Any]:
        """The head's ``CONFIG`` answer for ``model``, kept; the last one if it refuses."""
        gateway = self._gateway
        try:
            reply = await gateway.request(
                gateway.client_id("bertserve"), p.CONFIG, model=model.name, timeout_s=_CONFIG_TIMEOUT_S
            )
        except GatewayError as exc:
            raise HTTPError(503, f"the server is not answering: {exc}") from None
        if reply.ok:
            self._said[model.name] = reply.header
        elif reply.header.get("kind") == p.UNKNOWN_MODEL:
            raise HTTPError(404, str(reply.header.get("error")), param="model", code="model_not_found")
        return self.last(model)

    async def listed(self) -> list[dict[str, Any]]:
        """``/v1/models``'s entries: every served model, the default first, each followed by its
        aliases. The head's list of models says each one's dimension, dtype and version (asked
        each time: a version swap changes them), each model's own answer its prompts; a head
        that does not answer leaves what it said last."""
        created = int(time.time())
        try:
            current = await self.ask(self.default)
            answering = True
        except HTTPError:
            current, answering = self.last(self.default), False
        summaries = {entry.get("name"): entry for entry in current.get("models", ()) if isinstance(entry, dict)}
        entries = []
        for model in self.models:
            info = self.last(model)
            if answering and model is not self.default:
                try:
                    info = await self.info(model)
                except HTTPError:
                    answering = False
            summary = summaries.get(model.name, {})
            about = {
                "output_dim": summary.get("output_dim") or info.get("output_dim"),
                "max_seq_len": model.tokenizer.max_len,
                "dtype": summary.get("dtype") or info.get("dtype"),
                "task": summary.get("task") or info.get("task") or "embed",
                "model_version": summary.get("model_version"),
                "model_commit": info.get("model_commit"),
                "prompts": prompts(info),
                "default_prompt_name": default_prompt_name(info),
            }
            entries += [
                {"id": name, "object": "model", "created": created, "owned_by": "bertserve", **about}
                for name in model.names
            ]
        return entries


def _tasks(summary: dict[str, Any]) -> tuple[str, ...]:
    """The tasks a model answers, as the head's summary of it says: its ``tasks`` (a
    late-interaction model's several), else its ``task``."""
    tasks = summary.get("tasks")
    if isinstance(tasks, list) and tasks:
        return tuple(str(task) for task in tasks)
    return (str(summary.get("task") or "embed"),)
