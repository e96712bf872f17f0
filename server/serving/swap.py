"""Model versions while serving: looking for a new version, and swapping the workers to it.

With ``--model-dir`` a repository of numbered versions (:mod:`..model.repository`), the
server looks for a newer whole version every ``--poll-interval-s`` seconds and when a client
sends RELOAD (``bertserve reload``). Hashing model files takes a while, so the look runs on a
thread of its own while the ventilator keeps serving.

A version found is first made ready to load: its graph and LiteRT model, when not cached
yet, are built in a child process of their own (:mod:`..model.prepare`, status state
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
than :data:`LOAD_TIMEOUT_S`) rolls the swap back the same way: the old version is served
again, its workers are started again, and new-version workers that were ready finish what
was pinned to them and leave. The version is refused from then on, until its files change.
A head that takes remote workers (``--worker-port``) does not swap: their hosts hold their
own copies of the model files.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import ServerConfig
from ..errors import ModelError
from ..model.repository import Checker, Refusal, Version

if TYPE_CHECKING:
    from ..model.prepare import Preparation
    from .supervisor import BertServer
    from .ventilator import Ventilator

logger = logging.getLogger("bertserve.server")

LOAD_TIMEOUT_S = 600.0  # a new-version worker not ready by then has failed to load
FINAL_STATES = ("unchanged", "refused", "done", "rolled_back")


@dataclass
class _Found:
    """What a look at the repository found: the config of a version to swap to (if any) and
    its tokenizer, the versions refused on the way, and why nothing is to be done."""

    config: ServerConfig | None
    refused: list[Refusal]
    tokenizer: Any = None
    steps: list[str] = dataclasses.field(default_factory=list)  # what its workers load that is not cached yet
    note: str = ""
    state: str = "unchanged"  # what a reload that finds nothing to swap to ends in: unchanged or refused


class VersionSwap:
    """Looks for versions and rolls the workers of ``server`` from one to another."""

    def __init__(self, server: BertServer, ventilator: Ventilator, *, follow_latest: bool) -> None:
        assert server.config.version_number is not None
        self.server = server
        self.ventilator = ventilator
        self.base = server.repository
        self.checker = Checker(self.base, server.config.model, require_manifest=server.config.require_manifest)
        self.follow_latest = follow_latest  # --model-version latest (or reload): newer versions are taken
        self.interval = server.config.poll_interval_s
        self.next_look = time.monotonic() + self.interval
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="bertserve-versions")
        self.look: Future[_Found] | None = None
        self.look_reload = 0  # the RELOAD the running look answers (0: a poll)
        self.target = server.config  # the version the workers converge on
        self.previous: ServerConfig | None = None  # what was served when the swap began
        self.tokenizers: dict[int | None, Any] = {}  # version -> its tokenizer, until it is served
        self.loading: dict[int, float] = {}  # new workers not ready yet: index -> started
        self.preparing: Preparation | None = None  # building what a found version's workers load
        self.prepared: tuple[ServerConfig, int] | None = None  # that version's config, and the RELOAD it answers
        self.state: dict[str, Any] = ventilator.swap
        self.state.update(state="idle", reload=0)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.preparing is not None:
            self.preparing.stop()

    @property
    def rolling(self) -> bool:
        return self.previous is not None

    # -- looking -------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Called by the server's loop a few times a second."""
        if self.preparing is not None:
            self._prepared()
            return
        if self.look is not None and self.look.done():
            self._found(self.look)
            self.look = None
        if self.look is None and not self.rolling and self.preparing is None:
            wanted = self.ventilator.reload_requested
            if wanted is not None:
                self.ventilator.reload_requested = None
                self._start_look(wanted, self.ventilator.reloads)
            elif self.interval > 0 and self.follow_latest and now >= self.next_look:
                self._start_look("latest", 0)
        if self.rolling:
            self._roll(now)

    def _start_look(self, wanted: str, reload: int) -> None:
        self.next_look = time.monotonic() + self.interval
        if reload:
            self.follow_latest = wanted == "latest"  # a version asked for by number stays until asked again
            self.state.update(state="checking", reload=reload, wanted=wanted, message="")
        self.look_reload = reload
        self.look = self.pool.submit(self._look, wanted, self._serving)

    @property
    def _serving(self) -> int:
        version = self.ventilator.version
        assert version is not None
        return version

    def _look(self, wanted: str, current: int) -> _Found:
        """On the look's thread: the version to swap to, checked, and its tokenizer."""
        try:
            if wanted != "latest" and int(wanted) == current:
                return _Found(None, [], note=f"version {wanted} is already served")
            version, refused = self.checker.find(wanted, current)
        except (ModelError, OSError) as exc:  # no such version, or the repository is unreadable
            return _Found(None, [], note=str(exc), state="refused")
        if version is None:
            note = f"no version newer than {current} can be served"
            if refused:
                note = "; ".join(f"version {r.version.number} is refused: {r.reason}" for r in refused)
            return _Found(None, refused, note=note, state="refused" if refused else "unchanged")
        return self._prepare(version, refused)

    def _prepare(self, version: Version, refused: list[Refusal]) -> _Found:
        from ..model.options import resolve_options
        from ..model.prepare import missing_steps

        config = dataclasses.replace(
            self.server.config, model=self.server.config.model.replace(model_dir=version.path),
            model_version=str(version.number),
        )  # fmt: skip
        try:
            _, tokenizer = resolve_options(config.model)
        except (ValueError, TypeError, OSError) as exc:
            reason = f"this server's options do not fit its model: {exc}"
            return self._refuse(version, reason, refused)
        served = self.server.tokenizer
        if self.server.config.http_port is not None and served is not None and not served.same_vocabulary(tokenizer):
            reason = ("its vocabulary differs from the served version's, with which the HTTP front end reads token "
                      "ids; restart the server to change vocabularies")  # fmt: skip
            return self._refuse(version, reason, refused)
        try:
            steps = [] if config.model_class else missing_steps(config.model)
        except (ValueError, TypeError, OSError) as exc:
            return self._refuse(version, f"cannot read it: {exc}", refused)
        return _Found(config, refused, tokenizer, steps)

    def _refuse(self, version: Version, reason: str, refused: list[Refusal]) -> _Found:
        self.checker.refuse(version, reason)
        note = f"version {version.number} is refused: {reason}"
        return _Found(None, [*refused, Refusal(version, reason)], note=note, state="refused")

    def _found(self, look: Future[_Found]) -> None:
        try:
            found = look.result()
        except Exception as exc:  # a bug in looking must not stop the server
            logger.exception("looking for model versions failed")
            found = _Found(None, [], note=f"looking for model versions failed: {exc}")
        self.server.record_refusals(found.refused)
        if found.config is None:
            if self.look_reload:
                self.state.update(state=found.state, message=found.note, finished=time.time())
                logger.info("reload: %s", found.note)
            return
        self.tokenizers[found.config.version_number] = found.tokenizer
        self.preparing = self.server.preparation(found.config, found.steps)
        if self.preparing is None:
            self._begin(found.config, self.look_reload)
            return
        self.prepared = (found.config, self.look_reload)
        self.state.clear()
        self.state.update(
            state="preparing", reload=self.look_reload, version_from=self._serving,
            version_to=found.config.version_number, started=time.time(),
            message=f"building the graph of version {found.config.version_number}",
        )  # fmt: skip

    def _prepared(self) -> None:
        """Once the preparation has ended: the swap begins, or the version is refused."""
        assert self.preparing is not None and self.prepared is not None
        done = self.preparing.poll()
        if done is None:
            return
        (config, reload), failure = self.prepared, self.preparing.failure
        self.preparing = self.prepared = None
        if done:
            self._begin(config, reload, started=self.state["started"])  # a swap starts with its preparation
            return
        self._refuse_config(config, failure)
        self.state.update(state="refused", message=f"version {config.version_number} is refused: {failure}",
                          finished=time.time())  # fmt: skip

    def _refuse_config(self, config: ServerConfig, reason: str) -> None:
        """Refuse the version ``config`` serves, found sound but failed once tried."""
        version = Version(int(config.model_version), config.model.model_dir)
        self.checker.refuse(version, reason)
        self.server.record_refusals([Refusal(version, reason)])
        self.tokenizers.pop(config.version_number, None)

    # -- rolling -------------------------------------------------------------------------

    def _begin(self, config: ServerConfig, reload: int, started: float | None = None) -> None:
        self.previous = self.target
        self.target = config
        old, new = self.previous.version_number, config.version_number
        logger.info("swapping model version %s for %s, one worker at a time", old, new)
        refused = self.server.refused_versions  # one refused while it was being written is whole now
        refused[:] = [entry for entry in refused if entry["version"] != new]
        self.state.clear()
        self.state.update(
            state="rolling", reload=reload, version_from=old, version_to=new, started=started or time.time(),
            workers_replaced=0,
            message=f"starting a worker of version {new}",
        )  # fmt: skip

    def _version(self, index: int) -> int | None:
        return self.server.worker_config[index].version_number

    def _roll(self, now: float) -> None:
        """One step towards ``--num-worker`` workers of the target version."""
        server, registry = self.server, self.ventilator.registry
        target = self.target.version_number
        count = server.config.num_worker
        fresh = [i for i in server.workers if self._version(i) == target]
        stale = sorted(i for i in server.workers if self._version(i) != target)
        ready = [i for i in fresh if registry.by_index(i)]
        for index in ready:
            self.loading.pop(index, None)
        for index, started in self.loading.items():
            if now - started > LOAD_TIMEOUT_S and server.workers[index].is_alive():
                logger.error("worker %d did not load version %s in %.0f s; killing it", index, target, LOAD_TIMEOUT_S)
                server.workers[index].kill()  # its exit rolls the swap back
        if ready and self.ventilator.version != target:
            self._serve_target()
        for index in stale:
            workers = registry.by_index(index)
            if index not in server.retiring and workers and all(w.draining and not w.jobs for w in workers):
                server.retire_worker(index)
                self.state["workers_replaced"] += 1
        if any(index in server.retiring for index in stale) or len(ready) < len(fresh):
            return  # one at a time: a worker is leaving, or a new one is loading
        if len(fresh) < count and len(server.workers) <= count:
            index = server.add_worker(self.target)
            self.loading[index] = now
            self.state["message"] = f"worker {index} is loading version {target}"
            return
        draining = [i for i in stale if any(w.draining for w in registry.by_index(i))]
        if stale and not draining:
            self._drain_one(stale)
        elif not stale:
            self._finish()

    def _drain_one(self, stale: list[int]) -> None:
        """Drain the first old worker that may go: the last one of a version stays while
        requests pinned to that version are queued."""
        registry = self.ventilator.registry
        queued = self.ventilator.scheduler.versions()
        for index in stale:
            workers = registry.by_index(index)
            if not workers:
                continue  # not registered (yet): nothing to drain
            version = self._version(index)
            others = [i for i in stale if i != index and self._version(i) == version and registry.by_index(i)]
            if version in queued and not others:
                continue
            for worker in workers:
                worker.draining = True
            self.state["message"] = f"worker {index} of version {version} is finishing its jobs"
            return

    def _serve_target(self) -> None:
        self.ventilator.serve_version(self.target)
        tokenizer = self.tokenizers.pop(self.target.version_number, None)
        if tokenizer is not None:
            self.server.tokenizer = tokenizer
        logger.info("new requests run on model version %s", self.target.version_number)

    def _finish(self) -> None:
        assert self.previous is not None
        rolled_back = self.state.get("state") == "rolling_back"
        self.state.update(state="rolled_back" if rolled_back else "done", finished=time.time(),
                          message=f"serving version {self.target.version_number}")  # fmt: skip
        logger.info("%s: %d worker(s) serve model version %s", "rolled back" if rolled_back else "swap done",
                    len(self.server.workers), self.target.version_number)  # fmt: skip
        self.previous = None

    # -- deaths --------------------------------------------------------------------------

    def keep(self, index: int, exitcode: int | None) -> bool:
        """Worker ``index`` died: whether it is to be restarted. A new worker that died before
        it was ready rolls the swap back; an old one that died during a swap is replaced only
        while work pinned to its version is queued or was held by it, and no other worker of
        its version is left."""
        if not self.rolling:
            return True
        version = self._version(index)
        if index in self.loading and version == self.target.version_number:
            del self.loading[index]
            if self.state.get("state") == "rolling_back":
                return True  # the version that served until now fails too: the usual restarts and limits
            self._roll_back(index, exitcode)
            return False
        if version == self.target.version_number:
            return True
        others = [i for i in self.server.workers if i != index and i not in self.server.retiring
                  and self._version(i) == version]  # fmt: skip
        held = any(worker.jobs for worker in self.ventilator.registry.by_index(index))  # handed on when it is lost
        return (held or version in self.ventilator.scheduler.versions()) and not others

    def _roll_back(self, index: int, exitcode: int | None) -> None:
        assert self.previous is not None
        failed, self.target = self.target, self.previous
        reason = f"its worker {index} could not load it (exit code {exitcode}; see the errors above)"
        self._refuse_config(failed, reason)
        logger.error("rolling back to model version %s", self.target.version_number)
        self.state.update(state="rolling_back", message=f"version {failed.version_number} failed: {reason}")
