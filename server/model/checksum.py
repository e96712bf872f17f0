"""sha256 of a model directory, so machines can tell whether they hold the same model.

The digest covers every file under the directory (its path relative to the directory, its
size and its bytes), in sorted order. Left out: names that start with a dot (``.git``,
editor and OS litter), ``__pycache__`` and ``*.pyc`` (a model shipped as a Python package
grows them as it is imported), and :data:`MANIFEST`, which records digests itself.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

MANIFEST = "bertserve.sha256"
_BLOCK = 1 << 22


def model_files(directory: str) -> Iterator[str]:
    """The files the digest covers, as sorted paths relative to ``directory``."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for name in files:
            if name.startswith(".") or name.endswith(".pyc") or name == MANIFEST:
                continue
            found.append(os.path.relpath(os.path.join(root, name), directory))
    yield from sorted(found, key=lambda path: path.split(os.sep))


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_sha256(*directories: str | None) -> str:
    """One digest of every model file under ``directories`` (``None`` entries skipped), in
    order: a model directory and its fine-tuned checkpoint directory, say."""
    digest = hashlib.sha256()
    for index, directory in enumerate(directories):
        if directory is None:
            continue
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"model directory {directory} does not exist")
        digest.update(f"[{index}]\0".encode())
        for relative in model_files(directory):
            path = os.path.join(directory, relative)
            digest.update(f"{relative.replace(os.sep, '/')}\0{os.path.getsize(path)}\0".encode())
            digest.update(bytes.fromhex(file_sha256(path)))
    return digest.hexdigest()
