"""Models that misbehave on purpose, for the fault tests (``bertserve start --model-class``).

The server imports them in its worker processes, so a test that serves one puts this
directory on ``PYTHONPATH`` (see :func:`pythonpath_env`)::

    start_server("--model-dir", tiny, "--model-class", "faulty_model:FaultyModel", env=pythonpath_env())

- :class:`FaultyModel` is :class:`HashingModel` (same text, same vector, in any batch),
  except that a job holding the word ``CRASHME`` kills its worker (exit code 17) and one
  holding ``HANGME`` never finishes, and one holding ``SLOWME`` takes a second.
- :class:`BrokenModel` cannot be constructed, so no worker can ever start.
- :class:`BreakableModel` can be constructed until the file named by ``$FAULTY_MODEL_BREAK_FILE``
  exists, so a test can let a server start and then make every restart of a worker fail.
- :class:`WideModel` is :class:`HashingModel` with 1024-wide vectors, for tests of memory.
- :class:`SlowStartModel` is :class:`FaultyModel` that takes seconds to load.
- :class:`PacedModel` is :class:`FaultyModel` whose every model run takes 50 ms, so work
  is in flight long enough for a test to act on it.
- :class:`CostlyModel` is :class:`FaultyModel` whose runs take a time in proportion to their
  rows, as a real model's on a CPU.
- :class:`RecordingModel` is :class:`PacedModel` that records when each run started and
  which texts it held, for tests of what ran after a deadline.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from bertserve.server.config.model import ModelConfig
from bertserve.server.model.interface import HashingModel
from bertserve.server.model.tokenization import TokenizedBatch

CRASH_WORD = "CRASHME"
HANG_WORD = "HANGME"
SLOW_WORD = "SLOWME"
CRASH_EXIT_CODE = 17
BREAK_FILE_ENV = "FAULTY_MODEL_BREAK_FILE"
RECORD_FILE_ENV = "RECORDING_MODEL_FILE"
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world"]

T = TypeVar("T")


def pythonpath_env(**extra: str) -> dict[str, str]:
    """Environment for ``start_server(env=...)`` that lets the server import this module."""
    here = str(Path(__file__).resolve().parent)
    existing = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": here if not existing else f"{here}{os.pathsep}{existing}", **extra}


def sentences(n: int, seed: int = 0) -> list[str]:
    """Distinct sentences of 2 to 20 words (under the 30 that ``--max-seq-len 32`` keeps)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 20)))) + f" s{i}" for i in range(n)]


def expected(texts: list[str], dim: int = 16) -> np.ndarray:
    """What a server of these models answers for ``texts`` (without CRASHME or HANGME)."""
    model = HashingModel(ModelConfig.of(model_dir="unused", max_seq_len=32), dim=dim)
    return model.run(model.tokenize(texts))


def wait_for(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """The first true value of ``condition()``, polled until ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s")


class FaultyModel(HashingModel):
    """:class:`HashingModel` that crashes on ``CRASHME``, hangs on ``HANGME`` and takes a
    second over ``SLOWME`` (so a test can keep a worker busy while requests gather).

    The token ids are hashes of the words, so :meth:`run` looks for the words' ids.
    """

    _CRASH_ID = HashingModel._word_id(CRASH_WORD)
    _HANG_ID = HashingModel._word_id(HANG_WORD)
    _SLOW_ID = HashingModel._word_id(SLOW_WORD)

    def run(self, batch: TokenizedBatch) -> np.ndarray:
        ids = np.asarray(batch.input_ids)
        if (ids == self._CRASH_ID).any():
            os._exit(CRASH_EXIT_CODE)  # no cleanup, no goodbye: as a segfault in a kernel would
        if (ids == self._HANG_ID).any():
            while True:  # as a deadlocked kernel would; the heartbeat thread keeps beating
                time.sleep(3600)
        if (ids == self._SLOW_ID).any():
            time.sleep(1.0)
        return super().run(batch)


class BrokenModel(HashingModel):
    """A model whose construction always fails."""

    def __init__(self, config: Any = None, **options: Any) -> None:
        raise RuntimeError("BrokenModel cannot be loaded (on purpose, for the tests)")


class BreakableModel(FaultyModel):
    """:class:`FaultyModel` whose construction fails once ``$FAULTY_MODEL_BREAK_FILE`` exists."""

    def __init__(self, config: Any = None, **options: Any) -> None:
        flag = os.environ.get(BREAK_FILE_ENV)
        if flag and os.path.exists(flag):
            raise RuntimeError(f"BreakableModel was broken on purpose ({flag} exists)")
        super().__init__(config, **options)


class WideModel(HashingModel):
    """:class:`HashingModel` with 1024-wide vectors (4 KiB a sentence), so replies are big
    enough that queuing them without bound would show in the server's memory."""

    def __init__(self, config: Any = None, **options: Any) -> None:
        super().__init__(config, dim=1024)
        self._vectors: dict[int, np.ndarray] = {}

    def _vector(self, word_id: int) -> np.ndarray:
        vector = self._vectors.get(word_id)
        if vector is None:
            vector = self._vectors[word_id] = super()._vector(word_id)
        return vector


class SlowStartModel(FaultyModel):
    """:class:`FaultyModel` that takes ``SLOW_START_S`` seconds to load, so a test can watch
    a server whose front ends are up before any worker is."""

    SLOW_START_S = 5.0

    def __init__(self, config: Any = None, **options: Any) -> None:
        time.sleep(self.SLOW_START_S)
        super().__init__(config, **options)


class PacedModel(FaultyModel):
    """:class:`FaultyModel` whose every model run takes ``RUN_S`` seconds, as a real model's
    would, so a request of many jobs is in flight long enough for a test to act meanwhile."""

    RUN_S = 0.05

    def run(self, batch: TokenizedBatch) -> np.ndarray:
        time.sleep(self.RUN_S)
        return super().run(batch)


class RecordingModel(PacedModel):
    """:class:`PacedModel` that writes one line per model run to the file named by
    ``$RECORDING_MODEL_FILE``: when the run started (``time.monotonic()``, one clock for every
    process of the machine) and the id of each row's first word. A test reads which of its
    texts ran, and when, from outside the server."""

    def run(self, batch: TokenizedBatch) -> np.ndarray:
        started = time.monotonic()
        firsts = [int(ids[1]) for ids, length in zip(batch.input_ids, batch.lengths, strict=True) if length > 2]
        with open(os.environ[RECORD_FILE_ENV], "a", encoding="utf-8") as record:
            record.write(json.dumps({"started": started, "firsts": firsts}) + "\n")
        return super().run(batch)


def word_id(word: str) -> int:
    """The id :class:`HashingModel` gives ``word``."""
    return HashingModel._word_id(word)


class CostlyModel(FaultyModel):
    """:class:`FaultyModel` whose runs cost ``ROW_S`` seconds a row, as a real model's do on a
    CPU: a batch of 256 takes seconds, so a stop finds a worker in the middle of one."""

    ROW_S = 0.01

    def run(self, batch: TokenizedBatch) -> np.ndarray:
        time.sleep(self.ROW_S * len(batch.input_ids))
        return super().run(batch)
