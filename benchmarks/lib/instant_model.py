"""A model that costs nothing, for measuring what the server's plumbing can route.

:class:`InstantModel` implements the worker's ``Model`` protocol like :class:`HashingModel`
(it is one), but tokenizing only counts words and running returns zero vectors of
all-MiniLM-L6-v2's width, so the bytes on the wire are a real model's and the compute is
none. The server imports it in its worker processes: put ``benchmarks/`` on ``PYTHONPATH``
and pass ``--model-class lib.instant_model:InstantModel``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from bertserve.server.model.interface import HashingModel
from bertserve.server.model.tokenization import TokenizedBatch


class InstantModel(HashingModel):
    def __init__(self, config: Any = None, **options: Any) -> None:
        super().__init__(config, dim=384)

    def tokenize(
        self, texts: Sequence[Any], *, is_tokenized: bool = False, keep_tokens: bool = False
    ) -> TokenizedBatch:
        limit = self.max_seq_len - 2
        words = np.asarray([len(t) if is_tokenized else t.count(" ") + 1 for t in texts], np.int32)
        ids = np.zeros((len(texts), 2), np.int32)
        return TokenizedBatch(ids, ids, np.minimum(words, limit) + 2, words > limit, None)

    def run(self, batch: TokenizedBatch) -> np.ndarray:
        return np.zeros((len(batch.lengths), self.dim), np.float32)
