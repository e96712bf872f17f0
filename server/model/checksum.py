"""sha256 of a model directory: whether two machines hold the same model, and whether a
copy is whole (its manifest, ``bertserve.sha256``, written by ``bertserve manifest``).

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


def write_manifest(directory: str) -> tuple[str, int]:
    """Write ``directory/bertserve.sha256``: one ``<sha256>  <path>`` line per model file, the
    format ``sha256sum -c`` reads. Returns its path and the number of files it lists."""
    lines = [
        f"{file_sha256(os.path.join(directory, rel))}  {rel.replace(os.sep, '/')}\n" for rel in model_files(directory)
    ]
    if not lines:
        raise FileNotFoundError(f"{directory} holds no files to list")
    path = os.path.join(directory, MANIFEST)
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        f.writelines(lines)
    os.replace(partial, path)  # a reader never sees half a manifest
    return path, len(lines)


def read_manifest(directory: str) -> dict[str, str]:
    """``{path: sha256}`` from ``directory/bertserve.sha256``; raises ``ValueError`` if a line
    is not ``<64 hex digits>  <path>``."""
    with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
        return parse_manifest(f.read())


def parse_manifest(text: str) -> dict[str, str]:
    """``{path: sha256}`` from a manifest's text; raises ``ValueError`` if a line is not
    ``<64 hex digits>  <path>``, or names a path twice."""
    digests: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or not rel or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"{MANIFEST} line {number} is not '<sha256>  <path>'")
        if rel in digests:
            raise ValueError(f"{MANIFEST} line {number} names {rel} a second time")
        digests[rel] = digest
    return digests


def manifest_problems(directory: str) -> list[str]:
    """What does not match ``directory``'s manifest: files missing, changed or not listed.
    Empty when every file is listed with its digest. Raises ``FileNotFoundError`` without one."""
    try:
        listed = read_manifest(directory)
    except ValueError as exc:
        return [str(exc)]
    present = {rel.replace(os.sep, "/") for rel in model_files(directory)}
    problems = [f"{rel} is listed but missing" for rel in sorted(set(listed) - present)]
    problems += [f"{rel} is not listed" for rel in sorted(present - set(listed))]
    for rel in sorted(present & set(listed)):
        if file_sha256(os.path.join(directory, *rel.split("/"))) != listed[rel]:
            problems.append(f"{rel} does not match its sha256")
    return problems
