"""The model's flags (:class:`..config.model.ModelConfig`), which ``bertserve start``,
``embed``, ``calibrate`` and ``export`` share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config.model import LONG_INPUTS, ModelConfig, PoolingStrategy
from ..errors import ModelOptionError
from .flag_help import Flag, boolean, under


def _as_the_config_spells(field: str) -> Callable[[str], str]:
    """A model option's value as :class:`ModelConfig` spells it (``half``: ``fp16``,
    ``cls_token``: ``CLS_TOKEN``), so that its other spellings pass the flag's ``choices``;
    a value the config refuses is left as given, for argparse to answer with the choices."""

    def parse(value: str) -> str:
        try:
            options: dict[str, Any] = {field: value}
            spelled = getattr(ModelConfig.of(model_dir="", **options), field)
        except ModelOptionError:
            return value
        return str(getattr(spelled, "value", spelled))

    return parse


_MODEL_DEFAULT = "the model's, or "  # what a plain BERT directory gets when the model says nothing

MODEL_FLAGS = under(
    "model",
    Flag(
        "--model-dir",
        "model directory or store URL (s3, gs, hdfs, https)",
        unset="all-MiniLM-L6-v2 if installed",
    ),
    Flag("--model-id", "ORG/NAME[@REV]: a Hugging Face Hub model, fetched once", unset="none", metavar="ID"),
    Flag(
        "--tuned-model-dir",
        "fine-tuned checkpoint directory whose weights override the model's",
        unset="none",
        rare=True,
    ),
    Flag("--ckpt-name", "checkpoint prefix (Google layout)", default="bert_model.ckpt", rare=True),
    Flag("--config-name", "config file name (Google layout)", default="bert_config.json", rare=True),
    Flag("--vocab-name", "vocabulary file name", unset="vocab.txt, or tokenizer.json", rare=True),
    Flag(
        "--max-seq-len",
        "longest input in tokens, or NONE for each batch's own longest",
        unset=_MODEL_DEFAULT + "25",
        metavar="N",
    ),
    Flag(
        "--pooling-strategy",
        "how the token vectors become one vector (also mean, max, cls)",
        _as_the_config_spells("pooling_strategy"),
        unset=_MODEL_DEFAULT + "REDUCE_MEAN",
        choices=tuple(strategy.value for strategy in PoolingStrategy),
    ),
    Flag(
        "--pooling-layer",
        "encoder layer(s) to pool, -1 the last; several are concatenated",
        int,
        many=True,
        unset=_MODEL_DEFAULT + "-2",
    ),
    Flag("--mask-cls-sep", "leave [CLS] and [SEP] out of pooling", boolean, False, rare=True),
    Flag("--normalize", "L2-normalize the output", boolean, unset="what the model says"),
    Flag("--do-lower-case", "lower-case the input", boolean, unset="what the vocabulary implies", rare=True),
    Flag(
        "--dtype",
        "weights and matrix products; auto: fp16 on a GPU, bf16 on a CPU with amx_bf16 or avx512_bf16, "
        "else fp32 (never int8)",
        _as_the_config_spells("dtype"),
        "auto",
        choices=("auto", "fp32", "bf16", "fp16", "int8"),
    ),
    Flag(
        "--output-dtype",
        "the vectors' type",
        _as_the_config_spells("output_dtype"),
        "float32",
        choices=("float32", "float16"),
        rare=True,
    ),
    Flag("--xla", "XLA-compile the graph", boolean, False, rare=True),
    Flag("--graph-dir", "where optimized graphs are cached", unset="the user cache dir"),
    Flag("--batch-size", "most sentences in one model run", int, 64),
    Flag(
        "--lite-max-tokens", "fp32 runs of at most this many padded tokens run on LiteRT (0: never)", int, 64, rare=True
    ),
    Flag(
        "--long-inputs",
        "an input over max_seq_len tokens: truncate it, or chunk it (windows, vectors combined)",
        _as_the_config_spells("long_inputs"),
        "truncate",
        choices=LONG_INPUTS,
    ),
    Flag("--chunk-stride", "tokens that consecutive windows of a chunked input share", int, 0, rare=True),
    Flag(
        "--task",
        "what the model computes: embed, rerank, classify or sparse",
        unset="what its config.json says",
        choices=("embed", "rerank", "classify", "sparse"),
        rare=True,
    ),
    Flag(
        "--instruction",
        "a yes/no reranker's task instruction (Qwen3-Reranker's <Instruct>)",
        unset="its model card's web search one",
        metavar="TEXT",
        rare=True,
    ),
    Flag(
        "--calibration",
        "the int8/uint8 embedding types' ranges: a file `bertserve calibrate` wrote",
        unset="the model directory's calibration.json, if any",
        metavar="FILE",
        rare=True,
    ),
)
