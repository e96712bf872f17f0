"""The local cache of models synced from object storage (:mod:`.store`): where it is, the
folder of each URL, and the file moves that keep every version in it whole: a version is
renamed into place once checked, and renamed aside before it is removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import time

from .checksum import MANIFEST
from .store_files import StoreUrl


def default_cache() -> str:
    """``BERTSERVE_MODEL_CACHE``, else ``models`` in the user's cache directory."""
    env = os.environ.get("BERTSERVE_MODEL_CACHE")
    if env:
        return env
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("bertserve"), "models")


def cache_name(url: StoreUrl) -> str:
    """The cache's folder for ``url``: readable, and unique by a digest of the whole URL."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{url.scheme}-{url.path}").strip("-.")[:80]
    return f"{readable}-{hashlib.sha256(url.url.encode()).hexdigest()[:12]}"


def check_path(rel: str) -> None:
    """A manifest's path must be a plain relative path of visible names: nothing outside the
    version, nothing the checksum leaves out."""
    parts = rel.split("/")
    if rel.startswith("/") or "\\" in rel or any(part in ("", ".", "..") or part.startswith(".") for part in parts):
        raise ValueError(f"{rel!r} is not a plain relative path inside the model")
    if rel == MANIFEST or any(ord(c) < 32 for c in rel):
        raise ValueError(f"{rel!r} cannot be a model file")


def manifest_text(directory: str) -> str | None:
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def remove_unlisted(staging: str, listed: dict[str, str]) -> None:
    wanted = {os.path.join(staging, *rel.split("/")) for rel in listed}
    for root, _, files in os.walk(staging):
        for name in files:
            path = os.path.join(root, name)
            if path not in wanted:
                os.remove(path)


def link_or_copy(source: str, dest: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(dest)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def remove_tree(path: str, root: str) -> None:
    """Remove ``path``, first renamed aside so that no reader sees it half removed."""
    aside = os.path.join(root, ".partial", f"removing-{os.path.basename(path)}-{time.monotonic_ns()}")
    os.makedirs(os.path.dirname(aside), exist_ok=True)
    os.replace(path, aside)
    shutil.rmtree(aside, ignore_errors=True)
