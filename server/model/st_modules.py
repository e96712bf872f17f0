"""The sentence-transformers modules a model directory declares, read as defaults.

``modules.json`` lists the modules in order: the Transformer, a ``Pooling``, then optionally
``Dense`` layers (distiluse-base-multilingual-cased projects 768 to 512 with tanh) and a
``Normalize``. The Pooling config comes in two formats, read alike:

* sentence-transformers 6: ``"pooling_mode": "cls"`` (or a list of modes);
* before it: one boolean per mode, ``"pooling_mode_mean_tokens": true`` and so on.

``sentence_bert_config.json`` gives ``max_seq_length``; sentence-transformers 6 may leave it
out, and then the tokenizer's ``model_max_length`` (capped at the model's positions) is used,
as sentence-transformers does.

A module's ``path``, and every file read from its folder, must name a place inside the model
directory (:func:`inside_model_dir`): ``../..`` or an absolute path is refused before anything
there is read, so no error quotes a file of elsewhere. Links in the directory are its owner's,
and followed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..config.model import PoolingStrategy
from ..errors import ModelError, ModelFileError
from .families import EncoderConfig
from .json_file import read_json


@dataclass(frozen=True)
class DenseModule:
    """A sentence-transformers ``Dense`` layer: ``activation(W x + b)`` on the sentence vector."""

    path: str  # its weight file (safetensors)
    in_features: int
    out_features: int
    bias: bool
    activation: str  # identity, tanh, relu, sigmoid


@dataclass(frozen=True)
class ModelDefaults:
    """What the model directory asks for when the user does not say."""

    pooling_strategy: PoolingStrategy = PoolingStrategy.REDUCE_MEAN
    pooling_layer: tuple[int, ...] = (-2,)
    max_seq_len: int = 25
    normalize: bool = False
    dense: tuple[DenseModule, ...] = field(default_factory=tuple)


#: sentence-transformers' mode names, old boolean keys and new ``pooling_mode`` values alike
_MODES = {
    "cls": PoolingStrategy.CLS_TOKEN,
    "max": PoolingStrategy.REDUCE_MAX,
    "mean": PoolingStrategy.REDUCE_MEAN,
    "mean_sqrt_len_tokens": PoolingStrategy.REDUCE_MEAN_SQRT_LEN,
    "weightedmean": PoolingStrategy.WEIGHTED_MEAN,
    "lasttoken": PoolingStrategy.SEP_TOKEN,
}
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
}


def read_modules(model_dir: str) -> list[dict]:
    """The entries of ``modules.json``; an empty list when there is none."""
    path = os.path.join(model_dir, "modules.json")
    if not os.path.isfile(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            modules = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"cannot read {path}: {exc}") from exc
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelFileError(f"{path} should hold a list of module objects")
    return modules


def inside_model_dir(model_dir: str, path: str, what: str) -> str:
    """``path``, once it is known to name a place inside ``model_dir``; :class:`ModelFileError`
    naming ``what`` and where it leads otherwise. Only the path is named, never what a file
    holds. The name is what is judged (``..`` and an absolute path count), not where links
    lead: a link in the directory is its owner's, followed as for every file of it (a
    directory of links to a model's files, the Hugging Face cache's links to its blobs)."""
    root, target = os.path.abspath(model_dir), os.path.abspath(path)
    if os.path.commonpath([root, target]) != root:
        raise ModelFileError(
            f"{what} leads outside the model directory {model_dir} (to {target}): bertserve reads the files a "
            "model names only from inside its directory"
        )
    return path


def module_dir(model_dir: str, module: dict, index: int) -> str:
    """The folder of ``modules.json``'s entry ``index``, refused if it leads outside ``model_dir``."""
    declared = str(module.get("path", ""))
    kind = str(module.get("type", "")).rsplit(".", 1)[-1][:40] or "?"
    where = f"{os.path.join(model_dir, 'modules.json')}: module {index} ({kind}) with path {declared[:200]!r}"
    return inside_model_dir(model_dir, os.path.join(model_dir, declared), where)


def _module_file(model_dir: str, folder: str, name: str) -> str:
    """The file ``name`` of a module's ``folder``, refused if it is a link out of ``model_dir``."""
    path = os.path.join(folder, name)
    return inside_model_dir(model_dir, path, path)


def sentence_transformers_defaults(model_dir: str, config: EncoderConfig) -> tuple[ModelDefaults, list[str]]:
    """The defaults a sentence-transformers directory declares, and the files they come from;
    bert-as-service's defaults when it has no ``modules.json``."""
    modules = read_modules(model_dir)
    if not modules:
        return ModelDefaults(), []
    files = [os.path.join(model_dir, "modules.json")]
    strategy = PoolingStrategy.CLS_TOKEN
    normalize = False
    dense: list[DenseModule] = []
    folders = [module_dir(model_dir, module, index) for index, module in enumerate(modules)]
    for module, folder in zip(modules, folders, strict=True):
        kind = str(module.get("type", ""))
        if kind.endswith(".Normalize"):
            normalize = True
        elif kind.endswith(".Pooling"):
            pooling_path = _module_file(model_dir, folder, "config.json")
            if os.path.isfile(pooling_path):
                files.append(pooling_path)
                strategy = pooling_from_config(pooling_path, read_json(pooling_path))
        elif kind.endswith(".Dense"):
            if normalize:
                raise ModelError(f"{model_dir}: a Dense module after Normalize is not supported")
            layer = _dense_module(model_dir, folder)
            dense.append(layer)
            files += [os.path.join(folder, "config.json"), layer.path]
    _check_dense_chain(model_dir, dense)
    max_seq_len, length_files = max_seq_length(model_dir, config)
    defaults = ModelDefaults(strategy, (-1,), max_seq_len, normalize, tuple(dense))
    return defaults, files + length_files


