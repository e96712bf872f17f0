"""The model as the serving roles see it: a typed ``Protocol``, and a small numpy model behind it.

Workers only ever call these five methods, so anything that implements them can be served:
the TensorFlow :class:`~bertserve.server.model.encoder.Encoder` (the default), or
:class:`HashingModel`, a deterministic numpy model that needs no TensorFlow and no weights.
The plumbing (scheduler, registry, worker loop, sink) is tested against ``HashingModel`` in
milliseconds; ``bertserve start --model-class MODULE:NAME`` serves any implementation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..config.model import ModelConfig
from .tokenization import TokenizedBatch


@runtime_checkable
class Model(Protocol):
    """What a worker needs from a model."""

    def describe(self) -> dict[str, Any]:
        """JSON-able facts for clients: at least ``output_dim``, ``output_dtype``, ``token_level``."""
        ...

    def tokenize(
        self,
        texts: Sequence[Any],
        *,
        is_tokenized: bool = False,
        keep_tokens: bool = False,
        chunk: bool = False,
        truncation_direction: str = "right",
    ) -> TokenizedBatch:
        """Token ids for ``texts``; raises ``ValueError`` naming a text it cannot take, or an
        option it does not take: ``chunk`` (long inputs in windows, asked only of a model whose
        ``describe()`` says it chunks) or ``truncation_direction="left"`` (cut an over-long
        input's start, not its end)."""
        ...

    def run(self, batch: TokenizedBatch) -> np.ndarray:
        """One output row per input of ``batch``, in its order."""
        ...

    def token_slots(self, batch: TokenizedBatch) -> int:
        """Token positions (padding included) that running ``batch`` computes."""
        ...

    def plan(self, batch: TokenizedBatch) -> list[np.ndarray]:
        """The row indexes of each model run that :meth:`run` would make for ``batch``, so a
        worker can run them one at a time (and let small jobs in between)."""
        ...


class HashingModel:
    """A deterministic stand-in for BERT: each word hashes to a fixed random vector, and a
    text's vector is the normalized mean of its words' vectors.

    The same text always gives the same vector, in any batch and in any process, so tests can
    check that every row reaches the right request. Its input rules are the server's: at most
    ``max_seq_len`` tokens, ``[CLS]``/``[SEP]`` counted.
    """

    def __init__(self, config: ModelConfig | None = None, *, dim: int = 16) -> None:
        self.dim = dim
        max_seq_len = config.max_seq_len if config is not None else None
        self.max_seq_len = max_seq_len if isinstance(max_seq_len, int) else 128

    def describe(self) -> dict[str, Any]:
        return {
            "model_class": f"{type(self).__module__}:{type(self).__qualname__}",
            "output_dim": self.dim,
            "output_dtype": "float32",
            "token_level": False,
            "max_seq_len": self.max_seq_len,
        }

    def tokenize(
        self,
        texts: Sequence[Any],
        *,
        is_tokenized: bool = False,
        keep_tokens: bool = False,
        chunk: bool = False,
        truncation_direction: str = "right",
    ) -> TokenizedBatch:
        if chunk:
            raise ValueError("this model encodes no long input in windows: long_inputs=chunk is not available")
        if truncation_direction not in ("right", "left"):
            raise ValueError(f"truncation_direction must be 'right' or 'left', not {truncation_direction!r}")
        words = [list(t) if is_tokenized else str(t).split() for t in texts]
        limit = self.max_seq_len - 2
        truncated = np.asarray([len(w) > limit for w in words], bool)
        words = [w[-limit:] if truncation_direction == "left" and len(w) > limit else w[:limit] for w in words]
        lengths = np.asarray([len(w) + 2 for w in words], np.int32)
        width = int(lengths.max()) if len(words) else 0
        ids = np.zeros((len(words), width), np.int32)
        for row, row_words in enumerate(words):
            hashed = [self._word_id(word) for word in row_words]
            ids[row, : len(hashed) + 2] = [1, *hashed, 2]
        tokens = [["[CLS]", *w, "[SEP]"] for w in words] if keep_tokens else None
        return TokenizedBatch(ids, np.zeros_like(ids), lengths, truncated, tokens)

    def run(self, batch: TokenizedBatch) -> np.ndarray:
        out = np.zeros((len(batch.lengths), self.dim), np.float32)
        for row, (ids, length) in enumerate(zip(batch.input_ids, batch.lengths, strict=True)):
            vectors = [self._vector(int(i)) for i in ids[1 : int(length) - 1]]
            mean = np.mean(vectors, axis=0) if vectors else np.zeros(self.dim, np.float32)
            out[row] = mean / max(float(np.linalg.norm(mean)), 1e-12)
        return out

    def token_slots(self, batch: TokenizedBatch) -> int:
        return int(batch.input_ids.size)

    def plan(self, batch: TokenizedBatch) -> list[np.ndarray]:
        return [np.arange(start, min(start + 64, len(batch))) for start in range(0, len(batch), 64)]

    @staticmethod
    def _word_id(word: str) -> int:
        return 3 + int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=4).digest(), "little") % 1_000_003

    def _vector(self, word_id: int) -> np.ndarray:
        return np.random.default_rng(word_id).standard_normal(self.dim).astype(np.float32)


def load_model_class(spec: str) -> type:
    """The class named by ``"package.module:Name"``."""
    import importlib

    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ValueError(f"model_class must be written MODULE:NAME, not {spec!r}")
    cls = getattr(importlib.import_module(module_name), name, None)
    if cls is None:
        raise ValueError(f"module {module_name!r} has no attribute {name!r}")
    return cls
