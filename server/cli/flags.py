"""The command line's flags, and the configs they build.

Each flag is named like the config field it sets (``--max-seq-len``: ``max_seq_len``) and may
also come from the environment as ``BERTSERVE_<FLAG>`` (``BERTSERVE_MAX_SEQ_LEN=64``); a flag
on the command line wins. :func:`server_config_from_args` and :func:`model_config_from_args`
turn a parsed command line into the one frozen config the server's roles are given. What a
flag is, and how ``--help`` shows it, is in :mod:`.flag_help`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from ..config.http import (
    HTTP_BODY_MIN_RATE,
    HTTP_BODY_TIMEOUT_S,
    HTTP_CONNECTIONS,
    HTTP_HEADER_BYTES,
    HTTP_HEADER_TIMEOUT_S,
    HTTP_HEADERS,
)
from ..config.model import LONG_INPUTS, ModelConfig, PoolingStrategy
from ..config.served import default_model_name, with_default_model
from ..config.server import (
    CLIENT_QUEUED_SENTENCES,
    HTTP_BODY_BYTES_TOTAL,
    QUEUED_BYTES,
    QUEUED_SENTENCES,
    REQUEST_SIZE,
    ServerConfig,
)
from ..errors import ConfigError, ModelOptionError
from ..model.default import default_model_dir
from .flag_help import Flag, boolean


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


def _under(group: str, *flags: Flag) -> list[Flag]:
    """``flags``, shown under the ``--help`` heading ``group``."""
    return [dataclasses.replace(flag, group=group) for flag in flags]


_MODEL_DEFAULT = "the model's, or "  # what a plain BERT directory gets when the model says nothing

MODEL_FLAGS = _under(
    "model",
    Flag("--model-dir", "BERT model directory", unset="all-MiniLM-L6-v2 if installed"),
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
        "how the token vectors become one vector",
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
)

SERVER_FLAGS = [
    *_under(
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
    *_under(
        "serving",
        Flag("--port", "port that takes requests", int, 5555),
        Flag("--port-out", "port that publishes results", int, unset="--port + 1"),
        Flag("--bind", "address to listen on (0.0.0.0 for every interface)", default="127.0.0.1"),
        Flag("--max-batch-size", "most sentences in one mini-job", int, 256),
        Flag(
            "--max-batch-tokens",
            "most padded tokens in one bulk mini-job, so jobs take similar time",
            int,
            4096,
            rare=True,
        ),
        Flag("--max-latency-ms", "most a small request for a busy worker waits for company", float, 10.0),
        Flag("--merge-requests", "merge small requests from different clients into one mini-job", boolean, True),
        Flag(
            "--bulk-run-ms",
            "while small requests are about, a long job's model runs are cut to take about this "
            "long, so a small job overtaking it waits at most about this (0: runs of --batch-size)",
            float,
            250.0,
            rare=True,
        ),
        Flag("--legacy-clients", "answer bert-as-service 1.x's own client too", boolean, True, rare=True),
        Flag("--show-tokens-to-client", "send bert-as-service clients each input's tokens", boolean, False, rare=True),
    ),
    *_under(
        "limits and overload",
        Flag(
            "--max-request-size",
            "most inputs in one request",
            int,
            unset=f"{REQUEST_SIZE}, at most --max-client-queued-sentences",
        ),
        Flag("--max-text-chars", "most characters in one input", int, 100_000),
        Flag("--request-timeout-ms", "a request unfinished after this gets an error reply", int, 600_000),
        Flag(
            "--max-queued-sentences",
            "most inputs queued at once; past it requests get a busy error",
            int,
            unset=f"{QUEUED_SENTENCES}, at least the bounds per client and per request",
        ),
        Flag(
            "--max-client-queued-sentences",
            "most inputs one client may have queued",
            int,
            unset=f"{CLIENT_QUEUED_SENTENCES}, within --max-request-size and --max-queued-sentences",
            rare=True,
        ),
        Flag(
            "--max-queued-bytes",
            "memory the texts of queued requests may hold; past it requests get a busy error",
            int,
            QUEUED_BYTES,
            rare=True,
        ),
        Flag(
            "--bulk-slowdown",
            "a bulk request that would finish (or make one taken before it finish) later than "
            "this many times its time on an idle server, at the speed measured, is refused busy at once (0: never)",
            float,
            4.0,
            rare=True,
        ),
        Flag(
            "--max-message-bytes",
            "largest request frame; a larger one is dropped unread",
            int,
            unset="what the size limits need, at most 16 MiB and --max-queued-bytes",
            rare=True,
        ),
        Flag(
            "--reply-hwm",
            "replies queued for one client connection; bertserve's clients keep at most this many "
            "requests unanswered, and a reply past it is answered with a 'dropped' error instead",
            int,
            100,
            rare=True,
        ),
    ),
    *_under(
        "workers and devices",
        Flag("--num-worker", "worker processes on this machine (0 with a worker port: only remote ones)", int, 1),
        Flag("--cpu", "run on the CPU even where a GPU is visible", boolean, False),
        Flag("--device-map", "GPU ids the workers take in turn", int, (), many=True, unset="every visible GPU"),
        Flag(
            "--gpu-memory-fraction",
            "share of its GPU's memory a worker may take",
            float,
            unset="grow as needed",
            metavar="FRACTION",
            rare=True,
        ),
        Flag("--threads-per-worker", "TensorFlow threads per CPU worker", int, unset="the cores shared out"),
        Flag(
            "--worker-nice",
            "how much lower the workers' CPU priority is, so requests move while they compute",
            int,
            5,
            rare=True,
        ),
        Flag(
            "--worker-port",
            "let workers on other machines (`bertserve worker`) join on this port",
            int,
            unset="local workers only",
        ),
        Flag(
            "--feed",
            "what receives and tokenizes a worker's next jobs",
            default="thread",
            choices=("thread", "tfdata"),
            rare=True,
        ),
        Flag(
            "--prefetch-size",
            "jobs a worker holds at once; more than 1 makes small requests wait longer",
            int,
            1,
            rare=True,
        ),
        Flag(
            "--job-timeout-ms",
            "a worker holding a job longer than this is killed and replaced",
            int,
            120_000,
            rare=True,
        ),
        Flag("--heartbeat-timeout-ms", "a worker silent this long is killed and replaced", int, 10_000, rare=True),
        Flag("--max-restarts", "failures in a row of one process before the server gives up", int, 5, rare=True),
    ),
    *_under(
        "HTTP",
        Flag(
            "--http-port", "also serve the HTTP API (OpenAI's /v1/embeddings, ...) on this port", int, unset="no HTTP"
        ),
        Flag("--http-bind", "address the HTTP port listens on", unset="--bind"),
        Flag(
            "--served-model-name",
            "the model name the HTTP API lists and accepts",
            unset="all-MiniLM-L6-v2 without --model-dir, else the directory's name",
        ),
        Flag(
            "--model-alias",
            "other names the HTTP API accepts for the model",
            many=True,
            default=(),
            unset="none",
            metavar="NAME",
        ),
        Flag(
            "--token-id-input",
            "take token id arrays as this model's WordPiece ids (else refused: most clients send tiktoken ids)",
            boolean,
            False,
            rare=True,
        ),
        Flag(
            "--max-http-body-bytes",
            "largest HTTP request body; larger is refused with 413",
            int,
            unset="16 MiB, at most the request frame limit",
            rare=True,
        ),
        Flag(
            "--max-http-body-bytes-total",
            "HTTP bodies held at once, each counted as its bytes plus 64 per comma, "
            "232 per '{' and 88 per '['; past it 429",
            int,
            HTTP_BODY_BYTES_TOTAL,
            rare=True,
        ),
        Flag(
            "--max-http-body-bytes-per-principal",
            "HTTP bodies one principal (API key, else address) holds at "
            "once, of --max-http-body-bytes-total; past it 429",
            int,
            unset="half the total, at least --max-http-body-bytes",
            rare=True,
        ),
        Flag(
            "--http-body-timeout-s",
            "an HTTP body not whole this long after its headers is cut off with 408",
            float,
            HTTP_BODY_TIMEOUT_S,
            rare=True,
        ),
        Flag(
            "--http-body-min-rate",
            "an HTTP body slower than this many bytes a second on average (after 2 s) is "
            "cut off with 408 (0: any pace)",
            int,
            HTTP_BODY_MIN_RATE,
            metavar="BYTES",
            rare=True,
        ),
        Flag(
            "--max-http-connections",
            "HTTP connections open at once; one more is answered 503 and closed",
            int,
            HTTP_CONNECTIONS,
            rare=True,
        ),
        Flag(
            "--max-http-header-bytes",
            "largest HTTP request line and headers; larger is answered 400 and closed",
            int,
            HTTP_HEADER_BYTES,
            rare=True,
        ),
        Flag(
            "--max-http-headers",
            "most header fields in one HTTP request; more is 431",
            int,
            HTTP_HEADERS,
            metavar="N",
            rare=True,
        ),
        Flag(
            "--http-header-timeout-s",
            "HTTP request headers not whole this long after the connection (or the "
            "request's first byte) are answered 408 and closed",
            float,
            HTTP_HEADER_TIMEOUT_S,
            rare=True,
        ),
        Flag(
            "--forwarded-allow-ips",
            "proxies (addresses, networks, or *) whose X-Forwarded-For names the HTTP caller",
            many=True,
            default=(),
            unset="none: the peer address",
            metavar="ADDR",
        ),
        Flag(
            "--metrics-principals",
            "name each HTTP principal in /metrics (bertserve_http_principal_requests_total)",
            boolean,
            False,
            rare=True,
        ),
        Flag(
            "--metrics-port",
            "serve Prometheus /metrics alone on this port (with --http-port it is at /metrics)",
            int,
            unset="none",
        ),
    ),
    *_under(
        "security",
        Flag(
            "--curve-dir",
            "serve with CURVE: DIR/server.key_secret; client keys in DIR/clients, admins in DIR/admins",
            unset="plain TCP",
        ),
        Flag("--allow-terminate", "let clients stop the server", boolean, unset="on loopback without CURVE, or admins"),
        Flag(
            "--api-key",
            "HTTP callers must send Authorization: Bearer KEY (principal 'default'); better as "
            "BERTSERVE_API_KEY, since every user can see a command line",
            unset="none needed",
            metavar="KEY",
        ),
        Flag(
            "--api-keys",
            "FILE of NAME KEY lines: each key a principal of its own (bounds, turns, metrics)",
            unset="none",
            metavar="FILE",
        ),
    ),
    *_under(
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
            "with --model or --models-dir: the model a request gets unless it names one",
            unset="the first",
            metavar="NAME",
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
        ),
    ),
]


def server_flag(name: str) -> Flag:
    """The ``bertserve start`` flag called ``name`` (``--api-key``)."""
    return next(flag for flag in [*SERVER_FLAGS, *MODEL_FLAGS] if flag.name == name)


WORKER_FLAGS = [
    *_under(
        "the head",
        Flag("--server", "the head's host name or address", unset="required", metavar="HOST"),
        Flag("--worker-port", "the head's --worker-port", int, unset="required"),
        Flag("--model-name", "the head's model these workers serve, when it serves several", unset="its default model"),
    ),
    *_under(
        "model",
        Flag(
            "--model-dir",
            "this machine's copy of the head's model directory (checked by sha256)",
            unset="all-MiniLM-L6-v2 if installed",
        ),
    ),
    server_flag("--tuned-model-dir"),
    server_flag("--graph-dir"),
    server_flag("--model-class"),  # the only class it may import: the head must serve the same
    *_under(
        "workers and devices",
        Flag("--num-worker", "worker processes on this machine", int, 1),
        Flag("--prefetch-size", "jobs a worker holds at once: its credits; give faster devices more", int, 1),
    ),
    *(server_flag(name) for name in ("--cpu", "--device-map", "--gpu-memory-fraction", "--threads-per-worker")),
    *(server_flag(name) for name in ("--worker-nice", "--feed", "--max-restarts")),
    *_under(
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
    *_under(
        "health checks",
        Flag("--health-port", "serve GET /health and /ready on this port, for container probes", int, unset="none"),
        Flag("--health-bind", "address the health port listens on", default="127.0.0.1"),
    ),
]


def model_config_from_args(args: argparse.Namespace) -> ModelConfig:
    options = {flag.dest: getattr(args, flag.dest) for flag in MODEL_FLAGS}
    options["model_dir"] = args.model_dir or default_model_dir()
    return ModelConfig(**options)


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The server's config; with several models (``--model``, ``--models-dir``) its ``model``
    is the default model's, and the model flags are every model's defaults."""
    options = {flag.dest: getattr(args, flag.dest) for flag in SERVER_FLAGS}
    several = "--model" if options["models"] else "--models-dir" if options["models_dir"] is not None else None
    if several is None:
        config = ServerConfig(model=model_config_from_args(args), **options)
        default_model_name(config)  # a --default-model that is not the model served: refused now, not at start
        return config
    if args.model_dir is not None:
        what = "names each model with its directory" if several == "--model" else "serves every model of a folder"
        raise ConfigError(
            f"--model-dir and {several} cannot be given together: --model-dir serves one model, {several} {what}"
        )
    flags = ModelConfig(**{**{flag.dest: getattr(args, flag.dest) for flag in MODEL_FLAGS}, "model_dir": ""})
    return with_default_model(ServerConfig(model=flags, **options))


def worker_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of a worker host's config (``bertserve worker``)."""
    options = {flag.dest: getattr(args, flag.dest) for flag in WORKER_FLAGS}
    options["model_dir"] = args.model_dir or default_model_dir()
    return options
