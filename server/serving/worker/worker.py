"""A worker: one process per device, running the model over mini-jobs.

Jobs come from the ventilator over a DEALER socket. A feeding thread (:class:`ThreadFeed`)
receives and tokenizes them ahead of the model, so the next job is ready while the current
one runs. A bulk job runs one model run at a time (as the model plans them), and between
two runs any small job that has arrived runs first: the ventilator may hand a worker that
holds only bulk work one small job beyond its credits, so a one-sentence request waits for
one model run, not for a whole mini-job. (``--feed tfdata`` feeds through
``tf.data.Dataset.from_generator`` and ``.prefetch`` instead, without overtaking; measured
on a 2-core CPU, a one-sentence fp32 run took 38 ms inside ``tf.data``'s iteration against
17 ms beside a plain thread.)
Results go to the sink as ``[RESULT, job id, header, raw vectors]``, the header saying of each
input its tokens and whether it was cut to the model's length (``truncated``: the worker
tokenizes, so it is the one that knows); a job that fails
becomes a ``JOB_ERROR`` for the requests it carried, and the worker carries on. Each
finished job returns its credit to the ventilator over a separate PUSH socket (a socket
belongs to one thread, and the generator runs on tf.data's threads), and a thread of its
own sends a heartbeat every second. Each process registers under an identity of its own
(``w<index>-<pid>``), so nothing a dead worker sent is taken for its successor's.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import platform
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import zmq
from bertserve.client import protocol as p

from ...config.server import HEARTBEAT_INTERVAL_MS, ServerConfig
from ...config.telemetry import Telemetry
from ...memory import prepare_worker_process, trim_heap
from ...model.hardware import resolve_dtype
from ...model.interface import Model
from ...model.opening import needs_tensorflow
from ...model.tokenization import TokenizedBatch, tokens_per_input
from ..protocol import wire
from ..protocol.wire import Addresses
from .devices import configure_device
from .feeds import ThreadFeed, as_numpy, tf_data_feed
from .outputs import job_result, task_results
from .traced import JobTimes, now_if_tracing

logger = logging.getLogger("bertserve.worker")


class Worker:
    """The loop of one worker process, around any :class:`~...model.interface.Model`, running
    model version ``version`` (None: a model directory, not a version of a repository)."""

    def __init__(
        self,
        config: ServerConfig,
        index: int,
        addresses: Addresses,
        model: Model,
        device: str = "",
        *,
        version: int | None = None,
    ) -> None:
        self.config = config
        self.version = version
        self.device = device
        self.index = index
        self.addresses = addresses
        self.model = model
        self.identity = f"w{index}-{os.getpid()}".encode()
        self.stop = threading.Event()
        self.context = zmq.Context()
        self.results = self.context.socket(zmq.PUSH)
        self.results.linger = 5000
        self.results.connect(addresses.sink)
        self.credits = self.context.socket(zmq.PUSH)
        self.credits.linger = 1000
        self.credits.connect(addresses.credits)
        self.parent = os.getppid()
        self._heartbeat = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self.feed: ThreadFeed | None = None  # set by run(): lets short jobs overtake long ones
        self.lending = False  # a long job is running, with short jobs overtaking it between its model runs
        self.slot_seconds: float | None = None  # a model run's seconds per token slot, smoothed
        described = model.describe()
        self.token_level = bool(described.get("token_level"))  # rows of unequal width: never sliced
        self.late = bool(described.get("late"))  # several tasks from one run, one RESULT each (.outputs)
        # Jobs held at once. A model whose runs read each input alone (a static model: pads=false)
        # runs a job in milliseconds, so a second one in hand costs a small request little, and
        # lets the feed tokenize it while the first runs: its bulk went 0.53x to 0.65x of in-process.
        self.holds = max(config.workers.prefetch_size, 2 if described.get("pads") is False else 1)
        self.sparse = described.get("task") == "sparse" and not self.late  # rows sent as [id, weight] pairs
        # sentence vectors whose Normalize module the graph leaves to the sink (graph.serving_graph)
        self.normalizes = bool(described.get("normalize")) and not self.token_level and not self.sparse

    def close(self) -> None:
        self.stop.set()
        if self._heartbeat.is_alive():
            self._heartbeat.join(2 * HEARTBEAT_INTERVAL_MS / 1000)
        self.results.close()
        self.credits.close()
        self.context.term()

    def _beat(self) -> None:
        """Tell the ventilator this process is alive, from a thread of its own (and socket:
        a socket belongs to one thread), so a long model run does not look like a hang."""
        socket = self.context.socket(zmq.PUSH)
        socket.linger = 0
        socket.sndhwm = 10
        socket.connect(self.addresses.credits)
        try:
            while not self.stop.wait(HEARTBEAT_INTERVAL_MS / 1000):
                with contextlib.suppress(zmq.Again):
                    socket.send_multipart([wire.HEARTBEAT, self.identity], zmq.NOBLOCK)
        finally:
            socket.close()

    # -- the feeding side (tf.data's threads, or the caller's) -----------------------------

    def jobs(self) -> Iterator[tuple[bytes, bytes, np.ndarray, np.ndarray, np.ndarray]]:
        """Receive jobs and tokenize them; yields ``(job_id, header, ids, segments, lengths)``."""
        socket = self.context.socket(zmq.DEALER)
        socket.linger = 0
        socket.identity = self.identity
        socket.connect(self.addresses.jobs)
        try:
            ready = {
                "worker": self.index,
                "pid": os.getpid(),
                "credits": self.holds,
                "model": self.model.describe(),
                "device": self.device,
                "hostname": platform.node(),
                "version": self.version,
                "model_name": self.config.serving.served_model_name,
            }
            socket.send_multipart([wire.READY, p.dumps(ready)])
            if not self._heartbeat.is_alive():
                self._heartbeat.start()
            while not self.stop.is_set():
                if not socket.poll(200):
                    if os.getppid() != self.parent:  # the server is gone: do not linger as an orphan
                        logger.warning("worker %d lost its server; exiting", self.index)
                        return
                    continue
                frames = socket.recv_multipart()
                try:
                    kind, rest = wire.split_message(frames, {wire.JOB: 3, wire.STOP: 0})
                except p.ProtocolError as exc:
                    logger.error("worker %d dropped a malformed message: %s", self.index, exc)
                    continue
                if kind == wire.STOP:
                    return
                yield self._tokenize(*rest)
        finally:
            socket.close()

    def _tokenize(self, job_id: bytes, raw_header: bytes, payload: bytes) -> tuple[bytes, bytes, Any, Any, Any]:
        empty = np.zeros((0, 0), np.int32)
        try:
            header = p.loads(raw_header)
            if not isinstance(header, dict) or not isinstance(header.get("parts"), list):
                raise p.ProtocolError("the job header has no parts")
        except p.ProtocolError as exc:  # the job's credit still returns, so the worker is not lost
            logger.error("worker %d got job %r with a malformed header: %s", self.index, job_id, exc)
            header = {"parts": [], "error": f"malformed job: {exc}"}
            return job_id, p.dumps(header), empty, empty, np.zeros(0, np.int32)
        if "expires_in_s" in header:  # on this machine's clock: the head's may not be this one's
            header["expires_at"] = time.monotonic() + float(header["expires_in_s"])
        tokenizing = now_if_tracing()  # the job's parts are read for traces once, by JobTimes
        try:
            texts = p.loads(payload, "payload")
            options: dict[str, Any] = {"chunk": True} if header.get("chunk") else {}  # only models that chunk are asked
            if header.get("truncation_direction", "right") != "right":  # and only models that cut on the left
                options["truncation_direction"] = header["truncation_direction"]
            if header.get("reads"):  # a late-interaction model's queries or rerank pairs
                options["reads"] = header["reads"]
            batch = self.model.tokenize(
                texts,
                is_tokenized=bool(header.get("is_tokenized")),
                keep_tokens=bool(header.get("show_tokens")),
                **options,
            )
            if "adapter" in header:  # the segment ids say a model with LoRA adapters which to run (.model.lora)
                batch.segment_ids = np.full_like(batch.segment_ids, self._adapter(header["adapter"]))
        except Exception as exc:  # reported to the requests in this job, not fatal to the worker
            header["error"] = f"tokenization failed: {exc}"
            return job_id, p.dumps(header), empty, empty, np.zeros(0, np.int32)
        header["truncated"] = batch.truncated.tolist()
        if tokenizing is not None:
            header["tokenized_ns"] = [tokenizing, time.time_ns()]
        if batch.owners is not None:
            header["owners"] = batch.owners.tolist()
        if batch.tokens is not None:
            header["tokens"] = tokens_per_input(batch)
        return job_id, p.dumps(header), batch.input_ids, batch.segment_ids, batch.lengths

    def _adapter(self, adapter: Any) -> int:
        """A job's adapter, checked against the model's: its place + 1."""
        adapters = getattr(self.model, "adapters", ())
        if isinstance(adapter, bool) or not isinstance(adapter, int) or not 1 <= adapter <= len(adapters):
            raise ValueError(f"adapter {adapter!r} is not one of this model's {len(adapters)}")
        return adapter

    # -- the main loop -------------------------------------------------------------------

    def run(self, feed: Iterable[tuple[Any, Any, Any, Any, Any]] | None = None) -> None:
        """Run every job ``feed`` yields (by default a :class:`ThreadFeed` of :meth:`jobs`)."""
        if feed is None:
            feed = ThreadFeed(self, prefetch_size=self.holds, run_rows=self.config.model.batch_size)
        self.feed = feed if isinstance(feed, ThreadFeed) else None
        for job_id_t, header_t, ids, segments, lengths in feed:
            self.process(as_numpy(job_id_t), as_numpy(header_t), as_numpy(ids), as_numpy(segments), as_numpy(lengths))

    def _run_model(self, batch: TokenizedBatch, expires_at: float) -> tuple[np.ndarray, int, float]:
        """The model's vectors for ``batch``, the token slots they took, and the seconds lent
        to short jobs. A long job (several model runs) runs two model runs at a time (side by
        side, :meth:`Encoder.run`), or, once a short job (one run at most) has come in the last
        few seconds, one at a time, with the short jobs that arrived meanwhile between two runs,
        each run cut to take about ``bulk_run_ms``, so a short job waits about that long. Once
        ``expires_at`` has passed (every request of the job is past it) the runs left are skipped."""
        feed = self.feed
        runs: deque[np.ndarray] = deque()
        long = len(batch) > self.config.model.batch_size  # a short job's runs (two side by side) go at once
        if feed is not None and long and not self.lending and not self.token_level:
            runs.extend(self.model.plan(batch))
        if feed is None or len(runs) < 2:
            return self._run(batch), self.model.token_slots(batch), 0.0
        out: np.ndarray | None = None
        slots, lent, ran = 0, 0.0, 0
        self.lending = True
        try:
            while runs:
                if ran:
                    while (short := feed.take_short()) is not None:
                        overtaking = time.perf_counter()
                        self.process(*(as_numpy(value) for value in short))
                        lent += time.perf_counter() - overtaking
                    if time.monotonic() >= expires_at:
                        raise Expired(ran, len(batch) - ran, slots, lent)
                index = runs.popleft()
                rows = self._run_rows(batch, index, feed)
                if rows < len(index):  # the rest of this run waits for the next turn
                    index, rest = index[:rows], index[rows:]
                    runs.appendleft(rest)
                elif runs and not feed.short_recently():  # no short job about: two runs side by side
                    index = np.concatenate([index, runs.popleft()])
                part = batch.take(index)
                vectors = self._run(part, timed=True)
                if out is None:
                    out = np.empty((len(batch), *vectors.shape[1:]), vectors.dtype)
                out[index] = vectors
                ran += len(index)
                slots += self.model.token_slots(part)
        finally:
            self.lending = False
        assert out is not None
        return out, slots, lent

    def _run(self, batch: TokenizedBatch, *, timed: bool = False) -> np.ndarray:
        """One call of the model; ``timed``, its seconds per token slot are noted (smoothed)
        for :meth:`_run_rows` (only runs of long jobs are: they are large enough to measure)."""
        started = time.perf_counter()
        vectors = np.ascontiguousarray(self.model.run(batch))
        slots = self.model.token_slots(batch) if timed else 0
        if slots:
            rate = (time.perf_counter() - started) / slots
            self.slot_seconds = rate if self.slot_seconds is None else 0.7 * self.slot_seconds + 0.3 * rate
        return vectors

    def _run_rows(self, batch: TokenizedBatch, index: np.ndarray, feed: ThreadFeed) -> int:
        """Rows of the planned run ``index`` to run now: all of them, or while short jobs are
        about, as many as take about ``bulk_run_ms``, and at least a quarter of ``batch_size``
        (smaller runs would spend more on each call than they save a short job)."""
        budget = self.config.batching.bulk_run_ms / 1000
        if not budget or self.slot_seconds is None or not feed.short_recently():
            return len(index)
        longest = max(1, int(batch.lengths[index].max()))
        fewest = max(1, self.config.model.batch_size // 4)
        return min(len(index), max(fewest, int(budget / (self.slot_seconds * longest))))

    def process(self, job_id: bytes, raw_header: bytes, ids: Any, segments: Any, lengths: Any) -> None:
        """Run one tokenized job; send its result (or its error) to the sink and its credit back."""
        header = p.loads(raw_header)
        started, times = time.perf_counter(), JobTimes(header)
        parts = header["parts"]
        lent = 0.0  # seconds spent on small jobs that overtook this one
        expires_at = float(header.get("expires_at", math.inf))
        ran, skipped = len(lengths), 0  # inputs (rows) the model ran, and left unrun past the deadline
        failure = None  # why the job failed, for its spans
        try:
            if "error" in header:
                raise ValueError(header["error"])
            if time.monotonic() >= expires_at:
                raise Expired(0, len(lengths), 0, 0.0)
            owners = np.asarray(header["owners"], np.int64) if "owners" in header else None
            batch = TokenizedBatch(ids, segments, lengths, np.asarray(header["truncated"], bool), owners=owners)
            run_start = time.time_ns()
            if self.late:  # one run, a result for each task the job's parts ask for
                results = list(task_results(self.model, batch, header, self.version))  # type: ignore[arg-type]
                slots = self.model.token_slots(batch)
            else:
                vectors, slots, lent = self._run_model(batch, expires_at)
                if len(vectors) != len(lengths):
                    raise RuntimeError(f"the model returned {len(vectors)} rows for {len(lengths)} inputs")
                results = [job_result(self.model, batch, header, vectors, self.version, self.normalizes, self.sparse)]
                ran = len(results[0][1])  # inputs (a chunked input's windows are one)
            times.ran(run_start)
            for out, vectors in results:
                self.results.send_multipart([wire.RESULT, job_id, p.dumps(out), vectors.data], copy=False)
            tokens = int(batch.lengths.sum())
        except Expired as expired:
            ran, skipped, slots, lent = expired.ran, expired.skipped, expired.slots, expired.lent
            logger.debug("worker %d skipped %d inputs of job %s: past their deadline", self.index, skipped, job_id)
            error = {"parts": parts, "error": "the request expired before it was computed", "kind": p.EXPIRED}
            failure = error["error"]
            self.results.send_multipart([wire.JOB_ERROR, job_id, p.dumps(error)])
            tokens = 0
        except Exception as exc:
            logger.exception("worker %d failed on job %s", self.index, job_id)
            error = {"parts": parts, "error": f"the worker failed on this request: {exc}", "kind": "worker"}
            failure = error["error"]
            self.results.send_multipart([wire.JOB_ERROR, job_id, p.dumps(error)])
            tokens = slots = 0
        elapsed = time.perf_counter() - started - lent
        logger.debug("worker %d ran job %s: %d inputs in %.3fs", self.index, job_id.decode(), len(lengths), elapsed)
        done = {
            "job": job_id.decode(),
            "worker": self.identity.decode(),
            "seconds": elapsed,
            "tokens": tokens,
            "slots": slots,
            "sentences": ran,
            "skipped": skipped,
        }
        self.credits.send_multipart([wire.DONE, p.dumps(done)])
        times.record(self, job_id, ids, slots, failure)
        if header.get("bulk") and (self.feed is None or self.feed.empty):
            trim_heap()  # a bulk burst is over: the big batches' activations go back to the system


class Expired(Exception):
    """Every request of a job is past its deadline: the model runs left are skipped."""

    def __init__(self, ran: int, skipped: int, slots: int, lent: float) -> None:
        super().__init__(f"{skipped} inputs skipped past their deadline")
        self.ran, self.skipped, self.slots, self.lent = ran, skipped, slots, lent


def load_model(config: ServerConfig, device: str) -> Model:
    """The model this server serves: ``config.serving.model_class`` if set, else the directory's (.model.opening)."""
    if config.serving.model_class:
        from ...model.interface import load_model_class

        model: Model = load_model_class(config.serving.model_class)(config.model)
        return model
    from ...model.opening import open_model

    return open_model(config.model.replace(device=device))


