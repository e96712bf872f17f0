"""A model kept in object storage (``--model-dir s3://bucket/prefix``), synced into a local
cache and served from there, as a model directory or a repository of numbered versions.

The store holds one model (its manifest, ``bertserve.sha256``, at the URL itself) or numbered
versions (``1/``, ``2/``, ..., each with its manifest), as a local repository does. The
manifest is required: it is what a copy is checked against. The cache (``--model-cache``)
keeps, for each URL::

    CACHE/<name of the URL>/1/ 2/ ...   whole versions, each checked against its manifest
    CACHE/<name of the URL>/model/      a URL that is one model
    CACHE/<name of the URL>/.partial/N/ a version being brought over

so the server serves the cache as it serves a local repository (:mod:`.repository`), which
checks each version against its manifest again before it serves it.

A sync reads the version's manifest first and brings over only the files the cache does not
hold already: a file whose digest a cached version holds is linked from there, and one a cut
sync left verified in ``.partial`` is kept. Every file is checked as it arrives
(:func:`.store_files.fetch_file`), and the version is renamed into place only once all of it
is; a half-copied version is never seen. At most ``--keep-versions`` versions stay cached,
and always the one served, so that ``bertserve reload --model-version N`` rolls back without
the store.

While serving, :meth:`ModelStore.pull` (each ``--poll-interval-s``, and at a RELOAD) lists the
store's versions (one request) and syncs the newest above the one served, if any. A version
whose sync fails for good (a file that does not match its digest, a file missing) is refused
by name and left alone for :data:`TRIES_PER_VERSION` syncs, then until its manifest changes;
one that fails for the store being out of reach is tried again at the next poll. What serves
is never touched by a failed sync. Syncs of one cache are one at a time, across processes
(a lock file), so a head and a worker host on one machine share it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from .checksum import MANIFEST, file_sha256, manifest_problems, parse_manifest
from .store_cache import (
    cache_name,
    check_path,
    default_cache,
    link_or_copy,
    manifest_text,
    remove_tree,
    remove_unlisted,
)
from .store_files import Pace, StoreError, StoreUrl, fetch_file, open_store, parse_store_url, store_error

logger = logging.getLogger("bertserve.store")

ONE_MODEL = "model"
"""The cache's directory of a URL that is one model, not numbered versions."""
MAX_MANIFEST_BYTES = 1 << 20
MAX_FILES = 10_000
TRIES_PER_VERSION = 3
"""Syncs of one version that fail for good before it is left alone until its manifest changes
(a RELOAD that names it tries again)."""
LAST_SYNC = ".last-sync"


@dataclass
class SyncStats:
    """What syncs of one store did, for the status: requests, files, bytes and failures."""

    listings: int = 0
    manifest_reads: int = 0
    files_fetched: int = 0
    files_reused: int = 0
    bytes_fetched: int = 0
    fetch_seconds: float = 0.0  # the transfers' time (bytes_fetched / fetch_seconds: the rate they ran at)
    failures: int = 0
    last_success: float | None = None
    last_error: str = ""


@dataclass(frozen=True)
class Rejected:
    """A version of the store refused: its number and why."""

    number: int
    reason: str


@dataclass(frozen=True)
class Pulled:
    """What one look at the store did: the versions it refused, and the error that stopped it (if any)."""

    rejected: tuple[Rejected, ...] = ()
    error: str | None = None


