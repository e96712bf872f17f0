"""What runs next, for whom, and what is refused: the ventilator's policy, without sockets.

- **Admission.** Queued sentences are bounded in total (``max_queued_sentences``) and per
  client (``max_client_queued_sentences``). A request over a bound is refused whole with
  :class:`Busy` (:meth:`Scheduler.check_room`); one larger than a client may ever queue is a
  :class:`TooLarge`. So is a bulk request that would finish, or make an earlier one finish,
  past ``bulk_slowdown`` times its idle-server time (:meth:`Scheduler.check_slowdown`), at
  the speed measured and corrected by how late earlier bulk requests came (:mod:`.throughput`).
  The head asks both once, as it admits a request, then queues it (:meth:`Scheduler.queue`),
  so nothing is ever half-queued.
- **Cutting.** A request of ``max_batch_size`` sentences or more is *bulk*: sorted by token
  count, so each job pads little, and cut into jobs of at most ``max_batch_size`` sentences
  and ``max_batch_tokens`` padded tokens. Smaller requests are *small*. A bulk request is cut
  when its first turn comes, not when it arrives: counting its tokens is the costliest step
  of admission, and the requests (and ``busy`` refusals) behind it need not wait for it. A
  model that pads nothing (``pads`` false: its runs read each input's own tokens, as a static
  model's do) gains nothing from the sorting: its bulk requests are cut in order, into jobs of
  ``max_batch_size`` sentences, without counting a token (its worker tokenizes them anyway).
- **Merging.** Small requests from different clients share one job, up to one model run
  (``batch_size``, at most ``max_batch_size``; while other work waits, about ``bulk_run_ms``
  of it) of one input kind, since every request in it is answered when the job is; when they
  do not all fit, each client gets an equal share no larger than the lightest client's
  demand. Batching is continuous: a worker that holds nothing takes what has gathered at
  once, so an idle server adds no wait; only a job for a busy worker's prefetch slot waits,
  at most ``max_latency_ms``, for company (and not at all when bulk work is queued).
- **Versions.** A request is pinned at admission to the model version then served; pieces
  of different versions never share a job (two versions are served side by side only while
  a swap is under way, see :mod:`..versions.swap`). :meth:`Scheduler.put_back` returns a job that no
  worker of its version could take yet.
- **Two lanes.** Each client's queue has a small lane and a bulk lane, each in arrival
  order, except that its *short* requests (an eighth of a model run at most) go before its
  longer small ones. A client's small requests do not wait for its own bulk work, nor its
  few sentences for its own hundred: they go in the next merged job. Small jobs go first,
  but bulk work, while it waits, keeps at least a quarter of the workers' time however much
  small traffic arrives (:mod:`.throughput`).
- **Overtaking.** When every worker is busy, small requests need not wait for a free
  credit: :meth:`Scheduler.next_small_job` merges them out of turn for a worker that holds
  only long jobs, which runs them between two model runs of its long job.
- **Fairness.** In each lane every client with queued work has a turn, round-robin by
  identity: a bulk turn is one bulk job of that client; a small turn is a merged job with a
  share for every client waiting with small requests. A client that becomes active in a
  lane joins at its back. So one client's flood delays another's request by at most about
  one job per active client.

Everything takes the time as an argument, so tests drive it with a fake clock. The scheduler
is given the values it uses (:class:`...config.batching.Batching`,
:class:`...config.limits.Limits`), not the server's config.

Over 400 lines: one queue's state, kept in step. Admission, cutting, merging, turns, retries
and forgetting all move the same counters (inputs queued, small rows, bulk requests) and the
same turn lists; what has no share in them is apart already (a client's lanes and a merged
job's shares in :mod:`.lanes`, jobs and cutting by length in :mod:`.jobs`, the measured
rates in :mod:`.throughput`).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...config.batching import Batching
from ...config.limits import Limits
from .jobs import Busy, Job, Piece, TooLarge, cut_by_length
from .lanes import BulkRequest, ClientQueue, merge_shares
from .throughput import LEAST_BOUND_S, QueuedBulk, Throughput, bulk_seconds, late_bulk


@dataclass(frozen=True)
class Slot:
    """What :meth:`Scheduler.check_slowdown` found for a request: when it should be done
    (a bulk request's bound; never for a small one), and the seconds it is projected to take,
    if projected (a bulk request, once the workers' speed is measured)."""

    due: float = float("inf")
    seconds: float | None = None


CountTokens = Callable[[list[Any], bool, bool], np.ndarray]
"""``(texts, is_tokenized, chunk) -> tokens per input`` (in all its windows with ``chunk``)."""


class Scheduler:
    """Per-client queues, admission, cutting, merging and turns. No sockets, no clocks."""

    def __init__(
        self,
        batching: Batching,
        limits: Limits,
        count_tokens: CountTokens | None = None,
        job_prefix: str = "",
        *,
        pads: bool = True,
    ) -> None:
        self.batching = batching
        self.limits = limits
        self.prefix = job_prefix  # the models' queues each have their own, so job ids never meet
        self.count_tokens = count_tokens
        self.pads = pads  # the model's runs pad inputs to the longest: bulk jobs are sorted by length
        self.clients: dict[bytes, ClientQueue] = {}
        self.small_turns: deque[bytes] = deque()  # clients with small requests queued, next turn first
        self.bulk_turns: deque[bytes] = deque()  # clients with bulk requests queued, next turn first
        self.retries: deque[Job] = deque()  # jobs handed back by a lost worker: they go first
        self.queued = 0  # sentences waiting, retries included
        self.small_count = 0  # small pieces waiting
        self.small_rows = 0  # their sentences
        self.bulk_count = 0  # bulk requests with work waiting
        self.busy_rejections = 0
        self.throughput = Throughput()  # what the workers get through: told by the ventilator
        self._job_ids = itertools.count()

    # -- admission ---------------------------------------------------------------------

    def queue(
        self,
        key: str,
        client: bytes,
        texts: list[Any],
        *,
        is_tokenized: bool,
        show_tokens: bool,
        now: float,
        chunk: bool = False,
        version: int | None = None,
        deadline: float = float("inf"),
        truncation: str = "right",
        trace: str | None = None,
        adapter: int = 0,
        task: str = "embed",
        reads: str = "",
        slot: Slot | None = None,
    ) -> None:
        """Queue a checked, non-empty request admitted ``now``, to run on model ``version``
        before ``deadline``. Nothing is checked here: the head admitted it, within the room
        :meth:`check_room` found and in the ``slot`` :meth:`check_slowdown` gave it."""
        count = len(texts)
        slot = slot or Slot()
        if slot.seconds is not None:
            self.throughput.expect(key, slot.seconds, now)
        piece = Piece(
            key,
            client,
            np.arange(count),
            texts,
            is_tokenized,
            show_tokens,
            now,
            chunk,
            version,
            deadline,
            truncation,
            trace,
            adapter,
            task,
            reads,
        )
        queue = self.clients.get(client)
        if queue is None:
            queue = self.clients[client] = ClientQueue()
        if count < self.batching.max_batch_size:
            if not queue.small:
                self.small_turns.append(client)
            queue.add_small(piece, count <= self._short_rows)
            queue.small_rows += count
            self.small_count += 1
            self.small_rows += count
        else:
            if not queue.bulk:
                self.bulk_turns.append(client)
            queue.bulk.append(BulkRequest(piece, due=slot.due))
            self.bulk_count += 1
        queue.sentences += count
        self.queued += count

    def check_room(self, client: bytes, count: int) -> None:
        """Raise :class:`Busy` (or :class:`TooLarge`) unless ``count`` more inputs of ``client``
        may be queued now. Cheap, so a flood is refused before its texts are looked at."""
        per_client = self.limits.client_queued_sentences
        if count > per_client:
            raise TooLarge(f"the request has {count} inputs; a client may queue at most {per_client}")
        queue = self.clients.get(client)
        mine = queue.sentences if queue is not None else 0
        if mine + count > per_client:
            self.busy_rejections += 1
            raise Busy(
                f"the server is busy: this client already has {mine} inputs queued and may queue at most "
                f"{per_client}; retry when some are answered"
            )
        if self.queued + count > self.limits.queued_sentences:
            self.busy_rejections += 1
            raise Busy(
                f"the server is busy: {self.queued} inputs are queued, at most {self.limits.queued_sentences} "
                "may be; retry later"
            )

    def check_slowdown(self, client: bytes, count: int, now: float, deadline: float = float("inf")) -> Slot:
        """Raise :class:`Busy` for a bulk request that, taken now, would finish (or make a
        bulk request taken before it finish) later than ``bulk_slowdown`` times its time on an
        idle server, or after its own deadline; else return its :class:`Slot`: when it should
        be done, and how long it is projected to take (which :meth:`queue` notes, for the lag).

        Finish times are projected from the workers' measured speed, the small traffic's share
        and the bulk work shared with (:mod:`.throughput`). A client's earlier bulk requests run
        first on an idle server too, so they count in its time there (pipelined chunks of one
        large encode are not refused for each other); no bound is tighter than a second. Until
        the speed is measured, and for small requests (which overtake), nothing is refused."""
        slowdown = self.batching.bulk_slowdown
        capacity = self.throughput.capacity()
        rate = self.throughput.bulk_rate(now)
        if not slowdown or count < self.batching.max_batch_size or capacity is None or rate is None:
            return Slot()
        queue = self.clients.get(client)
        own = sum(item.rows for item in queue.bulk) if queue is not None else 0
        idle_s = (own + count) / capacity  # an idle server runs its client's earlier bulk requests first too
        bound = now + max(slowdown * idle_s, LEAST_BOUND_S)
        due = min(bound, deadline)
        lanes = {
            other: [QueuedBulk(other, item.rows, item.due) for item in queue.bulk]
            for other, queue in self.clients.items()
            if queue.bulk
        }
        new = QueuedBulk(client, count, due)
        extra = sum(job.size for job in self.retries) + self.throughput.held  # runs before any of it
        late = late_bulk(lanes, new, extra=extra, rate=rate, now=now)
        if late is None:
            return Slot(due, bulk_seconds(lanes, new, extra=extra, rate=rate))
        self.busy_rejections += 1
        if late is not new:
            why = "would make a bulk request taken before it late"
        elif due < bound:
            why = "could not finish before its deadline"
        else:
            why = (
                f"would take more than --bulk-slowdown {slowdown:g} times the {idle_s:.1f} s it takes an idle server"
                + (f" (after {own} inputs of this client's bulk work queued before it)" if own else "")
            )
        raise Busy(
            f"the server is busy: this request of {count} inputs, sharing the workers with the bulk work queued "
            f"(about {rate:.0f} inputs/s left for it), {why}; retry later"
        )

    def _cut(self, request: Piece) -> deque[Job]:
        """``request``'s jobs: its rows sorted by token count, cut into jobs of at most
        max_batch_size rows and max_batch_tokens padded tokens (rows times the longest)."""
        texts = request.texts
        return deque(
            self._job([replace(request, rows=chunk, texts=[texts[i] for i in chunk])], True)
            for chunk in self._chunks(texts, request.is_tokenized, request.chunk)
        )

    def _chunks(self, texts: list[Any], is_tokenized: bool, chunk: bool = False) -> list[np.ndarray]:
        if not self.pads:  # nothing to save by sorting, and each input's tokens are its worker's to count
            size = self.batching.max_batch_size
            return [np.arange(start, min(start + size, len(texts))) for start in range(0, len(texts), size)]
        lengths = self._lengths(texts, is_tokenized, chunk)
        return cut_by_length(lengths, self.batching.max_batch_size, self.batching.max_batch_tokens)

    def _lengths(self, texts: list[Any], is_tokenized: bool, chunk: bool = False) -> np.ndarray:
        if self.count_tokens is not None:
            try:
                return np.asarray(self.count_tokens(texts, is_tokenized, chunk))
            except Exception:  # the worker will report what is wrong with these texts
                pass
        return np.asarray([len(t) if isinstance(t, str) else sum(map(len, t)) for t in texts])

    # -- dispatch ----------------------------------------------------------------------

    @property
    def empty(self) -> bool:  # nothing queued
        return not self.clients and not self.retries

    def next_job(self, now: float, *, idle: bool = False, free_at: float | None = None) -> Job | None:
        """The job to run next, or ``None`` when nothing should run yet.

        Small jobs go first, unless bulk work waits and has had less than its least share
        of the workers' time (:data:`.throughput.BULK_SHARE`). ``idle`` says the worker it goes to
        holds no job: small requests then go at once, as many as have gathered (continuous
        batching). A job for a busy worker's prefetch slot could not start before that worker is
        free anyway, so it waits for company: until ``free_at``, when the worker should be about
        to finish (its job in hand and tokenized as the last one ends), or where that is not
        known, up to ``max_latency_ms``.
        """
        if self.retries:
            job = self.retries.popleft()
            self.queued -= job.size
            return job
        if self.bulk_turns and (not self.small_turns or self.throughput.bulk_due(now)):
            return self._take_bulk(self.bulk_turns[0])
        if not self.small_turns or not (idle or self._small_due(now, free_at)):
            return None  # nothing waits, or small requests wait for company
        return self._take_small(self.small_turns[0])

    def next_small_job(self, rows: int) -> Job | None:
        """Small requests merged out of turn into a job of at most ``rows`` sentences (one
        model run, so the bulk job it interrupts keeps at least half of its worker), for a
        worker that holds only bulk work; ``None`` if no small request waits."""
        return self._take_small(self.small_turns[0], rows) if self.small_turns else None

    def wake_in(self, now: float) -> float | None:
        """Seconds until a waiting small request is due (so the caller can sleep until then),
        or ``None`` if no small request is waiting for company."""
        if not self.small_turns:
            return None
        oldest = min(self.clients[c].oldest_small() for c in self.small_turns)
        return max(0.0, oldest + self.batching.max_latency_ms / 1000 - now)

    def _small_due(self, now: float, free_at: float | None = None) -> bool:
        if self.bulk_count or self.retries or not self.batching.merge_requests or self.small_rows >= self._merge_room:
            return True
        if free_at is not None:
            return now >= free_at
        wait = self.wake_in(now)
        return wait is not None and wait <= 0

    @property
    def _merge_room(self) -> int:
        """Rows of a merged job: one model run; while other work waits, what runs in about
        ``bulk_run_ms`` (at least a quarter run), so a few sentences wait only for short jobs."""
        run = self.batching.model_run
        rate, budget = self.throughput.per_worker, self.batching.bulk_run_ms / 1000
        others = self.bulk_count or len(self.small_turns) > 1
        return min(run, max(run // 4, int(rate * budget))) if rate and budget and others else run

    @property
    def _short_rows(self) -> int:
        """The most rows of a *short* request: an eighth of a model run. A client's short
        requests go before its longer small ones, so a few sentences never wait for its own 90."""
        return max(1, self.batching.model_run // 8)

    def _take_bulk(self, client: bytes) -> Job:
        queue = self.clients[client]
        bulk = queue.bulk[0]
        if bulk.jobs is None:
            bulk.jobs = self._cut(bulk.request)
        job = bulk.jobs.popleft()
        if not bulk.jobs:
            queue.bulk.popleft()
            self.bulk_count -= 1
        self._served(client, job.size, self.bulk_turns, bool(queue.bulk))
        return job

    def _take_small(self, first_client: bytes, room: int | None = None) -> Job:
        """Merge waiting small requests (of one input kind) into a job of at most ``room`` rows
        (default and most: one model run, within max_batch_size), shared out among the
        clients waiting as :func:`.lanes.merge_shares` says: its requests are answered when
        the job is."""
        room = min(room or self._merge_room, self._merge_room)
        first = self.clients[first_client].small[0]
        kind = first.kind
        if not self.batching.merge_requests:
            return self._take_pieces([(first_client, len(first.rows))], kind, room)
        waiting = [c for c in self.small_turns if self.clients[c].small[0].kind == kind]  # the first is first_client
        heads = {c: len(self.clients[c].small[0].rows) for c in waiting}
        demands = {c: self.clients[c].small_rows for c in waiting}
        shares = merge_shares(heads, demands, room=room, queued=self.small_rows, short=self._short_rows)
        return self._take_pieces(shares, kind, room)

    def _take_pieces(
        self, shares: list[tuple[bytes, int]], kind: tuple[bool, bool, int | None, str, int, str], room: int
    ) -> Job:
        """A job of up to ``share`` rows of small requests from each client, in order, and of
        at most ``room`` rows in all."""
        pieces: list[Piece] = []
        for client, share in shares:
            queue = self.clients[client]
            items = queue.small
            want, taken = min(share, room), 0
            while want and items and (piece := items[0]).kind == kind:
                if len(piece.rows) <= want:
                    queue.pop_small()
                    self.small_count -= 1
                    part = piece
                else:  # split it: the rest stays at the head of this client's queue
                    part = replace(piece, rows=piece.rows[:want], texts=piece.texts[:want])
                    piece.rows, piece.texts = piece.rows[want:], piece.texts[want:]
                pieces.append(part)
                want -= len(part.rows)
                taken += len(part.rows)
                if not self.batching.merge_requests:
                    break
            room -= taken
            self.small_rows -= taken
            queue.small_rows -= taken
            self._served(client, taken, self.small_turns, bool(items))
            if not room:
                break
        return self._job(pieces, False)

    def _served(self, client: bytes, sentences: int, turns: deque[bytes], more: bool) -> None:
        """Account for ``sentences`` taken from ``client``'s lane whose turns are ``turns``:
        it goes to the back of them if ``more`` waits in that lane, else leaves them."""
        queue = self.clients[client]
        queue.sentences -= sentences
        self.queued -= sentences
        turns.remove(client)
        if more:
            turns.append(client)
        if queue.empty:
            del self.clients[client]

    def _job(self, pieces: list[Piece], bulk: bool) -> Job:
        return Job(f"{self.prefix}{next(self._job_ids)}", pieces, bulk)

    # -- failures ----------------------------------------------------------------------

    def retry(self, job: Job) -> None:
        """Run ``job`` again, ahead of everything else. A merged job is split into one job per
        request, so if one request is what kills workers, the others are not blamed again."""
        parts = (
            [job]
            if len(job.pieces) == 1
            else [Job(job.job_id + f".{i}", [piece], job.bulk, job.failures) for i, piece in enumerate(job.pieces)]
        )
        for part in reversed(parts):
            self.retries.appendleft(part)
            self.queued += part.size

    def put_back(self, job: Job) -> None:  # taken but not sent (no worker of its version was free)
        self.retries.appendleft(job)  # it goes first next time
        self.queued += job.size

    def versions(self) -> set[int | None]:
        """The model versions that queued work is pinned to."""
        found = {job.version for job in self.retries}
        for queue in self.clients.values():
            found.update(piece.version for piece in queue.small)
            found.update(bulk.request.version for bulk in queue.bulk)
        return found

    def remove(self, keys: set[str]) -> None:
        """Forget the queued work of the requests ``keys`` (they were answered with an error)."""
        for client, queue in list(self.clients.items()):
            gone_small = queue.drop_small(keys)
            gone_bulk = [item for item in queue.bulk if item.request.key in keys]
            small_rows = sum(len(piece.rows) for piece in gone_small)
            rows = small_rows + sum(item.rows for item in gone_bulk)
            if gone_small and not queue.small:
                self.small_turns.remove(client)
            if gone_bulk:
                queue.bulk = deque(item for item in queue.bulk if item.request.key not in keys)
                if not queue.bulk:
                    self.bulk_turns.remove(client)
            self.small_count -= len(gone_small)
            self.bulk_count -= len(gone_bulk)
            self.small_rows -= small_rows
            queue.small_rows -= small_rows
            queue.sentences -= rows
            self.queued -= rows
            if queue.empty:
                del self.clients[client]
        for job in [job for job in self.retries if set(job.keys) & keys]:
            self.retries.remove(job)
            self.queued -= job.size

    def drain_keys(self) -> set[str]:
        """Empty every queue; returns the keys of the requests that were waiting."""
        keys = {job_key for job in self.retries for job_key in job.keys}
        for queue in self.clients.values():
            keys.update(piece.key for piece in queue.small)
            keys.update(bulk.request.key for bulk in queue.bulk)
        for emptied in (self.clients, self.small_turns, self.bulk_turns, self.retries):
            emptied.clear()
        self.queued = self.small_count = self.small_rows = self.bulk_count = 0
        return keys

    def stats(self) -> dict[str, Any]:
        return {
            "queued_sentences": self.queued,
            "queued_small_requests": self.small_count,
            "queued_small_sentences": self.small_rows,
            "queued_bulk_requests": self.bulk_count,
            "queued_retries": len(self.retries),
            "active_clients": len(self.clients),
            "busy_rejections": self.busy_rejections,
        }
