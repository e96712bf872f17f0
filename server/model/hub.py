"""Models named by their Hugging Face Hub id: ``ORG/NAME[@REVISION]`` resolved, once, to a
directory of the user's Hub cache, which the rest of bertserve serves as it serves any model
directory.

``huggingface_hub`` does the work, as it does for sentence-transformers, transformers, TEI and
infinity, so a model one of them downloaded is found where it is, and the Hub's own
environment holds: ``HF_HOME`` (or ``HF_HUB_CACHE``) says where the cache is, ``HF_TOKEN`` (or
``hf auth login``) which token is sent, ``HF_ENDPOINT`` which Hub (a mirror), and
``HF_HUB_OFFLINE=1`` that the network is never touched: the cache alone answers.

Online, the revision is resolved to its commit (one request), and only the files the model
needs (:mod:`.hub_files`) are fetched, those already cached not again. A download writes to a
temporary file that ``huggingface_hub`` renames into place only once whole, and every file the
model needs is checked to be there before the directory is served: a download cut short is
never served, and the next start fetches what is missing. Offline, or with the Hub out of
reach, the commit the revision resolved to last time is served, if the cache holds the whole
model.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, HubError
from .hub_files import METADATA, metadata_files, needed_files

logger = logging.getLogger("bertserve.hub")

_MODEL_ID = re.compile(r"(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)(?:@(?P<revision>[^\s@]+))?")
MODEL_ID_RULE = "ORG/NAME or ORG/NAME@REVISION (a branch, tag or commit), as the Hugging Face Hub names a model"
OFFLINE_RECIPE = "`hf download {repo} --local-dir DIR` on a machine with network, then serve DIR with --model-dir"
REVISION_RULE = "a branch, tag or commit the model has, as git names them: main, v1.0, refs/pr/1, a commit's hash"

#: what git check-ref-format refuses anywhere in a name: control characters, space, ~ ^ : ? * [ and \\
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


@dataclass(frozen=True)
class ModelId:
    """``ORG/NAME[@REVISION]``: a model repository on the Hub and, unless the default branch,
    the revision asked for."""

    repo_id: str
    revision: str | None = None

    def __post_init__(self) -> None:
        # huggingface_hub puts the revision in URLs and in the cache's refs/ folder: a name git
        # would refuse (../../x) is refused here, whoever made the id
        if self.revision is not None:
            fault = revision_fault(self.revision)
            if fault is not None:
                raise ConfigError(
                    f"the revision {self.revision!r} of {self.repo_id} {fault}, which git refuses in the name of a "
                    f"branch or tag: name {REVISION_RULE}"
                )

    @classmethod
    def parse(cls, text: str) -> ModelId:
        match = _MODEL_ID.fullmatch(str(text).strip())
        if match is None or "--" in match["repo"] or ".." in match["repo"]:
            raise ConfigError(f"{text!r} is not a Hub model id: expected {MODEL_ID_RULE}")
        return cls(match["repo"], match["revision"])

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


def revision_fault(revision: str) -> str | None:
    """What makes ``revision`` a name git refuses for a branch or tag (``git check-ref-format
    --allow-onelevel``), or ``None`` for a good one: ``main``, ``v1.0``, ``refs/pr/1`` and a
    40-hex commit are."""
    forbidden = _REF_FORBIDDEN.search(revision)
    checks = (
        (not revision, "is empty"),
        (revision == "@", "is '@'"),
        (forbidden is not None, f"holds {forbidden[0]!r}" if forbidden else ""),
        (".." in revision, "holds '..'"),
        ("@{" in revision, "holds '@{'"),
        (revision.startswith("/") or revision.endswith("/"), "starts or ends with '/'"),
        ("//" in revision, "holds '//'"),
        (revision.endswith("."), "ends with '.'"),
        (any(part.startswith(".") for part in revision.split("/")), "has a part that starts with '.'"),
        (any(part.endswith(".lock") for part in revision.split("/")), "has a part that ends with '.lock'"),
    )
    return next((fault for failed, fault in checks if failed), None)


def is_model_id(text: str) -> bool:
    """Whether ``text`` names a model on the Hub rather than a directory: it is written
    ``ORG/NAME[@REVISION]`` and no such path exists (a local directory always wins)."""
    return _MODEL_ID.fullmatch(text) is not None and not os.path.exists(text)


@dataclass(frozen=True)
class HubModel:
    """A model of the Hub, in the cache: its directory (a snapshot, the same for every program
    that uses the cache), its repository, the revision asked for and the commit served."""

    directory: str
    repo_id: str
    revision: str
    commit: str


def fetch_model(
    model_id: str | ModelId,
    *,
    cache_dir: str | None = None,
    endpoint: str | None = None,
    offline: bool | None = None,
) -> HubModel:
    """The model ``model_id`` in the Hub cache, downloaded first if need be. ``cache_dir``,
    ``endpoint`` and ``offline`` left out are ``huggingface_hub``'s: from ``HF_HOME``,
    ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE``. Raises :class:`HubError` naming the cause and the
    fix: an unknown id or revision, a gated or private model without a token, no network,
    nothing cached offline, weights bertserve does not read, a download cut short."""
    from huggingface_hub import constants

    wanted = model_id if isinstance(model_id, ModelId) else ModelId.parse(model_id)
    offline = constants.is_offline_mode() if offline is None else offline
    where = endpoint or constants.ENDPOINT
    try:
        return _fetch(wanted, cache_dir=cache_dir, endpoint=endpoint, offline=offline)
    except HubError:
        raise
    except Exception as exc:  # huggingface_hub's and httpx's errors, told apart in _explain
        explained = _explain(exc, wanted, offline=offline, endpoint=where)
        if explained is None:
            raise
        raise explained from exc


def _fetch(wanted: ModelId, *, cache_dir: str | None, endpoint: str | None, offline: bool) -> HubModel:
    from huggingface_hub import HfApi, snapshot_download

    api = HfApi(endpoint=endpoint)
    revision = api.resolve_revision(
        wanted.repo_id, revision=wanted.revision, cache_dir=cache_dir, local_files_only=offline
    )

    def download(paths: list[str]) -> str:
        return str(
            snapshot_download(
                wanted.repo_id,
                revision=revision,
                cache_dir=cache_dir,
                endpoint=endpoint,
                local_files_only=offline,
                allow_patterns=[glob.escape(path) for path in paths],
            )
        )

    cached = _cached(wanted.repo_id, revision, cache_dir)
    if cached is None or not _holds(cached[1], metadata_files(cached[0])):
        directory = download(list(METADATA))
        cached = _listing(wanted.repo_id, revision, cache_dir, directory), directory
    listing, directory = cached
    needed = needed_files(listing, directory, str(wanted))
    if not _holds(directory, needed):
        directory = download(needed)
    missing = [path for path in needed if not _holds(directory, [path])]
    if missing:
        raise HubError(_incomplete(wanted, revision.resolved, missing, offline=offline))
    logger.debug("%s is commit %s, in %s", wanted, revision.resolved, directory)
    return HubModel(directory, wanted.repo_id, str(revision), revision.resolved)


def _cached(repo_id: str, revision: Any, cache_dir: str | None) -> tuple[list[str], str] | None:
    """The repository's files at ``revision`` and its snapshot folder, from the cache alone (no
    request); ``None`` when the cache holds neither."""
    from huggingface_hub import try_to_load_from_cache

    listing = _tree(repo_id, revision, cache_dir)
    for path in listing or ():
        found = try_to_load_from_cache(repo_id, path, revision=revision.resolved, cache_dir=cache_dir)
        if isinstance(found, str):
            return listing or [], found[: -len(path)].rstrip("/" + os.sep)
    return None


def _tree(repo_id: str, revision: Any, cache_dir: str | None) -> list[str] | None:
    """The listing of the repository's files that ``huggingface_hub`` keeps of each commit it
    downloaded from, if it does."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        return [entry.path for entry in get_cached_repo_tree(repo_id, revision=revision, cache_dir=cache_dir)]
    except CachedRepoTreeNotFoundError:
        return None


