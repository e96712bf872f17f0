"""The command line's flags, and the configs they build.

Each flag is named like the config field it sets (``--max-seq-len``: ``max_seq_len``) and may
also come from the environment as ``BERTSERVE_<FLAG>`` (``BERTSERVE_MAX_SEQ_LEN=64``); a flag
on the command line wins. :func:`server_config_from_args` and :func:`model_config_from_args`
turn a parsed command line into the one frozen config the server's roles are given. What a
flag is, and how ``--help`` shows it, is in :mod:`.flag_help`.

The flags of ``bertserve start`` are written per concern: the model's in :mod:`.model_flags`,
how each model is served and several models here, how the head serves in :mod:`.serving_flags`,
its HTTP and security edges in :mod:`.http_flags`; ``SERVER_FLAGS`` puts them in the order
``--help`` shows them, and :data:`PART_FLAGS` says which part of the server's config each sets.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any

from ..config.batching import Batching
from ..config.grpc import Grpc
from ..config.http import Http
from ..config.limits import Limits
from ..config.model import ModelConfig
from ..config.ports import Ports
from ..config.security import Legacy, Security
from ..config.served import ModelServing, Routing
from ..config.server import ServerConfig
from ..config.telemetry import Telemetry, telemetry_from
from ..config.workers import Workers
from ..errors import BertServeError, ConfigError
from ..model.default import default_model_dir
from ..model.hub_specs import fetch_hub_model, fetch_hub_models
from ..model.store_files import is_store_url
from .flag_help import Flag, boolean, under
from .http_flags import GRPC_FLAGS, HTTP_FLAGS, SECURITY_FLAGS
from .model_flags import MODEL_FLAGS
from .served import resolve_models, synced_version_dir
from .serving_flags import DEVICE_FLAGS, LIMIT_FLAGS, SERVING_FLAGS

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
    *GRPC_FLAGS,
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
            "with numbered versions (a directory or store URL): the one to serve, or latest",
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
        Flag(
            "--model-cache",
            "where a model at a store URL is synced to",
            unset="the user cache dir",
            metavar="DIR",
            rare=True,
        ),
        Flag("--keep-versions", "a store URL's versions kept in the cache, beside the one served", int, 2, rare=True),
        Flag(
            "--sync-max-bytes-per-s",
            "a store URL's download rate limit",
            float,
            unset="none",
            metavar="BYTES",
            rare=True,
        ),
    ),
]


def server_flag(name: str) -> Flag:
    """The ``bertserve start`` flag called ``name`` (``--api-key``)."""
    return next(flag for flag in [*SERVER_FLAGS, *MODEL_FLAGS] if flag.name == name)


def _table(*names: str) -> tuple[Flag, ...]:
    return tuple(server_flag(name) for name in names)


PART_FLAGS: dict[str, tuple[Flag, ...]] = {
    "ports": _table("--port", "--port-out", "--bind", "--http-port", "--grpc-port", "--metrics-port", "--worker-port"),
    "workers": _table(
        "--num-worker",
        "--prefetch-size",
        "--cpu",
        "--device-map",
        "--gpu-memory-fraction",
        "--threads-per-worker",
        "--worker-nice",
        "--feed",
        "--job-timeout-ms",
        "--heartbeat-timeout-ms",
        "--max-restarts",
        "--stop-timeout",
    ),
    "batching": _table(
        "--max-batch-size",
        "--max-batch-tokens",
        "--max-latency-ms",
        "--merge-requests",
        "--bulk-run-ms",
        "--bulk-slowdown",
    ),
    "limits": _table(
        "--max-request-size",
        "--max-text-chars",
        "--max-request-tokens",
        "--max-reply-bytes",
        "--request-timeout-ms",
        "--max-queued-sentences",
        "--max-client-queued-sentences",
        "--max-queued-bytes",
        "--max-message-bytes",
        "--reply-hwm",
    ),
    "http": _table(
        "--http-bind",
        "--max-http-body-bytes",
        "--max-http-body-bytes-total",
        "--max-http-body-bytes-per-principal",
        "--http-body-timeout-s",
        "--http-body-min-rate",
        "--max-http-connections",
        "--max-http-header-bytes",
        "--max-http-headers",
        "--http-header-timeout-s",
        "--forwarded-allow-ips",
        "--metrics-principals",
        "--cors-allow-origin",
    ),
    "grpc": _table(
        "--grpc-bind",
        "--grpc-tls-cert",
        "--grpc-tls-key",
        "--grpc-tls-client-ca",
        "--max-grpc-message-bytes",
        "--max-grpc-streams",
        "--max-grpc-calls-per-principal",
        "--max-grpc-calls",
        "--grpc-idle-timeout-s",
    ),
    "security": _table("--curve-dir", "--allow-terminate", "--api-key", "--api-keys"),
    "legacy": _table("--legacy-clients", "--show-tokens-to-client"),
}
"""The flags of each part of the server's config but its models, by the part's field."""
PARTS: dict[str, Callable[..., Any]] = {
    "ports": Ports,
    "workers": Workers,
    "batching": Batching,
    "limits": Limits,
    "http": Http,
    "grpc": Grpc,
    "security": Security,
    "legacy": Legacy,
}
SERVING_TABLE = _table(
    "--served-model-name",
    "--model-alias",
    "--num-worker",
    "--model-class",
    "--prompt",
    "--default-prompt-name",
    "--model-version",
    "--require-manifest",
    "--poll-interval-s",
    "--model-cache",
    "--keep-versions",
    "--sync-max-bytes-per-s",
    "--token-id-input",
    "--auto-truncate",
)
"""How each model is served (:class:`..config.served.ModelServing`); a ``--model`` may say its own."""
ROUTING_TABLE = _table("--model", "--models-dir", "--default-model")
"""Several models, and the one a request gets (:class:`..config.served.Routing`)."""


def model_config_from_args(args: argparse.Namespace, *, sync: bool = True) -> ModelConfig:
    """The model's config; a model given by its Hub id (``--model-id``) is fetched now, into
    the Hub cache, so that every process after this one reads its directory there. With
    ``sync``, a model at a store URL is synced into its cache now, and its newest version
    read from there (``bertserve start`` syncs later, with its serving options)."""
    options = {flag.dest: getattr(args, flag.dest) for flag in MODEL_FLAGS}
    if args.model_id is None:
        options["model_dir"] = args.model_dir or default_model_dir()
        config = ModelConfig.of(**options)
        if not sync or not is_store_url(config.model_dir):
            return config
        model = ModelServing(model=config, model_cache=getattr(args, "model_cache", None))
        return config.replace(model_dir=synced_version_dir(model), model_url=config.model_dir.rstrip("/"))
    if args.model_dir is not None:
        raise ConfigError(
            f"--model-id and --model-dir cannot be given together: --model-id {args.model_id} serves a model of the "
            f"Hub (from the Hub cache), --model-dir {args.model_dir} the one in a directory; give one of them"
        )
    ModelConfig.of(**{**options, "model_id": None, "model_dir": ""})  # the other options checked before a download
    return ModelConfig.of(**{**options, **fetch_hub_model(args.model_id)})


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The server's config, each part built from its own flags (:data:`PART_FLAGS`) and the
    models resolved (:func:`.served.resolve_models`); with several models (``--model``,
    ``--models-dir``) the model flags are every model's defaults. A value it refuses that came
    from a ``BERTSERVE_`` variable is refused by that variable's name."""
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


