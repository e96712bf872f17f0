"""What one HTTP request may cost, checked before anything is tokenized or sent: its tokens of
model work (``--max-request-tokens``), its answer as JSON (``--max-reply-bytes``) and its frame
to the head (the head's ``max_message_bytes``). The rules are :mod:`..serving.policy.costs`';
this module answers a request past them with the 413 that says which and by how much."""

from __future__ import annotations

import math
from typing import Any

from ..serving.policy import costs
from .catalog import ModelSettings
from .options import Asked, prompt_text
from .schemas import HTTPError


class Bounds:
    """The bounds of one HTTP process: ``request_tokens`` and ``reply_bytes`` from its flags,
    ``message_bytes`` from the head's ``CONFIG`` answer (None: the head did not say)."""

    def __init__(self, *, request_tokens: int, reply_bytes: int, message_bytes: int | None) -> None:
        self.request_tokens, self.reply_bytes, self.message_bytes = request_tokens, reply_bytes, message_bytes

    def tokens(self, total: int) -> None:
        """413 unless ``total`` tokens of model work are within ``--max-request-tokens``."""
        problem = costs.too_many_tokens(total, self.request_tokens)
        if problem is not None:
            raise HTTPError(413, problem, code="limit")

    def frame(self, nbytes: int) -> None:
        """413 unless a request of texts of about ``nbytes`` UTF-8 bytes fits one frame to the
        head: known before the texts are written."""
        limit = self.message_bytes
        if limit is not None and nbytes > limit:
            raise HTTPError(
                413,
                f"the request's texts take about {nbytes} bytes; the server takes at most {limit} bytes per "
                "message (max_message_bytes): send fewer or shorter texts per request",
                code="limit",
            )

    def reply(
        self,
        rows: int,
        info: dict[str, Any],
        value_bytes: float,
        dimensions: int | None = None,
        *,
        form: str = "",
        task: str | None = None,
        how: str = "",
    ) -> None:
        """413 unless an answer of ``rows`` rows of the model of ``info`` (its ``CONFIG``
        answer) to a request of ``task``, each value ``value_bytes`` as it is answered, is
        within ``--max-reply-bytes``; ``how`` adds a way to ask for less."""
        row_bytes = math.ceil(costs.row_values(info, dimensions, task) * value_bytes)
        problem = costs.too_large_reply(rows, row_bytes, self.reply_bytes, form)
        if problem is not None and how:
            problem = f"{problem}, {how}"
        if problem is not None:
            raise HTTPError(413, problem, code="limit")

    def answer(self, nbytes: int, how: str) -> None:
        """413 unless an answer of ``nbytes`` as JSON is within ``--max-reply-bytes``; ``how``
        says how to ask for less."""
        if nbytes > self.reply_bytes:
            raise HTTPError(
                413,
                f"the answer would take {nbytes / 2**20:.1f} MiB as JSON; this server answers at most "
                f"{self.reply_bytes / 2**20:.1f} MiB per request (--max-reply-bytes): {how}",
                code="limit",
            )

    def request(
        self,
        model: ModelSettings,
        info: dict[str, Any],
        texts: list[Any],
        options: Asked,
        value_bytes: float = costs.JSON_FLOAT_BYTES,
        *,
        how: str = "",
    ) -> None:
        """413 unless the JSON answer of ``texts`` and their tokens of model work (their prompt
        counted) fit: the answer first, whose refusal says how many inputs fit (and ``how``
        else to ask for less)."""
        if costs.answers_by_token(info, options.answered):  # a late-interaction model's vectors a token
            query = bool(options.is_query) and bool(info.get("query_length"))
            sizes = costs.token_answer_bytes(info, texts, str(options.answered), value_bytes, query=query)
            problem = costs.too_large_answer(sizes, self.reply_bytes, " as JSON", how)
            if problem is not None:
                raise HTTPError(413, problem, code="limit")
        else:
            dimensions, task = options.dimensions, options.answered
            self.reply(len(texts), info, value_bytes, dimensions, form=" as JSON", task=task, how=how)
        chunk = (options.long_inputs or info.get("long_inputs")) == "chunk"
        prompt = costs.utf8_bytes(prompt_text(options.prompt_name, info))
        self.tokens(costs.input_tokens(model.token_rule, texts, chunk=chunk, prefix_bytes=prompt))
