"""The command line's flags, and the configs they build.

Each flag is named like the config field it sets (``--max-seq-len``: ``max_seq_len``) and may
also come from the environment as ``BERTSERVE_<FLAG>`` (``BERTSERVE_MAX_SEQ_LEN=64``); a flag
on the command line wins. :func:`server_config_from_args` and :func:`model_config_from_args`
turn a parsed command line into the one frozen config the server's roles are given. What a
flag is, and how ``--help`` shows it, is in :mod:`.flag_help`.

The flags of ``bertserve start`` are tabled per concern: the model's here, how the head serves
in :mod:`.serving_flags`, its HTTP and security edges in :mod:`.http_flags`; ``SERVER_FLAGS``
puts them in the order ``--help`` shows them.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from ..config.model import LONG_INPUTS, ModelConfig, PoolingStrategy
from ..config.served import default_model_name, fetch_hub_models, hub_fields, task_defaults, with_default_model
from ..config.server import ServerConfig
from ..config.telemetry import Telemetry, telemetry_from
from ..errors import BertServeError, ConfigError, ModelOptionError
from ..model.default import default_model_dir
from ..model.hub import fetch_model
from .flag_help import Flag, boolean, under
from .http_flags import HTTP_FLAGS, SECURITY_FLAGS
from .serving_flags import DEVICE_FLAGS, LIMIT_FLAGS, SERVING_FLAGS


def _as_the_config_spells(field: str) -> Callable[[str], str]:
    """A model option's value as :class:`ModelConfig` spells it (``half``: ``fp16``,
    ``cls_token``: ``CLS_TOKEN``), so that its other spellings pass the flag's ``choices``;
    a value the config refuses is left as given, for argparse to answer with the choices."""

    def parse(value: str) -> str:
        try:
            options: dict[str, Any] = {field: value}
            spelled = getattr(ModelConfig(model_dir="", **options), field)
        except ModelOptionError:
            return value
        return str(getattr(spelled, "value", spelled))

    return parse


_MODEL_DEFAULT = "the model's, or "  # what a plain BERT directory gets when the model says nothing

MODEL_FLAGS = under(
    "model",
    Flag("--model-dir", "BERT model directory", unset="all-MiniLM-L6-v2 if installed"),
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

SERVER_FLAGS = [
    *under(
        "model",
        Flag(
            "--model-class",
            "MODULE:NAME of a class implementing bertserve.server.model.interface.Model",
            unset="BERT from --model-dir",
            metavar="MODULE:NAME",
            rare=True,
        ),
        Flag(
            "--prompt",
            "NAME=TEXT: a prompt requests may name (prompt_name), put before each input; beside the model's own",
            many=True,
            default=(),
            unset="the model's config_sentence_transformers.json",
            metavar="NAME=TEXT",
            rare=True,
        ),
        Flag(
            "--default-prompt-name",
            "the prompt a request gets unless it names one",
            unset="the model's, or none",
            rare=True,
        ),
    ),
    *SERVING_FLAGS,
    *LIMIT_FLAGS,
    *DEVICE_FLAGS,
    *HTTP_FLAGS,
    *SECURITY_FLAGS,
    *under(
        "several models and model versions",
        Flag(
            "--model",
            "NAME=DIR[,key=value,...]: serve the model in DIR as NAME, its own options over the flags "
            "(fast=DIR,dtype=int8,num_worker=2); once per model, instead of --model-dir",
            many=True,
            default=(),
            unset="the one model of --model-dir",
            field="models",
            env_commas=False,
        ),
        Flag(
            "--models-dir", "serve each subfolder of DIR as a model named like it, instead of --model-dir", unset="none"
        ),
        Flag(
            "--default-model",
            "the model a request gets unless it names one; TASK=NAME: a request of that task "
            "(rerank, classify, sparse, embed); repeatable",
            many=True,
            default=(),
            unset="the first served, of the task",
            field="default_models",
            metavar="[TASK=]NAME",
        ),
        Flag(
            "--model-version",
            "with --model-dir a base of numbered versions: the one to serve, or latest",
            default="latest",
            metavar="VERSION",
        ),
        Flag("--require-manifest", "refuse a model version without its bertserve.sha256", boolean, False, rare=True),
        Flag(
            "--poll-interval-s",
            "look for a newer model version this often and swap to it (0: only on `bertserve reload`)",
            float,
            0.0,
            rare=True,
        ),
    ),
]


def server_flag(name: str) -> Flag:
    """The ``bertserve start`` flag called ``name`` (``--api-key``)."""
    return next(flag for flag in [*SERVER_FLAGS, *MODEL_FLAGS] if flag.name == name)


WORKER_FLAGS = [
    *under(
        "the head",
        Flag("--server", "the head's host name or address", unset="required", metavar="HOST"),
        Flag("--worker-port", "the head's --worker-port", int, unset="required"),
        Flag("--model-name", "the head's model these workers serve, when it serves several", unset="its default model"),
    ),
    *under(
        "model",
        Flag(
            "--model-dir",
            "this machine's copy of the head's model directory (checked by sha256)",
            unset="all-MiniLM-L6-v2 if installed",
        ),
        Flag(
            "--model-id",
            "the head's model by its Hub id, ORG/NAME[@REVISION]: fetched into this machine's Hub cache "
            "(checked by sha256 like a directory)",
            unset="--model-dir",
        ),
    ),
    server_flag("--tuned-model-dir"),
    server_flag("--graph-dir"),
    server_flag("--model-class"),  # the only class it may import: the head must serve the same
    *under(
        "workers and devices",
        Flag("--num-worker", "worker processes on this machine", int, 1),
        Flag("--prefetch-size", "jobs a worker holds at once: its credits; give faster devices more", int, 1),
    ),
    *(server_flag(name) for name in ("--cpu", "--device-map", "--gpu-memory-fraction", "--threads-per-worker")),
    *(server_flag(name) for name in ("--worker-nice", "--feed", "--max-restarts", "--stop-timeout")),
    *under(
        "security",
        Flag(
            "--client-cert",
            "CURVE: this worker's NAME.key_secret, whose NAME.key is in the head's workers/",
            unset="plain TCP",
            metavar="FILE",
        ),
        Flag(
            "--server-key",
            "CURVE: the head's public key (its server.key file or z85 text)",
            unset="plain TCP",
            metavar="KEY",
        ),
    ),
    *under(
        "health checks",
        Flag("--health-port", "serve GET /health and /ready on this port, for container probes", int, unset="none"),
        Flag("--health-bind", "address the health port listens on", default="127.0.0.1"),
    ),
]


def model_config_from_args(args: argparse.Namespace) -> ModelConfig:
    """The model's config; a model given by its Hub id (``--model-id``) is fetched now, into
    the Hub cache, so that every process after this one reads its directory there."""
    options = {flag.dest: getattr(args, flag.dest) for flag in MODEL_FLAGS}
    if args.model_id is None:
        options["model_dir"] = args.model_dir or default_model_dir()
        return ModelConfig(**options)
    if args.model_dir is not None:
        raise ConfigError(
            f"--model-id and --model-dir cannot be given together: --model-id {args.model_id} serves a model of the "
            f"Hub (from the Hub cache), --model-dir {args.model_dir} the one in a directory; give one of them"
        )
    ModelConfig(**{**options, "model_id": None, "model_dir": ""})  # the other options checked before a download
    return ModelConfig(**{**options, **hub_fields(fetch_model(args.model_id))})


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The server's config; with several models (``--model``, ``--models-dir``) its ``model``
    is the default model's, and the model flags are every model's defaults. A value it refuses
    that came from a ``BERTSERVE_`` variable is refused by that variable's name."""
    try:
        return _server_config(args)
    except ConfigError as exc:
        raise _named_by_environment(exc, args) from None


