"""The command line's flags, and the configs they build.

Each flag is named like the config field it sets (``--max-seq-len``: ``max_seq_len``) and may
also come from the environment as ``BERTSERVE_<FLAG>`` (``BERTSERVE_MAX_SEQ_LEN=64``); a flag
on the command line wins. :func:`server_config_from_args` and :func:`model_config_from_args`
turn a parsed command line into the one frozen config the server's roles are given.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bertserve.client.cli import unset_help

from .config import (
    CLIENT_QUEUED_SENTENCES,
    HTTP_BODY_BYTES_TOTAL,
    QUEUED_BYTES,
    QUEUED_SENTENCES,
    REQUEST_SIZE,
    ModelConfig,
    ServerConfig,
)
from .errors import BertServeError, ConfigError
from .model.default import default_model_dir
from .served_models import default_model_name, with_default_model


def _bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {value!r}")


@dataclass(frozen=True)
class Flag:
    """One command-line flag, named like the config field it sets (``--max-seq-len``:
    ``max_seq_len``), which ``BERTSERVE_MAX_SEQ_LEN`` can also set. ``unset`` says what
    leaving out a flag whose default is None (or empty) means, for ``--help``."""

    name: str
    help: str
    kind: Callable[[str], Any] = str
    default: Any = None
    many: bool = False  # takes several values: --pooling-layer -1 -2
    switch: bool = False  # may stand alone: --xla means --xla true
    unset: str = ""
    field: str = ""  # the config field it sets, when not the one named like it (--model: models)
    env_commas: bool = True  # several values in BERTSERVE_<FLAG> may be separated by commas, not only spaces

    @property
    def dest(self) -> str:
        return self.field or self.name[2:].replace("-", "_")

    @property
    def env(self) -> str:
        return "BERTSERVE_" + self.name[2:].replace("-", "_").upper()

    def add_to(self, group: Any) -> None:
        raw = os.environ.get(self.env)
        default = self.default if raw is None else self._parse_env(raw)
        help = unset_help(self.help, default, self.unset) if self.unset else self.help
        options: dict[str, Any] = {"type": self.kind, "default": default, "help": help}
        if self.field:  # --model fills models, and is still shown as --model MODEL
            options.update(dest=self.field, metavar=self.env.removeprefix("BERTSERVE_"))
        if self.many:
            options["nargs"] = "+"
            if isinstance(self.default, tuple) and not self.default:  # repeatable: --prompt a=x --prompt b=y
                options.update(action="extend", default=list(default or ()))
        if self.switch:
            options.update(nargs="?", const=True)
        group.add_argument(self.name, **options)

    def _parse_env(self, raw: str) -> Any:
        try:
            if self.many:
                return [self.kind(item) for item in (raw.replace(",", " ") if self.env_commas else raw).split()]
            return self.kind(raw)
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise BertServeError(f"{self.env}={raw!r}: {exc}") from None


_MODEL_DEFAULT = "the model's, or "  # what a plain BERT directory gets when the model says nothing

MODEL_FLAGS = [
    Flag("--model-dir", "BERT model directory", unset="all-MiniLM-L6-v2 if installed"),
    Flag("--tuned-model-dir", "fine-tuned checkpoint directory whose weights override the model's", unset="none"),
    Flag("--ckpt-name", "checkpoint prefix (Google layout)", default="bert_model.ckpt"),
    Flag("--config-name", "config file name (Google layout)", default="bert_config.json"),
    Flag("--vocab-name", "vocabulary file name", unset="vocab.txt, or tokenizer.json"),
    Flag("--max-seq-len", "longest input in tokens, or NONE for each batch's own longest", unset=_MODEL_DEFAULT + "25"),
    Flag(
        "--pooling-strategy",
        "NONE, REDUCE_MEAN, REDUCE_MAX, REDUCE_MEAN_MAX, CLS_TOKEN, SEP_TOKEN, CLS_POOLED",
        unset=_MODEL_DEFAULT + "REDUCE_MEAN",
    ),
    Flag(
        "--pooling-layer",
        "encoder layer(s) to pool, -1 the last; several are concatenated",
        int,
        many=True,
        unset=_MODEL_DEFAULT + "-2",
    ),
    Flag("--mask-cls-sep", "leave [CLS] and [SEP] out of pooling", _bool, False, switch=True),
    Flag("--normalize", "L2-normalize the output", _bool, switch=True, unset="what the model says"),
    Flag("--do-lower-case", "lower-case the input", _bool, unset="what the vocabulary implies"),
    Flag(
        "--dtype",
        "auto, fp32, bf16, fp16 or int8 weights and matrix products; auto: fp16 on a GPU, bf16 on a CPU with "
        "amx_bf16 or avx512_bf16, else fp32 (never int8)",
        default="auto",
    ),
    Flag("--output-dtype", "float32 or float16 vectors", default="float32"),
    Flag("--xla", "XLA-compile the graph", _bool, False, switch=True),
    Flag("--graph-dir", "where optimized graphs are cached", unset="the user cache dir"),
    Flag("--batch-size", "most sentences in one model run", int, 64),
    Flag("--lite-max-tokens", "fp32 runs of at most this many padded tokens run on LiteRT (0: never)", int, 64),
    Flag(
        "--long-inputs",
        "an input over max_seq_len tokens: truncate it, or chunk it (windows, vectors combined)",
        default="truncate",
    ),
    Flag("--chunk-stride", "tokens that consecutive windows of a chunked input share", int, 0),
]

SERVER_FLAGS = [
    Flag("--num-worker", "worker processes on this machine (0 with a worker port: only remote ones)", int, 1),
    Flag("--port", "port that takes requests", int, 5555),
    Flag("--port-out", "port that publishes results", int, unset="--port + 1"),
    Flag("--bind", "address to listen on (0.0.0.0 for every interface)", default="127.0.0.1"),
    Flag("--max-batch-size", "most sentences in one mini-job", int, 256),
    Flag("--max-batch-tokens", "most padded tokens in one bulk mini-job, so jobs take similar time", int, 4096),
    Flag("--max-latency-ms", "most a small request for a busy worker waits for company", float, 10.0),
    Flag("--merge-requests", "merge small requests from different clients into one mini-job", _bool, True),
    Flag("--feed", "what receives and tokenizes a worker's next jobs: thread, or tfdata", default="thread"),
    Flag("--prefetch-size", "jobs a worker holds at once; more than 1 makes small requests wait longer", int, 1),
    Flag(
        "--bulk-run-ms",
        "while small requests are about, a long job's model runs are cut to take about this long, so a small job "
        "overtaking it waits at most about this (0: runs of --batch-size)",
        float,
        250.0,
    ),
    Flag("--cpu", "run on the CPU even where a GPU is visible", _bool, False, switch=True),
    Flag("--device-map", "GPU ids the workers take in turn", int, (), many=True, unset="every visible GPU"),
    Flag("--gpu-memory-fraction", "share of its GPU's memory a worker may take", float, unset="grow as needed"),
    Flag("--threads-per-worker", "TensorFlow threads per CPU worker", int, unset="the cores shared out"),
    Flag("--worker-nice", "how much lower the workers' CPU priority is, so requests move while they compute", int, 5),
    Flag(
        "--max-request-size",
        "most inputs in one request",
        int,
        unset=f"{REQUEST_SIZE}, at most --max-client-queued-sentences",
    ),
    Flag("--max-text-chars", "most characters in one input", int, 100_000),
    Flag("--request-timeout-ms", "a request unfinished after this gets an error reply", int, 600_000),
    Flag(
        "--bulk-slowdown",
        "a bulk request that would finish (or make one taken before it finish) later than this many times its "
        "time on an idle server, at the speed measured, is refused busy at once (0: never)",
        float,
        4.0,
    ),
    Flag(
        "--max-queued-sentences",
        "most inputs queued at once; past it requests get a busy error",
        int,
        unset=f"{QUEUED_SENTENCES}, at least the two bounds below",
    ),
    Flag(
        "--max-client-queued-sentences",
        "most inputs one client may have queued",
        int,
        unset=f"{CLIENT_QUEUED_SENTENCES}, within --max-request-size and --max-queued-sentences",
    ),
    Flag(
        "--max-queued-bytes",
        "memory the texts of queued requests may hold; past it requests get a busy error",
        int,
        QUEUED_BYTES,
    ),
    Flag(
        "--max-message-bytes",
        "largest request frame; a larger one is dropped unread",
        int,
        unset="what the size limits need, at most 16 MiB and --max-queued-bytes",
    ),
    Flag("--reply-hwm", "replies queued per client that does not read them; more are dropped", int, 100),
    Flag("--job-timeout-ms", "a worker holding a job longer than this is killed and replaced", int, 120_000),
    Flag("--heartbeat-timeout-ms", "a worker silent this long is killed and replaced", int, 10_000),
    Flag("--max-restarts", "failures in a row of one process before the server gives up", int, 5),
    Flag(
        "--curve-dir",
        "serve with CURVE: DIR/server.key_secret; client keys in DIR/clients, admins in DIR/admins",
        unset="plain TCP",
    ),
    Flag("--allow-terminate", "let clients stop the server", _bool, unset="on loopback without CURVE, or admins"),
    Flag("--legacy-clients", "answer bert-as-service 1.x's own client too", _bool, True, switch=True),
    Flag("--show-tokens-to-client", "send bert-as-service clients each input's tokens", _bool, False, switch=True),
    Flag(
        "--model-class",
        "MODULE:NAME of a class implementing bertserve.server.model.interface.Model",
        unset="BERT from --model-dir",
    ),
    Flag(
        "--http-port",
        "also serve HTTP on this port: OpenAI /v1/embeddings, /embed, /encode, /metrics, ...",
        int,
        unset="no HTTP",
    ),
    Flag("--http-bind", "address the HTTP port listens on", unset="--bind"),
    Flag(
        "--api-key",
        "HTTP callers must send Authorization: Bearer KEY (principal 'default'); prefer BERTSERVE_API_KEY, "
        "since a command line is visible to every user of the machine",
        unset="none needed",
    ),
    Flag(
        "--api-keys",
        "FILE of NAME KEY lines: each key a principal of its own (bounds, turns, metrics)",
        unset="none",
    ),
    Flag(
        "--max-http-body-bytes",
        "largest HTTP request body; larger is refused with 413",
        int,
        unset="16 MiB, at most the request frame limit",
    ),
    Flag(
        "--max-http-body-bytes-total",
        "HTTP bodies held at once, each counted as its bytes plus 64 per comma, 232 per '{' and 88 per '['; "
        "past it 429",
        int,
        HTTP_BODY_BYTES_TOTAL,
    ),
    Flag(
        "--metrics-port",
        "serve Prometheus /metrics alone on this port (with --http-port it is at /metrics)",
        int,
        unset="none",
    ),
    Flag(
        "--model-version", "with --model-dir a base of numbered versions: the one to serve, or latest", default="latest"
    ),
    Flag("--require-manifest", "refuse a model version without its bertserve.sha256", _bool, False, switch=True),
    Flag(
        "--poll-interval-s",
        "with a repository of versions: look for a newer one this often and swap to it (0: only on `bertserve reload`)",
        float,
        0.0,
    ),
    Flag(
        "--worker-port",
        "let remote workers (`bertserve worker`) join on this port: jobs, credits and results",
        int,
        unset="local workers only",
    ),
    Flag("--served-model-name", "the model name the HTTP API lists and accepts", unset="the model directory's"),
    Flag("--model-alias", "other names the HTTP API accepts for the model", many=True, default=(), unset="none"),
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
        "--models-dir",
        "serve every model of DIR (one subfolder each, named by the folder) instead of --model-dir",
        unset="none",
    ),
    Flag(
        "--default-model",
        "with --model or --models-dir: the model a request gets unless it names one",
        unset="the first",
    ),
    Flag(
        "--prompt",
        "NAME=TEXT: a prompt requests may name (prompt_name), put before each input; beside the model's own",
        many=True,
        default=(),
        unset="the model's config_sentence_transformers.json",
    ),
    Flag("--default-prompt-name", "the prompt a request gets unless it names one", unset="the model's, or none"),
    Flag(
        "--token-id-input",
        "HTTP: take token id arrays as this model's WordPiece ids (else refused: most clients send tiktoken ids)",
        _bool,
        False,
        switch=True,
    ),
]


def server_flag(name: str) -> Flag:
    """The ``bertserve start`` flag called ``name`` (``--api-key``)."""
    return next(flag for flag in [*SERVER_FLAGS, *MODEL_FLAGS] if flag.name == name)


WORKER_FLAGS = [
    Flag("--server", "the head's host name or address", unset="required"),
    Flag("--worker-port", "the head's --worker-port", int, unset="required"),
    Flag("--num-worker", "worker processes on this machine", int, 1),
    Flag(
        "--model-dir",
        "this machine's copy of the head's model directory (checked by sha256)",
        unset="all-MiniLM-L6-v2 if installed",
    ),
    server_flag("--tuned-model-dir"),
    Flag("--model-name", "the head's model these workers serve, when it serves several", unset="its default model"),
    server_flag("--graph-dir"),
    Flag("--prefetch-size", "jobs a worker holds at once: its credits; give faster devices more", int, 1),
    *(server_flag(name) for name in ("--cpu", "--device-map", "--gpu-memory-fraction", "--threads-per-worker")),
    *(server_flag(name) for name in ("--worker-nice", "--feed", "--max-restarts")),
    server_flag("--model-class"),  # the only class it may import: the head must serve the same
    Flag(
        "--client-cert",
        "CURVE: this worker's NAME.key_secret, whose NAME.key is in the head's workers/",
        unset="plain TCP",
    ),
    Flag("--server-key", "CURVE: the head's public key (its server.key file or z85 text)", unset="plain TCP"),
    Flag("--health-port", "serve GET /health and /ready on this port, for container probes", int, unset="none"),
    Flag("--health-bind", "address the health port listens on", default="127.0.0.1"),
]


def add_flags(parser: argparse.ArgumentParser, title: str, flags: list[Flag]) -> None:
    """``flags`` on ``parser``, under the ``--help`` heading ``title``."""
    group = parser.add_argument_group(title)
    for flag in flags:
        flag.add_to(group)


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
        raise ConfigError(f"--model-dir and {several} cannot be given together: --model-dir serves one model, "
                          f"{several} {what}")  # fmt: skip
    flags = ModelConfig(**{**{flag.dest: getattr(args, flag.dest) for flag in MODEL_FLAGS}, "model_dir": ""})
    return with_default_model(ServerConfig(model=flags, **options))


def worker_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of a worker host's config (``bertserve worker``)."""
    options = {flag.dest: getattr(args, flag.dest) for flag in WORKER_FLAGS}
    options["model_dir"] = args.model_dir or default_model_dir()
    return options