def max_seq_length(model_dir: str, config: EncoderConfig) -> tuple[int, list[str]]:
    """The longest input sentence-transformers gives the model, and the file that says it."""
    st_config = os.path.join(model_dir, "sentence_bert_config.json")
    if os.path.isfile(st_config):
        length = read_json(st_config).get("max_seq_length")
        if isinstance(length, int) and not isinstance(length, bool) and length > 0:
            return min(length, config.max_tokens), [st_config]
    tokenizer_config = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.isfile(tokenizer_config):
        length = read_json(tokenizer_config).get("model_max_length")
        if isinstance(length, int) and not isinstance(length, bool) and length > 0:
            return min(length, config.max_tokens), [tokenizer_config]
    return config.max_tokens, []  # sentence-transformers: the tokenizer's limit, else the positions


def pooling_config(model_dir: str) -> tuple[str, dict] | None:
    """The path and content of a sentence-transformers directory's Pooling config: the one
    ``modules.json`` points at, else ``1_Pooling/config.json``; None when there is neither."""
    candidates = [
        os.path.join(module_dir(model_dir, module, index), "config.json")
        for index, module in enumerate(read_modules(model_dir))
        if str(module.get("type", "")).endswith(".Pooling")
    ]
    candidates.append(os.path.join(model_dir, "1_Pooling", "config.json"))
    for path in candidates:
        if os.path.isfile(inside_model_dir(model_dir, path, path)):
            return path, read_json(path)
    return None


def pooling_from_config(path: str, raw: dict) -> PoolingStrategy:
    """The pooling a Pooling config asks for, in either format."""
    declared = raw.get("pooling_mode")
    if declared is None:
        modes = [mode for key, mode in _LEGACY_KEYS.items() if raw.get(key) is True]
    elif isinstance(declared, str):
        modes = [declared]
    elif isinstance(declared, list) and all(isinstance(m, str) for m in declared):
        modes = list(declared)
    else:
        raise ModelFileError(f"{path}: pooling_mode should be a mode name or a list of them, not {declared!r}")
    unknown = [mode for mode in modes if mode not in _MODES]
    if unknown:
        raise ModelError(f"{path}: pooling mode {unknown[0]!r} is not one of {', '.join(_MODES)}")
    if len(modes) == 1:
        return _MODES[modes[0]]
    if modes == ["mean", "max"]:
        return PoolingStrategy.REDUCE_MEAN_MAX
    if not modes:
        raise ModelError(f"{path} turns on no pooling mode; choose --pooling-strategy")
    raise ModelError(
        f"{path}: the pooling modes {' + '.join(modes)} together are not supported: sentence-transformers "
        "concatenates them in this order, and bertserve concatenates only the mean then the max "
        "(REDUCE_MEAN_MAX); choose one mode with --pooling-strategy"
    )


def _dense_module(model_dir: str, folder: str) -> DenseModule:
    config_path = _module_file(model_dir, folder, "config.json")
    if not os.path.isfile(config_path):
        raise ModelFileError(f"missing file {config_path} (the Dense module's config)")
    raw = read_json(config_path)
    in_features, out_features = raw.get("in_features"), raw.get("out_features")
    if not isinstance(in_features, int) or not isinstance(out_features, int):
        raise ModelFileError(f"{config_path}: in_features and out_features should be integers")
    activation = _ACTIVATIONS.get(str(raw.get("activation_function", "torch.nn.modules.activation.Tanh")))
    if activation is None:
        raise ModelError(
            f"{config_path}: activation_function {raw.get('activation_function')!r} is not supported "
            f"({', '.join(_ACTIVATIONS)})"
        )
    source = raw.get("module_input_name", "sentence_embedding")
    if source != "sentence_embedding":
        raise ModelError(f"{config_path}: a Dense module on {source!r} is not supported (only sentence_embedding)")
    weights = _module_file(model_dir, folder, "model.safetensors")
    if not os.path.isfile(weights):
        if os.path.isfile(os.path.join(folder, "pytorch_model.bin")):
            from .hub_files import CONVERT_COMMAND

            raise ModelFileError(
                f"{folder} has its weights only as pytorch_model.bin, which bertserve does not unpickle; "
                f"convert it once where PyTorch is installed: in {folder}, {CONVERT_COMMAND}"
            )
        raise ModelFileError(f"missing file {weights} (the Dense module's weights)")
    return DenseModule(weights, in_features, out_features, bool(raw.get("bias", True)), activation)


def _check_dense_chain(model_dir: str, dense: list[DenseModule]) -> None:
    width = dense[0].in_features if dense else 0
    for layer in dense:
        if layer.in_features != width:
            raise ModelError(
                f"{model_dir}: a Dense module takes {layer.in_features} features where {width} come in "
                f"(its weights are {layer.path})"
            )
        width = layer.out_features
