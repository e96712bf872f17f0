"""A model repository: numbered versions of one model in a base directory, each checked before use.

``--model-dir`` may name a base directory whose subdirectories ``1/``, ``2/``, ... are each
a model directory as usual (a plain model directory keeps working as before). A version is
served only if it is whole:

- with a manifest (``bertserve.sha256``, written by ``bertserve manifest``), every file must
  match it, and no file may be missing or unlisted;
- without one, it is refused when ``require_manifest`` is on;
- a version in which a file changed in the last ``settle_s`` seconds is still being copied,
  and is refused until it settles;
- and its model files must be readable as a model (the weights' shapes, the vocabulary).

:func:`choose` picks the version to serve at start, ``latest`` (the highest number that
passes, saying why each higher one was refused) or a given number. While serving, a
:class:`Checker` looks again (``--poll-interval-s``, ``bertserve reload``), remembering what it
found of each version until that version's files change, so a refused version is not hashed
again at every look.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ..config.model import ModelConfig
from ..errors import ModelError
from .checksum import MANIFEST, manifest_problems, model_files


@dataclass(frozen=True)
class Version:
    number: int
    path: str


@dataclass(frozen=True)
class Refusal:
    version: Version
    reason: str

    @property
    def settling(self) -> bool:
        """Refused only for now: its files are still changing."""
        return self.reason.startswith(_WRITING)


_WRITING = "it is still being written"


def versions(base: str) -> list[Version]:
    """The numbered subdirectories of ``base``, lowest first."""
    found = []
    for name in os.listdir(base):
        path = os.path.join(base, name)
        if name.isdigit() and os.path.isdir(path):
            found.append(Version(int(name), path))
    return sorted(found, key=lambda version: version.number)


def is_repository(path: str) -> bool:
    """Whether ``path`` is a base directory of numbered versions rather than a model directory."""
    if not os.path.isdir(path):
        return False
    names = set(os.listdir(path))
    if names & {"config.json", "bert_config.json", "vocab.txt", "tokenizer.json"}:
        return False
    return bool(versions(path))


def problem(
    version: Version, options: ModelConfig, *, require_manifest: bool, settle_s: float, now: float | None = None
) -> str | None:
    """Why ``version`` cannot be served (whole, settled, readable), or ``None`` if it can."""
    now = time.time() if now is None else now
    newest = max((os.path.getmtime(os.path.join(version.path, rel)) for rel in model_files(version.path)), default=0.0)
    if now - newest < settle_s:
        return f"{_WRITING} (a file changed {max(0.0, now - newest):.1f} s ago)"
    if os.path.exists(os.path.join(version.path, MANIFEST)):
        problems = manifest_problems(version.path)
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            return f"its files do not match its {MANIFEST}: {'; '.join(problems[:3])}{more}"
    elif require_manifest:
        return f"it has no {MANIFEST} (write one with `bertserve manifest DIR`) and --require-manifest is on"
    from .model_dir import inspect_model

    try:
        inspect_model(options.replace(model_dir=version.path))
    except (ModelError, OSError, ValueError) as exc:
        return f"its model cannot be read: {exc}"
    return None


def choose(
    base: str, wanted: str | int, options: ModelConfig, *, require_manifest: bool = False, settle_s: float = 2.0
) -> tuple[Version, list[Refusal]]:
    """The version of ``base`` to serve, and the versions refused on the way (newest first).
    ``wanted`` is ``"latest"`` or a version number; raises :class:`ModelError` when no
    version (or not the one wanted) can be served, naming why. A version refused only because
    its files changed just now (a copy that just ended, say) is looked at again once it has
    had ``settle_s`` to settle."""
    if not versions(base):
        raise ModelError(f"{base} holds no numbered version directory (1/, 2/, ...)")
    checker = Checker(base, options, require_manifest=require_manifest, settle_s=settle_s)
    latest = str(wanted).lower() == "latest"
    version, refused = checker.find(str(wanted).lower(), 0)
    if version is None and not latest:
        raise ModelError(f"version {wanted} in {base} is refused: {refused[0].reason}")
    if version is None:
        details = "; ".join(f"{r.version.number}: {r.reason}" for r in refused)
        raise ModelError(f"no version in {base} can be served ({details})")
    return version, refused if latest else []


def signature(version: Version) -> tuple[tuple[str, int, int], ...]:
    """What changes when any model file of ``version`` is written: each file's name, size and
    modification time."""
    found = []
    for rel in model_files(version.path):
        try:
            stat = os.stat(os.path.join(version.path, rel))
        except OSError:  # removed meanwhile
            continue
        found.append((rel, stat.st_size, stat.st_mtime_ns))
    return tuple(found)


class Checker:
    """Checks the versions of ``base`` while a server runs, as :func:`choose` does at start;
    a verdict on a version is remembered until its files change (except "still being
    written", which is looked at again every time)."""

    def __init__(self, base: str, options: ModelConfig, *, require_manifest: bool, settle_s: float = 2.0) -> None:
        self.base = base
        self.options = options
        self.require_manifest = require_manifest
        self.settle_s = settle_s
        self._known: dict[int, tuple[tuple[tuple[str, int, int], ...], str | None]] = {}

    def problem(self, version: Version) -> str | None:
        """Why ``version`` cannot be served, or ``None``."""
        files = signature(version)
        known = self._known.get(version.number)
        if known is not None and known[0] == files:
            return known[1]
        reason = problem(version, self.options, require_manifest=self.require_manifest, settle_s=self.settle_s)
        if reason is None or not reason.startswith(_WRITING):
            self._known[version.number] = (files, reason)
        return reason

    def refuse(self, version: Version, reason: str) -> None:
        """Remember that ``version`` cannot be served (it failed to load, say) until its files change."""
        self._known[version.number] = (signature(version), reason)

    def newer(self, current: int) -> tuple[Version | None, list[Refusal]]:
        """The newest whole version above ``current``, if any, and the ones refused above it."""
        refused: list[Refusal] = []
        for version in reversed(versions(self.base)):
            if version.number <= current:
                break
            reason = self.problem(version)
            if reason is None:
                return version, refused
            refused.append(Refusal(version, reason))
        return None, refused

    def find(self, wanted: str, current: int) -> tuple[Version | None, list[Refusal]]:
        """``wanted`` ("latest": the newest whole version above ``current``; else a number)
        and the versions refused on the way. A version refused only because its files changed
        just now is looked at again once it has had ``settle_s`` to settle."""
        version, refused = self.newer(current) if wanted == "latest" else self.get(int(wanted))
        if any(refusal.settling for refusal in refused):
            time.sleep(self.settle_s)
            version, refused = self.newer(current) if wanted == "latest" else self.get(int(wanted))
        return version, refused

    def get(self, number: int) -> tuple[Version | None, list[Refusal]]:
        """Version ``number`` if it can be served, else its refusal; raises
        :class:`ModelError` if there is no such version."""
        match = [v for v in versions(self.base) if v.number == number]
        if not match:
            numbers = ", ".join(str(v.number) for v in versions(self.base)) or "none"
            raise ModelError(f"{self.base} has no version {number}; it has {numbers}")
        reason = self.problem(match[0])
        return (match[0], []) if reason is None else (None, [Refusal(match[0], reason)])
