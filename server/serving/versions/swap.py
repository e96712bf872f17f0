"""Model versions while serving: looking for a new version, and swapping the workers to it.

With ``--model-dir`` a repository of numbered versions (:mod:`...model.repository`), the
server looks for a newer whole version every ``--poll-interval-s`` seconds and when a client
sends RELOAD (``bertserve reload``). Hashing model files takes a while, so the look runs on a
thread of its own while the ventilator keeps serving. A model synced from object storage
(``model_url``) is served from its local cache: each look first syncs the version wanted from
the store (:meth:`...model.store.ModelStore.pull`), and what the syncs did goes to the book.

A version found is first made ready to load: its graph and LiteRT model, when not cached
yet, are built in a child process of their own (:mod:`...model.prepare`, status state
``preparing``), so a build's transient memory never stays in a worker. A version whose graph
cannot be built is refused there, before any worker is touched. Then the swap is rolling,
one worker at a time, and never holds more than one worker beyond ``--num-worker``:

1. a worker of the new version starts in an extra slot, beside the old ones;
2. once it is ready, new requests are pinned to the new version (requests already admitted
   keep the old one: every mini-job of a request runs on the version it was admitted under);
3. one old worker drains (it gets nothing new and finishes what it holds), is stopped and
   exits; then the next new worker starts, and so on. The last old worker stays until no
   request pinned to its version is queued, so nothing admitted before the flip is failed.

A new worker that cannot load its version (it exits before it is ready, or takes longer
than :data:`.plan.LOAD_TIMEOUT_S`) rolls the swap back the same way: the old version is
served again, its workers are started again, and new-version workers that were ready finish
what was pinned to them and leave. The version is refused from then on, until its files
change. A head that takes remote workers (``--worker-port``) does not swap: their hosts hold
their own copies of the model files.

Each turn :mod:`.plan` says what to do next from a snapshot of the workers; this module
carries it out, through the ventilator (:class:`.interfaces.WorkerPool`) and the supervisor
(:class:`.interfaces.WorkerProcesses`), and writes the progress and the refusals in the
:class:`.book.VersionsBook`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ModelError
from ...model.repository import Checker, Refusal, Version
from ...model.store import ModelStore
from . import plan
from .plan import Death, Release, Roll, Seen, Step, SwapState

if TYPE_CHECKING:
    from ...config.server import ServerConfig
    from ...model.prepare import Preparation
    from .book import VersionsBook
    from .interfaces import WorkerPool, WorkerProcesses

logger = logging.getLogger("bertserve.server")


def store_of(config: ServerConfig) -> ModelStore:
    """The store a model served from its local cache is synced from (``model_url``)."""
    assert config.model.model_url is not None
    return ModelStore(
        config.model.model_url,
        config.serving.model_cache,
        keep_versions=config.serving.keep_versions,
        max_bytes_per_s=config.serving.sync_max_bytes_per_s,
    )


@dataclass
class _Found:
    """What a look at the repository found: a version to swap to (if any) and its tokenizer,
    the versions refused on the way, and why nothing is to be done."""

    release: Release | None
    refused: list[Refusal]
    tokenizer: Any = None
    steps: list[str] = dataclasses.field(default_factory=list)  # what its workers load that is not cached yet
    note: str = ""
    state: SwapState = SwapState.UNCHANGED  # what a reload that finds nothing to swap to ends in: unchanged or refused


@dataclass(frozen=True)
class _Prepared:
    """A version whose graph is being built: the version, the RELOAD it answers, and when."""

    release: Release
    reload: int
    started: float


class VersionSwap:
    """Looks for versions in the repository of the version ``served`` and rolls the local
    workers from one to another."""

    def __init__(
        self,
        served: Release,
        *,
        pool: WorkerPool,
        processes: WorkerProcesses,
        book: VersionsBook,
        follow_latest: bool,
    ) -> None:
        assert served.version is not None
        config = self.config = served.config  # the options: a version found has them in its own directory
        self.pool = pool
        self.processes = processes
        self.book = book
        stored = config.model.model_url is not None
        self.checker = Checker(
            book.repository,
            config.model,
            require_manifest=config.serving.require_manifest or stored,
            settle_s=0.0 if stored else 2.0,  # a store's versions are renamed into the cache whole
        )
        self.store = store_of(config) if stored else None
        self.follow_latest = follow_latest  # --model-version latest (or reload): newer versions are taken
        self.interval = config.serving.poll_interval_s
        self.next_look = time.monotonic() + self.interval
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="bertserve-versions")
        self.look: Future[_Found] | None = None
        self.look_reload = 0  # the RELOAD the running look answers (0: a poll)
        self.served = served  # what the workers run when no swap is under way
        self.roll: Roll | None = None  # the swap under way
        self.tokenizers: dict[int | None, Any] = {}  # version -> its tokenizer, until it is served
        self.preparing: Preparation | None = None  # building what a found version's workers load
        self.prepared: _Prepared | None = None
        book.swap_begin(SwapState.IDLE, reload=0)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.preparing is not None:
            self.preparing.stop()

    # -- looking -------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Called by the server's loop a few times a second."""
        if self.preparing is not None:
            self._prepared()
            return
        if self.look is not None and self.look.done():
            self._found(self.look)
            self.look = None
        if self.look is None and self.roll is None and self.preparing is None:
            reload = self.pool.take_reload()
            if reload is not None:
                self._start_look(*reload)
            elif self.interval > 0 and self.follow_latest and now >= self.next_look:
                self._start_look("latest", 0)
        if self.roll is not None:
            self._roll(now)

    def _start_look(self, wanted: str, reload: int) -> None:
        self.next_look = time.monotonic() + self.interval
        if reload:
            self.follow_latest = wanted == "latest"  # a version asked for by number stays until asked again
            self.book.swap_update(SwapState.CHECKING, reload=reload, wanted=wanted, message="")
        self.look_reload = reload
        self.look = self.executor.submit(self._look, wanted, self._serving)

    @property
    def _serving(self) -> int:
        version = self.pool.serving_version
        assert version is not None
        return version

    def _look(self, wanted: str, current: int) -> _Found:
        """On the look's thread: the version to swap to (synced first from a store), checked,
        and its tokenizer."""
        try:
            if wanted != "latest" and int(wanted) == current:
                return _Found(None, [], note=f"version {wanted} is already served")
            synced, failure = self._pull(wanted, current)
            if failure is not None and wanted != "latest" and int(wanted) not in self.store_cached:
                return _Found(None, synced, note=f"model sync failed: {failure}", state=SwapState.REFUSED)
            version, refused = self.checker.find(wanted, current)
            refused = [*refused, *synced]
            if version is None and failure is not None:
                return _Found(None, refused, note=f"model sync failed: {failure}", state=SwapState.REFUSED)
        except (ModelError, OSError) as exc:  # no such version, or the repository is unreadable
            return _Found(None, [], note=str(exc), state=SwapState.REFUSED)
        if version is None:
            note = f"no version newer than {current} can be served"
            if refused:
                note = "; ".join(f"version {r.version.number} is refused: {r.reason}" for r in refused)
            return _Found(None, refused, note=note, state=SwapState.REFUSED if refused else SwapState.UNCHANGED)
        return self._prepare(version, refused)

    def _pull(self, wanted: str, current: int) -> tuple[list[Refusal], str | None]:
        """With a store: the version ``wanted`` synced into the cache (the newest above
        ``current`` for ``latest``); the store's versions refused, and what stopped the sync."""
        if self.store is None:
            return [], None
        pulled = self.store.pull(wanted, current, current)
        refused = [Refusal(Version(r.number, f"{self.store.url}/{r.number}"), r.reason) for r in pulled.rejected]
        return refused, pulled.error

    @property
    def store_cached(self) -> list[int]:
        return self.store.cached_versions() if self.store is not None else []

    def _prepare(self, version: Version, refused: list[Refusal]) -> _Found:
        from ...model.options import resolve_options
        from ...model.prepare import missing_steps

        config = self.config.in_dir(version.path)
        try:
            _, tokenizer = resolve_options(config.model)
        except (ValueError, TypeError, OSError) as exc:
            reason = f"this server's options do not fit its model: {exc}"
            return self._refuse(version, reason, refused)
        served = self.book.tokenizer
        if self.config.ports.http_port is not None and served is not None and not served.same_vocabulary(tokenizer):
            reason = (
                "its vocabulary differs from the served version's, with which the HTTP front end reads token "
                "ids; restart the server to change vocabularies"
            )
            return self._refuse(version, reason, refused)
        try:
            steps = [] if config.serving.model_class else missing_steps(config.model)
        except (ValueError, TypeError, OSError) as exc:
            return self._refuse(version, f"cannot read it: {exc}", refused)
        return _Found(Release(config, version.number), refused, tokenizer, steps)

    def _refuse(self, version: Version, reason: str, refused: list[Refusal]) -> _Found:
        self.checker.refuse(version, reason)
        note = f"version {version.number} is refused: {reason}"
        return _Found(None, [*refused, Refusal(version, reason)], note=note, state=SwapState.REFUSED)

    def _found(self, look: Future[_Found]) -> None:
        try:
            found = look.result()
        except Exception as exc:  # a bug in looking must not stop the server
            logger.exception("looking for model versions failed")
            found = _Found(None, [], note=f"looking for model versions failed: {exc}")
        self.book.record_refusals(found.refused)
        if self.store is not None:
            self.book.record_sync(self.store.status())
        if found.release is None:
            if self.look_reload:
                self.book.swap_update(found.state, message=found.note, finished=time.time())
                logger.info("reload: %s", found.note)
            return
        self.tokenizers[found.release.version] = found.tokenizer
        self.preparing = self.processes.prepare(found.release.config, found.steps)
        if self.preparing is None:
            self.begin(found.release, self.look_reload)
            return
        self.prepared = _Prepared(found.release, self.look_reload, time.time())
        self.book.swap_begin(
            SwapState.PREPARING,
            reload=self.look_reload,
            version_from=self._serving,
            version_to=found.release.version,
            started=self.prepared.started,
            message=f"building the graph of version {found.release.version}",
        )

    def _prepared(self) -> None:
        """Once the preparation has ended: the swap begins, or the version is refused."""
        assert self.preparing is not None and self.prepared is not None
        done = self.preparing.poll()
        if done is None:
            return
        prepared, failure = self.prepared, self.preparing.failure
        self.preparing = self.prepared = None
        if done:
            self.begin(prepared.release, prepared.reload, started=prepared.started)  # it starts with its preparation
            return
        self._refuse_release(prepared.release, failure)
        message = f"version {prepared.release.version} is refused: {failure}"
        self.book.swap_update(SwapState.REFUSED, message=message, finished=time.time())

    def _refuse_release(self, release: Release, reason: str) -> None:
        """Refuse the version ``release``, found sound but failed once tried."""
        assert release.version is not None
        version = Version(release.version, release.config.model.model_dir)
        self.checker.refuse(version, reason)
        self.book.record_refusals([Refusal(version, reason)])
        self.tokenizers.pop(release.version, None)

    # -- rolling -------------------------------------------------------------------------

    def begin(self, release: Release, reload: int, started: float | None = None) -> None:
        """Start rolling the workers to ``release`` (a version found, and prepared), for the
        RELOAD ``reload`` (0: a poll), which started at ``started`` (default now)."""
        old, new = self.served.version, release.version
        self.roll = Roll(target=release, previous=self.served)
        logger.info("swapping model version %s for %s, one worker at a time", old, new)
        self.book.forget_refusal(new)
        self.book.swap_begin(
            SwapState.ROLLING,
            reload=reload,
            version_from=old,
            version_to=new,
            started=started or time.time(),
            workers_replaced=0,
            message=f"starting a worker of version {new}",
        )

    def _seen(self, now: float) -> Seen:
        """What the planner is shown: the local workers, the version served, the queue."""
        pool, processes = self.pool, self.processes
        retiring = processes.retiring_workers()
        workers = {
            index: self._worker(index, version, index in retiring)
            for index, version in processes.worker_versions().items()
        }
        return Seen(now, pool.serving_version, workers, frozenset(pool.queued_versions()))

    def _worker(self, index: int, version: int | None, retiring: bool) -> plan.Worker:
        pool = self.pool
        return plan.Worker(
            version,
            alive=self.processes.worker_alive(index),
            retiring=retiring,
            ready=pool.worker_ready(index),
            draining=pool.worker_draining(index),
            holds_jobs=pool.worker_holds_jobs(index),
        )

    def _roll(self, now: float) -> None:
        """One turn towards ``--num-worker`` workers of the target version."""
        assert self.roll is not None
        self.roll, steps = plan.plan(self.roll, self._seen(now))
        for step in steps:
            self._carry_out(step, now)

    def _carry_out(self, step: Step, now: float) -> None:
        assert self.roll is not None
        target = self.roll.target.version
        if isinstance(step, plan.KillWorker):
            logger.error(
                "worker %d did not load version %s in %.0f s; killing it", step.index, target, plan.LOAD_TIMEOUT_S
            )
            self.processes.kill_worker(step.index)  # its exit rolls the swap back
        elif isinstance(step, plan.ServeTarget):
            self._serve(step.target)
        elif isinstance(step, plan.RetireWorker):
            self.processes.retire_worker(step.index)
            self.pool.stop_worker(step.index)
            self.book.swap_replaced()
        elif isinstance(step, plan.StartWorker):
            index = self.processes.add_worker(step.target)
            self.roll = self.roll.started(index, now)
            self.book.swap_update(message=f"worker {index} is loading version {target}")
        elif isinstance(step, plan.DrainWorker):
            self.pool.drain_worker(step.index)
            self.book.swap_update(message=f"worker {step.index} of version {step.version} is finishing its jobs")
        elif isinstance(step, plan.Finish):
            self._finish(step.rolled_back)

    def _serve(self, release: Release) -> None:
        self.pool.serve_version(release.version, release.config.model.model_dir)
        tokenizer = self.tokenizers.pop(release.version, None)
        if tokenizer is not None:
            self.book.serve_tokenizer(tokenizer)
        logger.info("new requests run on model version %s", release.version)

    def _finish(self, rolled_back: bool) -> None:
        assert self.roll is not None
        self.served, self.roll = self.roll.target, None
        state = SwapState.ROLLED_BACK if rolled_back else SwapState.DONE
        self.book.swap_update(state, finished=time.time(), message=f"serving version {self.served.version}")
        logger.info(
            "%s: %d worker(s) serve model version %s",
            "rolled back" if rolled_back else "swap done",
            len(self.processes.worker_versions()),
            self.served.version,
        )

    # -- deaths --------------------------------------------------------------------------

    def keep(self, index: int, exitcode: int | None) -> bool:
        """Worker ``index`` died: whether it is to be started again (see
        :func:`.plan.on_death`). A new worker that died before it was ready rolls the
        swap back."""
        if self.roll is None:
            return True
        failed = self.roll.target
        self.roll, death = plan.on_death(self.roll, self._seen(time.monotonic()), index)
        if death is Death.ROLL_BACK:
            reason = f"its worker {index} could not load it (exit code {exitcode}; see the errors above)"
            self._refuse_release(failed, reason)
            logger.error("rolling back to model version %s", self.roll.target.version)
            self.book.swap_update(SwapState.ROLLING_BACK, message=f"version {failed.version} failed: {reason}")
        return death is Death.RESTART
