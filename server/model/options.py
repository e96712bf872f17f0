"""A model's options, resolved: what the user left out filled from the model's defaults and
checked against the model, the graph's spec, the description servers and clients show, and
the model's tokenizer. Nothing here loads weights or TensorFlow, so the server's head, the
HTTP process and the version swap use it as the workers do.

``dtype`` ``auto`` is resolved here, for the model's ``device`` (:mod:`.hardware`): the graph's
spec, and so the graph cache's key, always holds the concrete dtype, while the resolved config
keeps the dtype asked for, which :func:`describe` reports beside the one chosen and why."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..config.model import DYNAMIC, ModelConfig, PoolingStrategy
from ..errors import ModelError
from . import chunking, hardware
from .chunking import check_chunkable
from .graph import GraphSpec
from .model_dir import ModelFiles, inspect_model
from .pooling import pooled_width
from .static import is_static_model, resolve_static
from .tokenization import WordPieceTokenizer
from .yes_no import PairTemplate


def resolve_options(requested: ModelConfig) -> tuple[dict[str, Any], WordPieceTokenizer]:
    """Check a model directory and options without loading weights or TensorFlow; returns
    the resolved options and the model's tokenizer."""
    if is_static_model(requested.model_dir):
        return resolve_static(requested)
    model = inspect_model(requested)
    config, spec = resolve(requested, model)
    adapters = {"adapters": list(model.config.adapters)} if model.config.adapters else {}
    info = {**describe(config, spec), **model.head.describe(), "family": model.config.family, **adapters}
    return info, build_tokenizer(model, config)


def build_tokenizer(model: ModelFiles, config: ModelConfig) -> WordPieceTokenizer:
    limit = model.config.max_tokens
    max_len = limit if config.max_seq_len == DYNAMIC or config.max_seq_len is None else int(config.max_seq_len)
    tokenizer = WordPieceTokenizer(
        vocab_path=model.vocab_path,
        tokenizer_json=model.tokenizer_json,
        do_lower_case=model.do_lower_case,
        max_len=max_len,
        stride=config.chunk_stride,
        pair_template=_template(model, config),
    )
    largest, token = tokenizer.largest_id()
    if tokenizer.vocab_size > model.config.vocab_size or largest >= model.config.vocab_size:
        raise ModelError(
            f"the tokenizer knows {tokenizer.vocab_size} tokens, up to id {largest} ({token!r}), but the model "
            f"embeds only vocab_size={model.config.vocab_size} (ids 0 to {model.config.vocab_size - 1})"
        )
    return tokenizer


def _template(model: ModelFiles, config: ModelConfig) -> PairTemplate | None:
    """The model's pair template (a yes/no reranker's) with the instruction asked for."""
    template = model.head.template
    if config.instruction is None:
        return template
    if template is None:
        raise ModelError(
            "instruction applies to a reranker that writes each pair into its own template with a task "
            f"instruction (Qwen3-Reranker); this model's task is {model.head.task}, and it has none"
        )
    return dataclasses.replace(template, instruction=config.instruction)


def describe(config: ModelConfig, spec: GraphSpec) -> dict[str, Any]:
    """The resolved options as plain JSON values: ``dtype`` is the one the graph runs,
    ``dtype_requested`` the one asked for (``auto``) and ``dtype_reason`` why."""
    return {
        "model_dir": config.model_dir,
        "max_seq_len": config.max_seq_len,
        "pooling_strategy": spec.pooling_strategy.value,
        "pooling_layer": list(config.pooling_layer or ()),
        "mask_cls_sep": spec.mask_cls_sep,
        "normalize": spec.normalize,
        "dtype": spec.dtype,
        "dtype_requested": config.dtype,
        "dtype_reason": hardware.resolve_dtype(config.dtype, config.device)[1],
        "output_dtype": spec.output_dtype,
        "do_lower_case": config.do_lower_case,
        "long_inputs": config.long_inputs,
        "chunk_stride": config.chunk_stride,
        "chunking": spec.task == "embed" and chunking.chunk_refusal(spec.pooling_strategy) is None,
        "task": spec.task,
    }


def _check_dense(model: ModelFiles, strategy: PoolingStrategy, layers: int, long_inputs: str) -> None:
    """A model's Dense module takes the sentence vector of the width it was trained on."""
    dense = model.defaults.dense
    if not dense or strategy is PoolingStrategy.NONE:
        return
    width = pooled_width(model.config.hidden_size, strategy, layers)
    if width != dense[0].in_features:
        raise ModelError(
            f"this model's Dense module ({dense[0].path}) takes {dense[0].in_features}-wide vectors, and "
            f"{strategy.value} over {layers} layer(s) gives {width}: pool one layer with a strategy "
            "that keeps the width (the model's own pooling does)"
        )
    if long_inputs == "chunk":
        raise ModelError(
            "long_inputs=chunk cannot be used with this model's Dense module: windows are merged before it, "
            "and its activation does not commute with a mean"
        )


