"""Checking a model directory: its layout, config, vocabulary, defaults and weight files.

The config says the encoder's family (:mod:`.families`). Two layouts are recognised:

* Google's checkpoint layout (BERT only): ``bert_config.json``, ``vocab.txt`` and
  ``bert_model.ckpt.{index,data-*}`` with TF1 variable names, optionally overridden by a
  fine-tuned checkpoint in ``tuned_model_dir``.
* The Hugging Face / sentence-transformers layout: ``config.json``, ``model.safetensors``
  (or a sharded ``model.safetensors.index.json``), ``vocab.txt`` and/or ``tokenizer.json``,
  and the sentence-transformers files that give the model's own pooling, Dense and Normalize
  modules (:mod:`.st_modules`).

The weights themselves are read by :mod:`.weights`, only when a graph is built.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from ..config.model import ModelConfig
from ..errors import ModelFileError, ModelShapeError
from .default import hub_name_hint
from .families import EncoderConfig
from .json_file import read_json
from .st_modules import (
    ModelDefaults,
    inside_model_dir,
    max_seq_length,
    pooling_config,
    read_modules,
    sentence_transformers_defaults,
)
from .static import is_static_model
from .tasks import TaskHead, read_task

__all__ = ["EncoderConfig", "ModelDefaults", "ModelFiles", "inspect_model", "pooling_config", "read_json"]

HF_CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TOKENIZER_JSON = "tokenizer.json"
VOCAB = "vocab.txt"


@dataclass
class ModelFiles:
    """A checked model directory: its config, tokenizer files and where its weights are.

    The weights themselves are read by :func:`.weights.read_weights`, only when a graph is built.
    """

    layout: str  # "google" or "huggingface"
    config: EncoderConfig
    vocab_path: str | None
    tokenizer_json: str | None
    do_lower_case: bool
    defaults: ModelDefaults
    weight_sources: list[tuple[str, str]]  # ("checkpoint", prefix) or ("safetensors", path)
    tuned_sources: list[tuple[str, str]] = field(default_factory=list)  # override weight_sources
    files: list[str] = field(default_factory=list)  # every file whose content shapes the graph
    head: TaskHead = field(default_factory=TaskHead)  # the model's task (.tasks): embed, rerank, classify, sparse


def detect_layout(model_dir: str, config_name: str = "bert_config.json") -> str:
    """Tell which layout ``model_dir`` uses, or say why it is not a model directory."""
    if not os.path.isdir(model_dir):
        hint = hub_name_hint(model_dir)
        raise ModelFileError(f"model directory {model_dir!r} does not exist or is not a directory{hint}")
    names = set(os.listdir(model_dir))
    if HF_CONFIG in names and names & {SAFETENSORS, SAFETENSORS_INDEX}:
        return "huggingface"
    if config_name in names or any(n.endswith(".index") for n in names):
        return "google"
    if names & {"pytorch_model.bin", "pytorch_model.bin.index.json"}:
        raise ModelFileError(
            f"{model_dir} has only PyTorch weights (pytorch_model.bin), and bertserve reads "
            "safetensors. Convert them once, where PyTorch is installed, with: python -c "
            '"import torch; from safetensors.torch import save_file; '
            "sd = torch.load('pytorch_model.bin', map_location='cpu'); "
            "save_file({k: v.contiguous() for k, v in sd.items()}, 'model.safetensors')\""
        )
    if HF_CONFIG in names:
        raise ModelFileError(f"{model_dir} has {HF_CONFIG} but no {SAFETENSORS}")
    raise ModelFileError(
        f"{model_dir} is not a model directory: expected {config_name} with a "
        f"checkpoint, or {HF_CONFIG} with {SAFETENSORS}"
    )


def inspect_model(options: ModelConfig) -> ModelFiles:
    """Find and check the config and vocabulary that ``options`` point at (weights not read)."""
    config_name, ckpt_name = options.config_name, options.ckpt_name
    if options.tuned_model_dir is not None:
        # As in bert-as-service, ckpt_name and config_name name the fine-tuned files; the
        # base directory keeps Google's names unless it has only the given ones.
        config_name = _first_present(options.model_dir, [_GOOGLE_CONFIG, config_name])
        ckpt_name = _first_present(options.model_dir, [_GOOGLE_CKPT, ckpt_name], suffix=".index")
    if is_static_model(options.model_dir):
        raise ModelFileError(
            f"{options.model_dir} holds a static model (model2vec), which runs no BERT graph: serve it with "
            "`bertserve start --model-dir`, or encode with StaticEncoder (bertserve.server.model.static)"
        )
    layout = detect_layout(options.model_dir, config_name)
    if layout == "google":
        model = _inspect_google(options.model_dir, config_name, ckpt_name, options.vocab_name or VOCAB)
    else:
        model = _inspect_huggingface(options.model_dir)
        model.head = read_task(options.model_dir, model.config.family, options.task)
        if model.head.task != "embed" and not read_modules(options.model_dir):  # a cross-encoder's own length
            length, length_files = max_seq_length(options.model_dir, model.config)
            model.defaults = dataclasses.replace(model.defaults, max_seq_len=length)
            model.files += length_files
    if layout == "google" and options.task not in (None, "embed"):
        raise ModelFileError(
            f"task={options.task} needs a Hugging Face model directory (config.json with its architecture); "
            f"{options.model_dir} is a Google BERT checkpoint, an encoder only"
        )
    if options.vocab_name is not None and layout == "huggingface":
        # A vocabulary named by the user wins over the directory's tokenizer.json.
        model.vocab_path = _require(options.model_dir, options.vocab_name)
        model.tokenizer_json = None
        model.files.append(model.vocab_path)
    if options.tuned_model_dir is not None:
        _apply_tuned(model, options.tuned_model_dir, options)
    if options.do_lower_case is not None:
        model.do_lower_case = options.do_lower_case
    _check_vocab(model)
    return model


def _inspect_google(model_dir: str, config_name: str, ckpt_name: str, vocab_name: str) -> ModelFiles:
    config_path = _require(model_dir, config_name)
    vocab_path = _require(model_dir, vocab_name)
    prefix = _checkpoint_prefix(model_dir, ckpt_name)
    config = EncoderConfig.from_json(config_path)
    do_lower_case = _guess_lower_case(vocab_path)
    files = [config_path, vocab_path, *_checkpoint_files(prefix)]
    sources = [("checkpoint", prefix)]
    return ModelFiles(
        layout="google",
        config=config,
        vocab_path=vocab_path,
        tokenizer_json=None,
        do_lower_case=do_lower_case,
        defaults=ModelDefaults(),
        weight_sources=sources,
        files=files,
    )


def _inspect_huggingface(model_dir: str) -> ModelFiles:
    config_path = _require(model_dir, HF_CONFIG)
    config = EncoderConfig.from_json(config_path)
    weight_files = _safetensors_files(model_dir)
    tokenizer_json = os.path.join(model_dir, TOKENIZER_JSON)
    vocab_path = os.path.join(model_dir, VOCAB)
    has_tokenizer = os.path.isfile(tokenizer_json)
    has_vocab = os.path.isfile(vocab_path)
    if not (has_tokenizer or has_vocab):
        raise ModelFileError(f"{model_dir} has neither {TOKENIZER_JSON} nor {VOCAB}")
    files = [config_path, *weight_files]
    tokenizer_config = os.path.join(model_dir, "tokenizer_config.json")
    declared = read_json(tokenizer_config).get("do_lower_case") if os.path.isfile(tokenizer_config) else None
    own = _normalizer_lowercases(tokenizer_json) if has_tokenizer else None
    if isinstance(declared, bool):
        do_lower_case = declared
    elif own is not None:  # the tokenizer's own normalizer, as a copy with only tokenizer.json has it
        do_lower_case = own
    elif has_vocab:
        do_lower_case = _guess_lower_case(vocab_path)
    else:
        do_lower_case = True
    files += [p for p in (tokenizer_json, vocab_path, tokenizer_config) if os.path.isfile(p)]
    defaults, st_files = sentence_transformers_defaults(model_dir, config)
    return ModelFiles(
        layout="huggingface",
        config=config,
        vocab_path=vocab_path if has_vocab else None,
        tokenizer_json=tokenizer_json if has_tokenizer else None,
        do_lower_case=do_lower_case,
        defaults=defaults,
        weight_sources=[("safetensors", path) for path in weight_files],
        files=files + st_files,
    )


def _apply_tuned(model: ModelFiles, tuned_dir: str, options: ModelConfig) -> None:
    """Let a fine-tuned checkpoint override the weights (and the config, when it has one)."""
    if detect_layout(tuned_dir, options.config_name) == "google":
        config_path = os.path.join(tuned_dir, options.config_name)
        prefix = _checkpoint_prefix(tuned_dir, options.ckpt_name)
        model.tuned_sources.append(("checkpoint", prefix))
        model.files += _checkpoint_files(prefix)
    else:
        config_path = os.path.join(tuned_dir, HF_CONFIG)
        weight_files = _safetensors_files(tuned_dir)
        model.tuned_sources += [("safetensors", path) for path in weight_files]
        model.files += weight_files
    if os.path.isfile(config_path):
        model.config = EncoderConfig.from_json(config_path)
        model.files.append(config_path)


# -- files -------------------------------------------------------------------------------

_GOOGLE_CONFIG = "bert_config.json"
_GOOGLE_CKPT = "bert_model.ckpt"


def _first_present(directory: str, names: list[str], suffix: str = "") -> str:
    for name in names:
        if os.path.isfile(os.path.join(directory, name + suffix)):
            return name
    return names[0]


def _require(directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise ModelFileError(f"missing file {path}")
    if not os.access(path, os.R_OK):
        raise ModelFileError(f"cannot read {path}")
    return path


def _checkpoint_prefix(directory: str, ckpt_name: str) -> str:
    prefix = os.path.join(directory, ckpt_name)
    if not os.path.isfile(prefix + ".index"):
        raise ModelFileError(f"missing checkpoint {prefix}.index (set ckpt_name to its prefix)")
    return prefix


def _checkpoint_files(prefix: str) -> list[str]:
    directory, base = os.path.split(prefix)
    return sorted(
        os.path.join(directory, n)
        for n in os.listdir(directory)
        if n == base + ".index" or n.startswith(base + ".data-")
    )


def _safetensors_files(directory: str) -> list[str]:
    index = os.path.join(directory, SAFETENSORS_INDEX)
    if os.path.isfile(index):
        weight_map = read_json(index).get("weight_map", {})
        names = sorted({str(name) for name in weight_map.values()})
        for name in names:  # the index names them: each must be a file of the directory
            inside_model_dir(directory, os.path.join(directory, name), f"{index}: the shard {name[:200]!r}")
        return [_require(directory, name) for name in names]
    return [_require(directory, SAFETENSORS)]


def _normalizer_lowercases(tokenizer_json: str) -> bool | None:
    """Whether ``tokenizer_json``'s own BERT normalizer lowercases; None for another normalizer
    (which ``do_lower_case`` does not change) or a file that cannot say."""
    try:
        normalizer = read_json(tokenizer_json).get("normalizer")
    except ModelFileError:
        return None  # the tokenizer reports its own file's faults
    if isinstance(normalizer, dict) and normalizer.get("type") == "BertNormalizer":
        lowercase = normalizer.get("lowercase")
        return lowercase if isinstance(lowercase, bool) else None
    return None


def _guess_lower_case(vocab_path: str) -> bool:
    """An uncased vocabulary has (next to) no capitalised word pieces; a cased one has many."""
    capitalised = 0
    try:
        with open(vocab_path, encoding="utf-8") as f:
            for line in f:
                token = line.rstrip("\n")
                if token[:1].isupper() and not token.startswith("["):
                    capitalised += 1
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"cannot read {vocab_path}: {exc}") from exc
    return capitalised < 50


def _count_vocab(vocab_path: str) -> int:
    with open(vocab_path, encoding="utf-8") as f:
        return sum(1 for _ in f)


# -- checks ------------------------------------------------------------------------------


def _check_vocab(model: ModelFiles) -> None:
    if model.vocab_path is not None:
        size = _count_vocab(model.vocab_path)
        if size > model.config.vocab_size:
            raise ModelShapeError(
                f"{model.vocab_path} has {size} tokens but the model embeds only vocab_size={model.config.vocab_size}"
            )