class ModelStore:
    """One URL's model in its store and in the local cache."""

    def __init__(
        self,
        url: str,
        cache: str | None = None,
        *,
        keep_versions: int = 2,
        max_bytes_per_s: float | None = None,
    ) -> None:
        self.url = parse_store_url(url)
        self.root = os.path.join(cache or default_cache(), cache_name(self.url))
        self.keep_versions = keep_versions
        self.max_bytes_per_s = max_bytes_per_s
        self.stats = SyncStats()
        self._fs: object | None = None
        self._failed: dict[int, tuple[str, int]] = {}  # version -> (its manifest's digest, lasting failures)

    @property
    def fs(self) -> object:
        if self._fs is None:
            self._fs = open_store(self.url)
        return self._fs

    # -- the store -----------------------------------------------------------------------

    def store_versions(self) -> list[int] | None:
        """The store's numbered versions, lowest first; ``None`` when the URL is one model
        (its manifest is there). Raises :class:`StoreError` when it is neither."""
        self.stats.listings += 1
        try:
            entries = self.fs.ls(self.url.fs_path, detail=False)  # type: ignore[attr-defined]
        except FileNotFoundError:
            entries = []
        except Exception as exc:  # each backend raises its own kinds
            raise store_error(exc, self.url, "listing") from exc
        names = {str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in entries}
        if MANIFEST in names:
            return None
        numbers = sorted(int(name) for name in names if name.isdigit())
        if not numbers:
            raise StoreError(
                f"{self.url} holds neither a {MANIFEST} (one model: write it with `bertserve manifest DIR` before "
                "uploading) nor numbered versions 1/, 2/, ... each with its own",
                lasting=True,
            )
        return numbers

    def _manifest(self, base: StoreUrl) -> tuple[str, dict[str, str]]:
        """A version's manifest, read and checked: its text and ``{path: sha256}``."""
        self.stats.manifest_reads += 1
        where = base.child(MANIFEST)
        try:
            with self.fs.open(where.fs_path, "rb") as f:  # type: ignore[attr-defined]
                raw = f.read(MAX_MANIFEST_BYTES + 1)
        except Exception as exc:
            error = store_error(exc, where, "reading")
            if error.missing:
                error = StoreError(f"{base} has no {MANIFEST}: write one with `bertserve manifest DIR`", lasting=True)
            raise error from exc
        try:
            if len(raw) > MAX_MANIFEST_BYTES:
                raise ValueError(f"it is over {MAX_MANIFEST_BYTES} bytes")
            text = raw.decode("utf-8")
            listed = parse_manifest(text)
            if len(listed) > MAX_FILES:
                raise ValueError(f"it lists {len(listed)} files, over {MAX_FILES}")
            for rel in listed:
                check_path(rel)
        except (ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"{where} cannot be used: {exc}", lasting=True) from None
        return text, listed

    # -- the cache -----------------------------------------------------------------------

    def local(self, number: int | None) -> str:
        """The cache's directory of version ``number`` (``None``: the one model)."""
        return os.path.join(self.root, ONE_MODEL if number is None else str(number))

    def cached_versions(self) -> list[int]:
        if not os.path.isdir(self.root):
            return []
        return sorted(int(name) for name in os.listdir(self.root) if name.isdigit())

    @property
    def last_sync(self) -> float | None:
        """When a sync or a look at the store last succeeded, by any process of this cache."""
        try:
            return os.path.getmtime(os.path.join(self.root, LAST_SYNC))
        except OSError:
            return None

    def _succeeded(self) -> None:
        self.stats.last_success = time.time()
        with open(os.path.join(self.root, LAST_SYNC), "w", encoding="utf-8") as f:
            f.write(f"{self.stats.last_success:.3f}\n")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        os.makedirs(self.root, exist_ok=True)
        with open(os.path.join(self.root, ".lock"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- syncing -------------------------------------------------------------------------

    def start(self, wanted: str) -> tuple[str, list[Rejected]]:
        """At start: sync what ``wanted`` (``latest`` or a number) asks for, and say where to
        serve it from: the one model's directory, or the cache's repository root. The newest
        version that can be had serves; the ones refused on the way are returned. A store
        out of reach leaves the cache to serve what it holds, with a warning; with nothing
        cached, raises :class:`StoreError`."""
        rejected: list[Rejected] = []
        with self._locked():
            try:
                numbers = self.store_versions()
                if numbers is None:
                    path = self.sync(None)
                    self._succeeded()
                    return path, []
                if wanted != "latest":
                    self.sync(int(wanted))
                elif not self._sync_newest(numbers, rejected) and not self.cached_versions():
                    reasons = "; ".join(f"version {r.number}: {r.reason}" for r in rejected)
                    raise StoreError(f"no version of {self.url} can be had ({reasons})", lasting=True)
                self._succeeded()
                self.prune(None if wanted == "latest" else int(wanted))
                return self.root, rejected
            except StoreError as exc:
                cached = os.path.isdir(self.local(None)) or self.cached_versions()
                if not cached or (wanted != "latest" and int(wanted) not in self.cached_versions()):
                    raise
                self._failed_sync(str(exc))
                logger.error("model sync: %s; serving what the cache %s holds, as synced before", exc, self.root)
                return (self.local(None) if os.path.isdir(self.local(None)) else self.root), rejected

    def pull(self, wanted: str, current: int, serving: int | None) -> Pulled:
        """While serving: sync the newest version above ``current`` (``wanted`` is
        ``latest``) or version ``wanted``, unless cached already; then prune, keeping
        ``serving``. Never raises for the store: what went wrong is in the result."""
        rejected: list[Rejected] = []
        with self._locked():
            try:
                if wanted == "latest":
                    numbers = self.store_versions()
                    if numbers:
                        self._sync_newest([n for n in numbers if n > current], rejected)
                elif int(wanted) not in self.cached_versions():
                    self._failed.pop(int(wanted), None)  # asked for by name: tried again
                    self.sync(int(wanted))
                self._succeeded()
                self.prune(serving)
            except StoreError as exc:
                self._failed_sync(str(exc))
                logger.error("model sync of %s failed: %s", self.url, exc)
                return Pulled(tuple(rejected), str(exc))
        for refusal in reversed(rejected):  # the newest's reason is the last error
            self._failed_sync(refusal.reason)
        return Pulled(tuple(rejected))

    def _failed_sync(self, reason: str) -> None:
        self.stats.failures += 1
        self.stats.last_error = reason

    def _sync_newest(self, numbers: list[int], rejected: list[Rejected]) -> bool:
        """The newest of ``numbers`` that can be had, synced (or found cached), and whether
        there was one; those that fail for good are added to ``rejected`` and the next older
        one is tried. A failure that may pass (the store out of reach) raises."""
        cached = set(self.cached_versions())
        for number in reversed(numbers):
            if number in cached:
                return True
            try:
                self.sync(number)
                return True
            except StoreError as exc:
                if not exc.lasting:
                    raise
                rejected.append(Rejected(number, str(exc)))
        return False

    def sync(self, number: int | None) -> str:
        """Bring version ``number`` (``None``: the one model) into the cache, checked, and
        return its directory. Raises :class:`StoreError` naming the file and the cause."""
        base = self.url if number is None else self.url.child(str(number))
        text, listed = self._manifest(base)
        digest = hashlib.sha256(text.encode()).hexdigest()
        target = self.local(number)
        if os.path.isdir(target):
            if manifest_text(target) == text:
                return target
            if number is not None:
                logger.warning(
                    "version %d of %s changed in the store after it was synced; a version is read once: upload "
                    "the change as a new version",
                    number,
                    self.url,
                )
                return target
        if number is not None:
            known, failures = self._failed.get(number, ("", 0))
            if known == digest and failures >= TRIES_PER_VERSION:
                raise StoreError(
                    f"version {number} failed {failures} syncs, and is left alone until its {MANIFEST} changes "
                    "or a reload names it",
                    lasting=True,
                )
        try:
            self._bring(base, number, text, listed)
        except StoreError as exc:
            if exc.lasting and number is not None:
                known, failures = self._failed.get(number, ("", 0))
                self._failed[number] = (digest, failures + 1 if known == digest else 1)
            raise
        if number is not None:
            self._failed.pop(number, None)
        return target

    def _bring(self, base: StoreUrl, number: int | None, text: str, listed: dict[str, str]) -> None:
        staging = os.path.join(self.root, ".partial", ONE_MODEL if number is None else str(number))
        os.makedirs(staging, exist_ok=True)
        remove_unlisted(staging, listed)
        reuse = self._cached_files()
        pace = Pace(self.max_bytes_per_s)
        started, fetched = time.monotonic(), 0
        for rel, sha256 in listed.items():
            dest = os.path.join(staging, *rel.split("/"))
            if os.path.isfile(dest) and file_sha256(dest) == sha256:
                continue  # left whole by a sync that was cut
            source = reuse.get(sha256)
            if source is not None:
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                link_or_copy(source, dest)
                self.stats.files_reused += 1
                continue
            got = fetch_file(self.fs, base.child(*rel.split("/")), dest, sha256, pace)
            self.stats.files_fetched += 1
            self.stats.bytes_fetched += got.size
            self.stats.fetch_seconds += got.seconds
            fetched += got.size
        with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as f:
            f.write(text)
        problems = manifest_problems(staging)
        if problems:  # a file changed in the cache while it synced
            raise StoreError(
                f"{base}: the copy does not match its {MANIFEST}: {'; '.join(problems[:3])}", lasting=False
            )
        target = self.local(number)
        if os.path.isdir(target):  # the one model, changed in the store: the old copy goes
            remove_tree(target, self.root)
        os.replace(staging, target)
        elapsed = time.monotonic() - started
        logger.info(
            "model sync: %s is in %s (%d files, %.1f MB fetched in %.1f s)",
            base,
            target,
            len(listed),
            fetched / 1e6,
            elapsed,
        )

    def _cached_files(self) -> dict[str, str]:
        """sha256 -> a file of a cached version with that content (from their manifests)."""
        found: dict[str, str] = {}
        for number in [None, *self.cached_versions()]:
            directory = self.local(number)
            text = manifest_text(directory)
            if text is None:
                continue
            try:
                listed = parse_manifest(text)
            except ValueError:
                continue
            for rel, sha256 in listed.items():
                found.setdefault(sha256, os.path.join(directory, *rel.split("/")))
        return found

    def prune(self, serving: int | None) -> list[int]:
        """Remove cached versions beyond the newest ``keep_versions``, never ``serving``."""
        cached = self.cached_versions()
        keep = set(cached[-self.keep_versions :]) | ({serving} if serving is not None else set())
        removed = [number for number in cached if number not in keep]
        for number in removed:
            remove_tree(self.local(number), self.root)
            logger.info(
                "model sync: removed version %d of %s from the cache (--keep-versions %d)",
                number,
                self.url,
                self.keep_versions,
            )
        return removed

    def status(self) -> dict[str, object]:
        return {"url": self.url.url, "cache": self.root, **asdict(self.stats)}