def _listing(repo_id: str, revision: Any, cache_dir: str | None, directory: str) -> list[str]:
    """The repository's files at ``revision``: the listing cached by the download just made,
    else what the snapshot folder holds (a cache written by an older ``huggingface_hub``, read
    offline)."""
    listing = _tree(repo_id, revision, cache_dir)
    if listing is not None:
        return listing
    found = []
    for root, _, files in os.walk(directory):
        found += [os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/") for name in files]
    return found


def _holds(directory: str, paths: list[str]) -> bool:
    """Whether every one of ``paths`` is a file in ``directory`` (a file ``huggingface_hub``
    put there is whole: it renames a download into place only once complete)."""
    return all(os.path.isfile(os.path.join(directory, *path.split("/"))) for path in paths)


def _incomplete(wanted: ModelId, commit: str, missing: list[str], *, offline: bool) -> str:
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    if offline:
        return (
            f"the Hub cache holds {wanted} (commit {commit}) without {shown}, and HF_HUB_OFFLINE is set: run once "
            f"with the network to complete it, or {OFFLINE_RECIPE.format(repo=wanted.repo_id)}"
        )
    return f"the download of {wanted} (commit {commit}) left out {shown}; nothing partial is served: start again"


# -- what went wrong, and what to do ---------------------------------------------------------


def _explain(exc: Exception, wanted: ModelId, *, offline: bool, endpoint: str) -> HubError | None:
    """A :class:`HubError` saying what ``exc`` means for ``wanted`` and what to do; ``None``
    for an error that is not the Hub's (a bug, which is better raised as it is)."""
    for explain in (_explain_answer, _explain_unreachable, _explain_transfer):
        message = explain(exc, wanted, offline, endpoint)
        if message is not None:
            return HubError(message)
    return None


def _explain_answer(exc: Exception, wanted: ModelId, offline: bool, endpoint: str) -> str | None:
    """The Hub answered, and said no."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, token = wanted.repo_id, "set HF_TOKEN to a token of an account that may read it, or run `hf auth login`"
    if isinstance(exc, GatedRepoError):
        refused = f"{repo} is a gated model, and the Hub refused it ({_status(exc)})"
        return f"{refused}: accept its terms on its page, then {token}"
    if isinstance(exc, RevisionNotFoundError):
        return (
            f"{repo} has no revision {wanted.revision!r} on the Hub: name a branch, tag or commit it has (its "
            f"'Files and versions' page lists them), or leave @{wanted.revision} out for the default branch"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"the Hub ({endpoint}) has no model {repo} that this token may read ({_status(exc)}): check the id "
            f"(ORG/NAME, as on its page); if it is private or gated, {token}"
        )
    if isinstance(exc, RemoteEntryNotFoundError):
        return (
            f"the Hub lists {exc.response.url.path.rsplit('/', 1)[-1]} in {wanted} but does not serve it (404); "
            "try again later, or pick another revision"
        )
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code
        if status in (401, 403):
            return f"the Hub refused {repo} ({status}): {token}"
        return f"the Hub ({endpoint}) answered {status} for {wanted}: try again later"
    return None


def _explain_unreachable(exc: Exception, wanted: ModelId, offline: bool, endpoint: str) -> str | None:
    """The Hub was not asked (offline) or could not be reached, and the cache does not hold the model."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled, RevisionResolutionError

    if not isinstance(exc, (RevisionResolutionError, LocalEntryNotFoundError, OfflineModeIsEnabled)):
        return None
    recipe = OFFLINE_RECIPE.format(repo=wanted.repo_id)
    if offline:
        return (
            f"HF_HUB_OFFLINE is set and the Hub cache holds no whole copy of {wanted}: run bertserve once with the "
            f"network (and without HF_HUB_OFFLINE), or {recipe}"
        )
    cause = _network_cause(exc)
    return (
        f"cannot reach the Hub at {endpoint} ({cause}) and the Hub cache holds no whole copy of {wanted}: check "
        f"the network (a proxy, HF_ENDPOINT), or {recipe}"
    )


def _explain_transfer(exc: Exception, wanted: ModelId, offline: bool, endpoint: str) -> str | None:
    """The connection failed during a request or a download."""
    if _transport_error(exc):
        return (
            f"cannot reach the Hub at {endpoint} ({exc.__class__.__name__}: {exc}) to download {wanted}: check "
            f"the network (a proxy, HF_ENDPOINT) and start again, or {OFFLINE_RECIPE.format(repo=wanted.repo_id)}"
        )
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):  # a body cut short
        return (
            f"the download of {wanted} from {endpoint} was cut short (the file came smaller than the Hub said); "
            "nothing partial is kept or served: start again"
        )
    return None


def _transport_error(exc: Exception) -> bool:
    """Whether ``exc`` is a failed connection of the HTTP library huggingface_hub uses: httpx2
    from its 2.0, httpx before (a library never imported raised nothing)."""
    for name in ("httpx2", "httpx"):
        library = sys.modules.get(name)
        if library is not None and isinstance(exc, library.TransportError):
            return True
    return False


def _network_cause(exc: BaseException) -> str:
    """The first cause in ``exc``'s chain that says why the Hub was out of reach."""
    seen: BaseException | None = exc
    while seen is not None:
        if seen.__class__.__module__.startswith("httpx"):
            return f"{seen.__class__.__name__}: {seen}"
        seen = seen.__cause__ or seen.__context__
    return "no answer"


def _status(exc: Exception) -> str:
    return str(getattr(getattr(exc, "response", None), "status_code", "refused"))
