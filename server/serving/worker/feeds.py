"""What feeds a worker's model thread: the jobs it receives, tokenized ahead of the model.

:class:`ThreadFeed` receives and tokenizes on a thread of its own and lets short jobs
overtake; :func:`tf_data_feed` does the same through ``tf.data`` (``--feed tfdata``), without
overtaking.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from bertserve.client import protocol as p


class Worker(Protocol):
    """What a feed needs of the worker it feeds."""

    stop: threading.Event

    def jobs(self) -> Iterator[Any]: ...


_SHORT_WINDOW_S = 5.0
"""How long after a short job came a worker still cuts long jobs' model runs for the next one."""


class ThreadFeed:
    """``worker.jobs()`` received and tokenized on a thread of its own, ahead of the model
    (tokenizing releases the GIL). Iterating yields the jobs in arrival order;
    :meth:`take_short` takes a short job (not bulk, one model run at most) out of turn, for
    the model thread to run between two model runs of a long one."""

    def __init__(self, worker: Worker, *, prefetch_size: int, run_rows: int) -> None:
        self.worker = worker
        self.room = prefetch_size + 1  # the credits, and one short job beyond them
        self.run_rows = run_rows  # one model run: a job of at most this many inputs may be short
        self.items: deque[tuple[tuple[Any, ...], bool]] = deque()  # (job, short)
        self.changed = threading.Condition()
        self.finished = False
        self.error: BaseException | None = None
        self.last_short = -math.inf  # when the last short job came (time.monotonic)
        self.thread = threading.Thread(target=self._feed, name="feed", daemon=True)

    def _feed(self) -> None:
        rows = self.run_rows
        try:
            for job in self.worker.jobs():
                short = not p.loads(job[1]).get("bulk") and len(job[4]) <= rows
                with self.changed:
                    while len(self.items) >= self.room and not self.worker.stop.is_set():
                        self.changed.wait(0.2)
                    self.items.append((job, short))
                    if short:
                        self.last_short = time.monotonic()
                    self.changed.notify_all()
        except BaseException as exc:  # handed to the model's thread, which raises it
            self.error = exc
        finally:
            with self.changed:
                self.finished = True
                self.changed.notify_all()

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        self.thread.start()
        try:
            while True:
                with self.changed:
                    while not self.items and not self.finished:
                        self.changed.wait()
                    if not self.items:
                        if self.error is not None:
                            raise self.error
                        return
                    job, _ = self.items.popleft()
                    self.changed.notify_all()
                yield job
        finally:
            self.worker.stop.set()
            self.thread.join(5)

    @property
    def empty(self) -> bool:
        """No job is waiting."""
        with self.changed:
            return not self.items

    def short_recently(self) -> bool:
        """A short job came in the last few seconds: another may come during a long job."""
        return time.monotonic() - self.last_short < _SHORT_WINDOW_S

    def take_short(self) -> tuple[Any, ...] | None:
        """The oldest short job waiting, taken out of the queue; ``None`` if there is none."""
        with self.changed:
            for entry in self.items:
                if entry[1]:
                    self.items.remove(entry)
                    self.changed.notify_all()
                    return entry[0]
        return None


def as_numpy(value: Any) -> Any:
    """A tf.data element as numpy (bytes for scalar strings); plain values pass through."""
    return value.numpy() if hasattr(value, "numpy") else value


def tf_data_feed(worker: Worker, prefetch_size: int) -> Iterable[Any]:
    """``worker.jobs()`` through ``tf.data.Dataset.from_generator(...).prefetch``, so the next
    job is received and tokenized on tf.data's threads while the current one runs."""
    import tensorflow as tf

    return tf.data.Dataset.from_generator(
        worker.jobs,
        output_signature=(
            tf.TensorSpec((), tf.string),
            tf.TensorSpec((), tf.string),
            tf.TensorSpec((None, None), tf.int32),
            tf.TensorSpec((None, None), tf.int32),
            tf.TensorSpec((None,), tf.int32),
        ),
    ).prefetch(prefetch_size)