def _named_by_environment(exc: ConfigError, args: argparse.Namespace) -> ConfigError:
    """``exc``, naming the environment variable that gave the value it refuses, where one did
    and the command line gave none (``BERTSERVE_API_KEY='': api_key must be at least 8 ...``)."""
    message = str(exc)
    for flag in (*SERVER_FLAGS, *MODEL_FLAGS):
        raw = os.environ.get(flag.env)
        if raw is None or not message.startswith(f"{flag.dest} "):
            continue
        try:
            from_environment = getattr(args, flag.dest, None) == flag.parse_env(raw)
        except BertServeError:
            continue
        if from_environment:
            shown = "(hidden)" if "key" in flag.dest and raw else repr(raw)
            return type(exc)(f"{flag.env}={shown}: {message}")
    return exc


def _server_config(args: argparse.Namespace) -> ServerConfig:
    options = {flag.dest: getattr(args, flag.dest) for flag in SERVER_FLAGS}
    options.update(_default_models(options.pop("default_models")))
    several = "--model" if options["models"] else "--models-dir" if options["models_dir"] is not None else None
    if several is None:
        if args.model_id is not None:  # every option checked before the model is fetched
            ServerConfig(model=ModelConfig(model_dir=""), **options)
        config = ServerConfig(model=model_config_from_args(args), **options)
        default_model_name(config)  # a --default-model that is not the model served: refused now, not at start
        task_defaults(config)
        return config
    one = next((flag for flag in ("--model-dir", "--model-id") if getattr(args, flag[2:].replace("-", "_"))), None)
    if one is not None:
        what = (
            "names each model with its directory or Hub id"
            if several == "--model"
            else "serves every model of a folder"
        )
        raise ConfigError(f"{one} and {several} cannot be given together: {one} serves one model, {several} {what}")
    flags = ModelConfig(**{**{flag.dest: getattr(args, flag.dest) for flag in MODEL_FLAGS}, "model_dir": ""})
    ServerConfig(model=flags, **options)  # every option checked before a model is fetched
    options["models"] = fetch_hub_models(options["models"])
    config = with_default_model(ServerConfig(model=flags, **options))
    task_defaults(config)  # a TASK=NAME of another task's model: refused now, not at start
    return config