def values_of(args: argparse.Namespace, table: Sequence[Flag]) -> dict[str, Any]:
    return {flag.dest: getattr(args, flag.dest) for flag in table}


def _server_config(args: argparse.Namespace) -> ServerConfig:
    parts = {name: PARTS[name](**values_of(args, table)) for name, table in PART_FLAGS.items()}
    serving = values_of(args, SERVING_TABLE)
    given = values_of(args, ROUTING_TABLE)
    routing = {"models": given["models"], "models_dir": given["models_dir"], **_default_models(given["default_models"])}
    several = "--model" if routing["models"] else "--models-dir" if routing["models_dir"] is not None else None
    if several is None:
        Routing(**routing)
        if args.model_id is not None:  # every option checked before the model is fetched
            ServerConfig(models=(ModelServing(model=ModelConfig.of(model_dir=""), **serving),), **parts)
        flags = ModelServing(model=model_config_from_args(args, sync=False), **serving)
        models, resolved = resolve_models(flags, Routing(**routing))
        return ServerConfig(models=models, routing=resolved, **parts)
    one = next((flag for flag in ("--model-dir", "--model-id") if getattr(args, flag[2:].replace("-", "_"))), None)
    if one is not None:
        what = (
            "names each model with its directory or Hub id"
            if several == "--model"
            else "serves every model of a folder"
        )
        raise ConfigError(f"{one} and {several} cannot be given together: {one} serves one model, {several} {what}")
    model = ModelConfig.of(**{**values_of(args, MODEL_FLAGS), "model_dir": ""})
    flags = ModelServing(model=model, **serving)
    Routing(**routing, model_defaults=flags)
    ServerConfig(models=(flags,), **parts)  # every option checked before a model is fetched
    routing["models"] = fetch_hub_models(routing["models"])
    models, resolved = resolve_models(flags, Routing(**routing, model_defaults=flags))
    return ServerConfig(models=models, routing=resolved, **parts)


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
