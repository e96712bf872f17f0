"""Which files of a Hugging Face Hub repository a model needs, chosen from the repository's
listing: bertserve downloads those and nothing else.

A model needs its config, its weights as ``model.safetensors`` (or a sharded
``model.safetensors.index.json`` and the shards it names) or as a Google TensorFlow checkpoint,
its tokenizer (``tokenizer.json``; the vocabulary and SentencePiece files only without it),
and its sentence-transformers files: ``modules.json`` and the folder of each module it names
(``1_Pooling``, ``2_Dense``, ``3_Normalize``). Weights that would be unpickled
(``pytorch_model.bin``, ``*.pt``) are never chosen: a repository that has no others is refused
with the way to convert them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection

from ..errors import HubError

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TOKENIZER_JSON = "tokenizer.json"
MODULES = "modules.json"

METADATA = (
    "config.json",
    SAFETENSORS_INDEX,
    TOKENIZER_JSON,
    "tokenizer_config.json",
    "special_tokens_map.json",
    MODULES,
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)
"""The small files read first: what they say (the shards, the modules) chooses the rest."""

_VOCABULARIES = ("vocab.txt", "vocab.json", "merges.txt", "added_tokens.json")
_SENTENCEPIECE = re.compile(r"[^/]*\.model")  # spiece.model, sentencepiece.bpe.model
_GOOGLE_CONFIG = "bert_config.json"
_GOOGLE_INDEX = re.compile(r"([^/]*\.ckpt)\.index")
_PICKLES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")  # never downloaded, never read
_PYTORCH = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_OTHER_FORMATS = ("tf_model.h5", "model.onnx", "onnx/model.onnx", "flax_model.msgpack", "openvino/openvino_model.xml")

CONVERT_COMMAND = (
    'python -c "import torch; from safetensors.torch import save_file; '
    "sd = torch.load('pytorch_model.bin', map_location='cpu'); "
    "save_file({k: v.contiguous() for k, v in sd.items()}, 'model.safetensors')\""
)
"""Turns ``pytorch_model.bin`` into ``model.safetensors``, where PyTorch is installed."""


def metadata_files(listing: Collection[str]) -> list[str]:
    """The files of :data:`METADATA` the repository has."""
    return [name for name in METADATA if name in listing]


def needed_files(listing: Collection[str], directory: str, name: str) -> list[str]:
    """The files of the repository ``name`` (its ``listing``, relative ``/`` paths) the model
    needs, in a stable order; ``directory`` holds the :data:`METADATA` files already, whose
    content chooses the shards and modules. Raises :class:`HubError` for a repository whose
    weights bertserve cannot read, or that lacks a file the model needs."""
    files = set(listing)
    weights = _weights(files, directory, name)
    google = _GOOGLE_CONFIG in weights
    if "config.json" not in files and not google:
        raise HubError(f"{name} has no config.json: it is not a Hugging Face model repository bertserve can serve")
    chosen = [*metadata_files(files), *weights]
    if TOKENIZER_JSON not in files or google:
        chosen += [path for path in sorted(files) if path in _VOCABULARIES or _SENTENCEPIECE.fullmatch(path)]
        if not any(path in files for path in (TOKENIZER_JSON, "vocab.txt")):
            raise HubError(
                f"{name} has neither {TOKENIZER_JSON} nor vocab.txt: bertserve needs the model's tokenizer "
                "in one of them; pick a revision that has it, or add it to a local copy served with --model-dir"
            )
    chosen += _module_files(files, directory, name)
    return list(dict.fromkeys(chosen))


def _weights(files: set[str], directory: str, name: str) -> list[str]:
    if SAFETENSORS in files:
        return [SAFETENSORS]
    if SAFETENSORS_INDEX in files:
        return [SAFETENSORS_INDEX, *_shards(os.path.join(directory, SAFETENSORS_INDEX), files, name)]
    checkpoints = sorted(match.group(1) for path in files if (match := _GOOGLE_INDEX.fullmatch(path)))
    if checkpoints and _GOOGLE_CONFIG in files:
        prefix = "bert_model.ckpt" if "bert_model.ckpt" in checkpoints else checkpoints[0]
        data = sorted(path for path in files if path.startswith(f"{prefix}.data-"))
        return [_GOOGLE_CONFIG, f"{prefix}.index", *data]
    raise _no_weights(files, name)


def _shards(index_path: str, files: set[str], name: str) -> list[str]:
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        shards = sorted({str(shard) for shard in weight_map.values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HubError(f"{name}: {SAFETENSORS_INDEX} cannot be read ({exc}); pick another revision") from exc
    missing = [shard for shard in shards if shard not in files]
    if missing:
        raise HubError(
            f"{name}: {SAFETENSORS_INDEX} names {', '.join(missing)}, which the repository does not have; "
            "pick a revision whose shards are all there"
        )
    return shards


def _no_weights(files: set[str], name: str) -> HubError:
    if files & set(_PYTORCH):
        return HubError(
            f"{name} has only PyTorch weights (pytorch_model.bin), and bertserve does not unpickle files from the "
            f"network: it reads {SAFETENSORS}. Look for a revision with {SAFETENSORS} (the Hub's safetensors "
            "conversion often waits as a pull request: @refs/pr/N), or convert them once where PyTorch is "
            f"installed: `hf download {name} --local-dir DIR`, then in DIR {CONVERT_COMMAND}, and serve DIR "
            "with --model-dir"
        )
    others = [path for path in _OTHER_FORMATS if path in files]
    if others:
        return HubError(
            f"{name} has its weights only as {', '.join(others)}, which bertserve does not read: it reads "
            f"{SAFETENSORS} or a TensorFlow checkpoint (bert_model.ckpt). Save the model with safetensors where "
            "transformers is installed (from_pretrained, then save_pretrained(DIR)), and serve DIR with --model-dir"
        )
    return HubError(
        f"{name} has no weights bertserve reads: expected {SAFETENSORS}, {SAFETENSORS_INDEX} with its shards, or "
        f"a TensorFlow checkpoint ({_GOOGLE_CONFIG} with bert_model.ckpt.index); is it a model repository?"
    )


def _module_files(files: set[str], directory: str, name: str) -> list[str]:
    """The files of each sentence-transformers module folder ``modules.json`` names (or
    ``1_Pooling`` without it), pickles left out: a module whose weights are only a pickle
    (an older ``2_Dense/pytorch_model.bin``) is refused, with how to convert it."""
    folders = ["1_Pooling"]
    path = os.path.join(directory, MODULES)
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                modules = json.load(f)
            folders = [str(module.get("path", "")).strip("/") for module in modules if isinstance(module, dict)]
        except (OSError, ValueError) as exc:
            raise HubError(f"{MODULES} of the model cannot be read ({exc}); pick another revision") from exc
    chosen = []
    for folder in filter(None, folders):
        inside = sorted(p for p in files if p.startswith(folder + "/") and not p.endswith(_PICKLES))
        pickled = f"{folder}/pytorch_model.bin"
        if pickled in files and f"{folder}/{SAFETENSORS}" not in files:
            raise HubError(
                f"{name}: its {folder} module has its weights only as pytorch_model.bin, and bertserve does not "
                f"unpickle files from the network. Convert it once where PyTorch is installed: `hf download {name} "
                f"--local-dir DIR`, then in DIR/{folder} {CONVERT_COMMAND}, and serve DIR with --model-dir"
            )
        chosen += inside
    return chosen