def _default_models(values: list[str]) -> dict[str, Any]:
    """``--default-model``'s values as the config's fields: one ``NAME`` (``default_model``)
    and any ``TASK=NAME`` (``task_defaults``)."""
    plain = [value for value in values if "=" not in value]
    if len(plain) > 1:
        raise ConfigError(
            f"--default-model names two default models, {plain[0]!r} and {plain[1]!r}: give one NAME, "
            "and TASK=NAME for the default of a task"
        )
    return {"default_model": plain[0] if plain else None, "task_defaults": tuple(v for v in values if "=" in v)}


def worker_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of a worker host's config (``bertserve worker``)."""
    options = {flag.dest: getattr(args, flag.dest) for flag in WORKER_FLAGS}
    model_id = options.pop("model_id")
    if model_id is None:
        options["model_dir"] = args.model_dir or default_model_dir()
    elif args.model_dir is not None:
        raise ConfigError(
            f"--model-id and --model-dir cannot be given together: give --model-id {model_id} or a directory"
        )
    else:
        options["model_dir"] = fetch_model(model_id).directory  # the head checks its files' sha256
    return options


def telemetry_from_args(args: argparse.Namespace) -> Telemetry:
    """How every process logs and traces (``-v``, ``--log-format``, ``--otlp-endpoint`` and
    ``OTEL_*``); a command without those flags logs text."""
    telemetry = telemetry_from(
        verbose=bool(getattr(args, "verbose", False)),
        log_format=getattr(args, "log_format", "text"),
        otlp_endpoint=getattr(args, "otlp_endpoint", None),
    )
    if telemetry.traces_endpoint is not None:
        from .. import tracing

        tracing.check(telemetry.traces_endpoint)
    return telemetry