def resolve(requested: ModelConfig, model: ModelFiles) -> tuple[ModelConfig, GraphSpec]:
    """Fill the options the user left out from the model's defaults, and check them."""
    if model.head.task != "embed" and not model.head.late:  # a late-interaction model runs as an encoder (.late)
        return _resolve_task(requested, model)
    defaults = model.defaults
    num_layers = model.config.num_hidden_layers
    strategy = requested.pooling_strategy or defaults.pooling_strategy
    if strategy is PoolingStrategy.CLS_POOLED:
        # The pooler reads the last layer's [CLS] vector; other layers have no pooler.
        if requested.pooling_layer not in (None, (-1,), (num_layers - 1,)):
            raise ModelError("CLS_POOLED is computed from the last layer; leave pooling_layer at -1")
        layers: tuple[int, ...] = (-1,)
    else:
        layers = requested.pooling_layer or defaults.pooling_layer
    absolute = []
    for layer in layers:
        if not -num_layers <= layer < num_layers:
            raise ModelError(f"pooling_layer {layer} is out of range: the model has {num_layers} layers")
        absolute.append(layer % num_layers)
    max_seq_len = requested.max_seq_len if requested.max_seq_len is not None else defaults.max_seq_len
    limit = model.config.max_tokens
    if max_seq_len != DYNAMIC and int(max_seq_len) > limit:
        raise ModelError(f"max_seq_len {max_seq_len} is above the {limit} tokens the model's positions allow")
    normalize = defaults.normalize if requested.normalize is None else requested.normalize
    if requested.long_inputs == "chunk":
        check_chunkable(strategy)
    _check_dense(model, strategy, len(layers), requested.long_inputs)
    resolved = requested.replace(
        max_seq_len=max_seq_len,
        pooling_strategy=strategy,
        pooling_layer=layers,
        normalize=normalize,
        do_lower_case=model.do_lower_case,
    )
    spec = GraphSpec(
        pooling_strategy=strategy,
        pooling_layer=tuple(absolute),
        mask_cls_sep=requested.mask_cls_sep,
        normalize=normalize,
        dtype=hardware.resolve_dtype(requested.dtype, requested.device)[0],
        output_dtype=requested.output_dtype,
        zero_padding=model.head.late != "colbert",
    )
    return resolved, spec


#: What the activations of one SPLADE run may take: a run of rows x length tokens holds a logit
#: per vocabulary entry for each token, so its rows are capped to keep a run within this.
SPARSE_RUN_BYTES = 256 << 20


def _resolve_task(requested: ModelConfig, model: ModelFiles) -> tuple[ModelConfig, GraphSpec]:
    """The options of a model whose head is a task's (rerank, classify, sparse): no pooling,
    no normalization, no windows; its length is the tokenizer's, as sentence-transformers'
    CrossEncoder and SparseEncoder take it, unless ``max_seq_len`` says."""
    task = model.head.task
    for name, value in (
        ("pooling_strategy", requested.pooling_strategy),
        ("pooling_layer", requested.pooling_layer),
        ("normalize", requested.normalize),
    ):
        if value is not None:
            raise ModelError(f"{name} does not apply to a {task} model: its head reads the last layer")
    if requested.long_inputs == "chunk":
        raise ModelError(f"long_inputs=chunk does not apply to a {task} model: a long input is truncated")
    if requested.mask_cls_sep:
        raise ModelError(f"mask_cls_sep does not apply to a {task} model")
    limit = model.config.max_tokens
    max_seq_len = requested.max_seq_len if requested.max_seq_len is not None else model.defaults.max_seq_len
    if max_seq_len != DYNAMIC and int(max_seq_len) > limit:
        raise ModelError(f"max_seq_len {max_seq_len} is above the {limit} tokens the model's positions allow")
    batch_size = requested.batch_size
    if task == "sparse":
        length = limit if max_seq_len == DYNAMIC else int(max_seq_len)
        batch_size = max(1, min(batch_size, SPARSE_RUN_BYTES // (4 * length * model.config.vocab_size)))
    resolved = requested.replace(
        max_seq_len=max_seq_len,
        pooling_strategy=PoolingStrategy.CLS_TOKEN,
        pooling_layer=(-1,),
        normalize=False,
        do_lower_case=model.do_lower_case,
        batch_size=batch_size,
        task=task,
    )
    spec = GraphSpec(
        pooling_strategy=PoolingStrategy.CLS_TOKEN,
        pooling_layer=(model.config.num_hidden_layers - 1,),
        mask_cls_sep=False,
        normalize=False,
        dtype=hardware.resolve_dtype(requested.dtype, requested.device)[0],
        output_dtype=requested.output_dtype,
        task=task,
    )
    return resolved, spec
