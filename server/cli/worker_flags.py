"""The flags of ``bertserve worker`` (a worker host: :class:`..serving.remote.config.HostConfig`),
and its options from them. Its workers take the flags ``bertserve start``'s workers take; a
model at a store URL is synced here, before the host joins its head."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..config.model import ModelConfig
from ..config.served import ModelServing
from ..config.workers import Workers
from ..errors import ConfigError
from ..model.default import default_model_dir
from ..model.hub_specs import fetch_hub_model
from ..model.store_files import is_store_url
from .flag_help import Flag, under
from .flags import server_flag, values_of
from .served import synced_version_dir

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
            "this machine's copy of the head's model directory (checked by sha256), or the store URL it is synced "
            "from (s3://, gs://, hdfs://, https://)",
            unset="all-MiniLM-L6-v2 if installed",
        ),
        Flag(
            "--model-version",
            "with a store URL of numbered versions: the one the head serves, or latest",
            default="latest",
            metavar="VERSION",
        ),
        Flag(
            "--model-id",
            "the head's model by its Hub id, ORG/NAME[@REVISION]: fetched into this machine's Hub cache "
            "(checked by sha256 like a directory)",
            unset="--model-dir",
        ),
    ),
    server_flag("--tuned-model-dir"),
    server_flag("--model-cache"),
    server_flag("--sync-max-bytes-per-s"),
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


HOST_WORKERS_TABLE = tuple(flag for flag in WORKER_FLAGS if flag.dest in {f.name for f in dataclasses.fields(Workers)})
"""The flags of a worker host's workers (:class:`..config.workers.Workers`, as ``bertserve start``'s)."""


def worker_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of a worker host's config (``bertserve worker``), its workers a
    part of their own."""
    options = {flag.dest: getattr(args, flag.dest) for flag in WORKER_FLAGS if flag not in HOST_WORKERS_TABLE}
    options["workers"] = Workers(**values_of(args, HOST_WORKERS_TABLE))
    model_id = options.pop("model_id")
    wanted, cache, rate = (options.pop(key) for key in ("model_version", "model_cache", "sync_max_bytes_per_s"))
    if model_id is None and args.model_dir is not None and is_store_url(args.model_dir):
        # the host syncs from the store itself, checked by the manifest; the head checks the sha256
        model = ModelConfig.of(model_dir=args.model_dir)
        serving = ModelServing(model=model, model_version=wanted, model_cache=cache, sync_max_bytes_per_s=rate)
        options["model_dir"] = synced_version_dir(serving)
    elif model_id is None:
        options["model_dir"] = args.model_dir or default_model_dir()
    elif args.model_dir is not None:
        raise ConfigError(
            f"--model-id and --model-dir cannot be given together: give --model-id {model_id} or a directory"
        )
    else:
        options["model_dir"] = fetch_hub_model(model_id)["model_dir"]  # the head checks its files' sha256
    return options
