"""The head's book of model versions: the versions refused (with why and when), the latest
swap's progress, and the tokenizer of the version served.

:class:`VersionsBook` is the one owner of these. The supervisor records what the start
refused and gives the first tokenizer; the version swap (:mod:`.swap`) records what it
refuses, its progress and the tokenizer of a version it serves; the ventilator's status
reads them through :class:`..head.models.VersionsView`, and the scheduler counts tokens
with :meth:`VersionsBook.count_tokens`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ... import metrics
from ...model.repository import Refusal
from .plan import SwapState

logger = logging.getLogger("bertserve.server")


class VersionsBook:
    """The model versions' side of the head (implements :class:`..head.models.VersionsView`)."""

    def __init__(self) -> None:
        self.repository = ""  # the base directory of model versions, once --model-dir is found to be one
        self.refused: list[dict[str, Any]] = []  # each version refused, with why and when; newest first
        self._swap: dict[str, Any] = {}  # the latest swap's progress, as the status shows it
        self._tokenizer: Any = None
        self.model = ""  # the served model's name, for the metrics
        self.source = ""  # a model synced from a store: its URL, which the logs name rather than the cache
        self._sync: dict[str, Any] = {}  # a model synced from a store: what its syncs did (ModelStore.status)

    # -- the version served --------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        """The tokenizer of the version served (``None`` for a model class)."""
        return self._tokenizer

    def serve_tokenizer(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def count_tokens(self, texts: list[Any], is_tokenized: bool, chunk: bool) -> Any:
        """Tokens per input, for cutting bulk requests (by the tokenizer of the version served)."""
        return self._tokenizer.count_tokens(texts, is_tokenized=is_tokenized, chunk=chunk)

    # -- the swap's progress -------------------------------------------------------------
    # ``state`` (a :class:`.plan.SwapState` value), the RELOAD answered, the versions from
    # and to, a message, the workers replaced, and when the swap started and finished.

    def swap_begin(self, state: SwapState, **fields: Any) -> None:
        """A new stage: what the status showed of the one before is dropped."""
        self._swap = {"state": state.value, **fields}

    def swap_update(self, state: SwapState | None = None, **fields: Any) -> None:
        """The same stage further on, or a look that changes nothing (what the status showed
        of the latest swap stays beside it)."""
        if state is not None:
            fields["state"] = state.value
        self._swap.update(fields)

    def swap_replaced(self) -> None:
        """One more old worker replaced."""
        self._swap["workers_replaced"] = self._swap.get("workers_replaced", 0) + 1

    # -- refusals ------------------------------------------------------------------------

    def record_refusals(self, refused: list[Refusal]) -> None:
        """Log, count and list each version refused; a version refused again for the same
        reason (or still being written) is not logged again."""
        listed = {entry["version"]: entry for entry in self.refused}
        for refusal in refused:
            number = refusal.version.number
            entry = listed.get(number)
            same = entry is not None and (entry["reason"] == refusal.reason or (entry["settling"] and refusal.settling))
            if not same:
                level = logging.WARNING if refusal.settling else logging.ERROR
                where = self.source or self.repository
                logger.log(level, "refused version %d of %s: %s", number, where, refusal.reason)
                metrics.VERSIONS_REFUSED.inc()
                entry = listed[number] = {"version": number}
            assert entry is not None
            entry.update(reason=refusal.reason, settling=refusal.settling, at=round(time.time(), 3))
        self.refused = sorted(listed.values(), key=lambda entry: -entry["version"])

    def forget_refusal(self, number: int | None) -> None:
        """Version ``number`` is served now (one refused while it was being written is whole)."""
        self.refused = [entry for entry in self.refused if entry["version"] != number]

    # -- syncs from a store ----------------------------------------------------------------

    def record_sync(self, status: dict[str, Any]) -> None:
        """What the syncs from the model's store did so far: failures since the last record
        are counted, and the last success's time is the gauge's."""
        failed = status["failures"] - self._sync.get("failures", 0)
        if failed > 0:
            metrics.MODEL_SYNC_FAILURES.labels(self.model).inc(failed)
        if status.get("last_success") is not None:
            metrics.MODEL_SYNC_LAST_SUCCESS.labels(self.model).set(status["last_success"])
        self._sync = dict(status)

    # -- interfaces.VersionsView ---------------------------------------------------------

    def version_status(self) -> dict[str, Any]:
        status = {"refused_versions": list(self.refused), "swap": dict(self._swap)}
        return {**status, "sync": dict(self._sync)} if self._sync else status