def run_worker(
    config: ServerConfig, index: int, addresses: Addresses, telemetry: Telemetry, version: int | None = None
) -> None:
    """Entry point of a worker process (started with the ``spawn`` method), running model
    version ``version`` of ``config``'s model."""
    bf16 = resolve_dtype(config.model.dtype, config.model.device)[0] == "bf16"
    prepare_worker_process(bf16=bf16)  # before TensorFlow loads: it reads its allocator's settings then
    from ...logs import child_telemetry

    child_telemetry(telemetry, "worker", config.serving.served_model_name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server process decides when we stop
    if config.workers.worker_nice:
        # The model takes every core it is given; the ventilator and sink need little CPU but
        # need it at once, or every request and reply waits behind a model run's time slice.
        os.nice(config.workers.worker_nice)
    try:
        tensorflow = not config.serving.model_class and needs_tensorflow(config.model)
        device = configure_device(config, index) if tensorflow else "cpu"
        model = load_model(config, device)
    except Exception as exc:
        logger.error("worker %d could not load the model: %s", index, exc)
        raise SystemExit(4) from None
    worker = Worker(config, index, addresses, model, device, version=version)
    try:
        logger.info("worker %d ready on %s (pid %d)", index, device, os.getpid())
        worker.run(tf_data_feed(worker, config.workers.prefetch_size) if config.workers.feed == "tfdata" else None)
    except KeyboardInterrupt:
        pass
    finally:
        worker.close()
