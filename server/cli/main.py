"""The ``bertserve`` command line: its parser, its commands, and ``main``.

``bertserve embed`` encodes lines of text in this process with the ``Encoder`` and writes
a ``.npy`` file. The flags, and the configs they build, are in :mod:`.flags`. This module
imports TensorFlow only when a command needs it.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any

from bertserve.client import __version__
from bertserve.client.cli import HelpFormatter, add_client_commands
from bertserve.client.lines import numbered, read_lines, save, skipped_note, source_name, unpaired_warning
from bertserve.client.protocol import one_sentence
from bertserve.client.terminal import paint, print_status

from ..config.server import ServerConfig
from ..config.telemetry import Telemetry
from ..dependencies import install_command, missing_server_requirements
from ..errors import BertServeError
from ..logs import json_line, quiet_native_logs, setup_logging
from ..model.hardware import short_reason
from .flag_help import add_flags, parse_args
from .flags import (
    MODEL_FLAGS,
    SERVER_FLAGS,
    model_config_from_args,
    server_config_from_args,
    server_flag,
    telemetry_from_args,
)
from .models_command import add_model_dir_commands
from .serving_flags import TELEMETRY_FLAGS
from .worker_flags import WORKER_FLAGS, worker_options_from_args

logger = logging.getLogger("bertserve.cli")

SERVER_COMMANDS = frozenset({"start", "worker", "embed", "calibrate", "export"})  # they need the `server` extra
_ROLES = {"start": "head", "worker": "host"}  # what a JSON log line calls the process a command runs in


def _cmd_start(args: argparse.Namespace) -> int:
    config = server_config_from_args(args)
    if config.security.api_key is not None and os.environ.get(server_flag("--api-key").env) != args.api_key:
        logger.warning(
            "--api-key on the command line is visible to every user of this machine (ps); "
            "prefer BERTSERVE_API_KEY or --api-keys FILE"
        )
    # Every process of this server writes its metrics here; prometheus_client reads the
    # variable when it is first imported, so it is set before anything imports it.
    metrics_dir = tempfile.mkdtemp(prefix="bertserve-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        return _serve(config, args)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _serve(config: ServerConfig, args: argparse.Namespace) -> int:
    from ..serving.process.supervisor import BertServer

    telemetry = telemetry_from_args(args)
    server = BertServer(config, telemetry=telemetry)
    server.install_signal_handlers()
    server.run(on_ready=lambda info: announce_ready(config, info, json_logs=telemetry.json_logs))
    return 0


def _output_text(info: dict[str, Any]) -> str:
    """What the model answers: its pooling and width, or its task's head."""
    task = info.get("task") or "embed"
    if task == "embed":
        return f"{info.get('pooling_strategy')} of layer(s) {info.get('pooling_layer')}, dim {info.get('output_dim')}"
    if task == "sparse":
        return f"task sparse (SPLADE), {info.get('output_dim')} vocabulary weights"
    labels = info.get("labels") or []
    if task == "rerank":
        return f"task rerank (a cross-encoder; scores through {info.get('activation')})"
    return (
        f"task classify, {len(labels)} labels ({', '.join(map(str, labels[:4]))}{', ...' if len(labels) > 4 else ''})"
    )


def announce_ready(config: ServerConfig, info: dict[str, Any], *, json_logs: bool = False) -> None:
    """The one line on stdout that says the server serves (bold green on a terminal, to stand
    out among the log's green lines); scripts and tests wait for it. With several models,
    ``info`` describes the default one. With ``json_logs`` it is a JSON line like the log's,
    its facts as fields of their own (:func:`ready_fields`)."""
    served = config.models
    line = (
        f"bertserve {__version__} ready: requests on tcp://{config.ports.bind}:{config.ports.port}, "
        f"results on port {config.ports.out}, {_workers_text(sum(config.num_workers()))}, "
        f"{_output_text(info)}, {dtype_text(info)}, model {model_text(config, info)}"
    )
    if len(served) > 1:
        dtypes = {m.get("name"): m.get("dtype") for m in info.get("models") or [] if isinstance(m, dict)}
        names = ", ".join(f"{e.name} ({dtypes[e.name]})" if dtypes.get(e.name) else e.name for e in served)
        line += f" (the default of {len(served)} models: {names})"
    if str(info.get("model_version", "")).isdigit():  # a version of a model repository
        line += f" (version {info['model_version']})"
    if config.ports.http_port is not None:
        line += f", HTTP on http://{config.http.http_bind or config.ports.bind}:{config.ports.http_port}"
    if config.ports.grpc_port is not None:
        scheme = "grpcs" if config.grpc.tls else "grpc"
        line += f", gRPC on {scheme}://{config.grpc.grpc_bind or config.ports.bind}:{config.ports.grpc_port}"
    if config.ports.worker_port is not None:
        line += f", remote workers join on tcp://{config.ports.bind}:{config.ports.worker_port}"
    if json_logs:
        print(json_line(line, role=_ROLES["start"], **ready_fields(config, info)), flush=True)
    else:
        print(paint(line, "green", sys.stdout, bold=True), flush=True)


def ready_fields(config: ServerConfig, info: dict[str, Any]) -> dict[str, Any]:
    """The ready line's facts, as the fields of its JSON line (``event``: ``ready``)."""
    served = config.models
    return {
        "event": "ready",
        "version": __version__,
        "address": f"tcp://{config.ports.bind}:{config.ports.port}",
        "port": config.ports.port,
        "port_out": config.ports.out,
        "workers": sum(config.num_workers()),
        "models": [entry.name for entry in served],
        "default_model": served[0].name,
        "model_dir": model_text(config, info),
        **{key: info.get(key) for key in ("task", "output_dim", "pooling_strategy", "pooling_layer", "dtype")},
        "http": f"http://{config.http.http_bind or config.ports.bind}:{config.ports.http_port}"
        if config.ports.http_port
        else None,
        "http_port": config.ports.http_port,
        "grpc_port": config.ports.grpc_port,
        "worker_port": config.ports.worker_port,
    }


def _workers_text(count: int) -> str:
    return "1 worker" if count == 1 else f"{count} workers"


def model_text(config: ServerConfig, info: dict[str, Any]) -> str:
    """The ready line's model: its directory, or for a model of the Hub its id, the revision
    asked for and the commit served (``BAAI/bge-small-en-v1.5@main (commit 5c38ec7...)``)."""
    model = config.model
    if model.model_id is None:
        return str(info.get("model_dir") or model.model_dir)
    return f"{model.model_id}@{model.model_revision} (commit {model.model_commit})"


def dtype_text(info: dict[str, Any]) -> str:
    """The ready line's dtype: the one the workers run, and, when ``auto`` chose it, why."""
    dtype, reason = info.get("dtype"), info.get("dtype_reason")
    if dtype == "auto":  # no worker has told yet: remote ones each decide on their own machine
        return "auto (each worker decides for its own device)"
    small = ""
    if info.get("small_run_dtype"):
        small = f"runs of up to {info.get('lite_max_tokens')} tokens in {info['small_run_dtype']} on LiteRT"
    if info.get("dtype_requested") != "auto" or not reason:
        return f"{dtype} ({small})" if small else str(dtype)
    return f"{dtype} (auto: {short_reason(str(reason))}{'; ' + small if small else ''})"


def _cmd_worker(args: argparse.Namespace) -> int:
    from ..serving.remote.config import HostConfig
    from ..serving.remote.host import WorkerHost

    missing = [flag for flag in ("--server", "--worker-port") if getattr(args, flag[2:].replace("-", "_")) is None]
    if missing:
        raise BertServeError(f"bertserve worker needs {' and '.join(missing)}: where the head lets workers join")
    config = HostConfig(**worker_options_from_args(args))
    host = WorkerHost(config, telemetry=telemetry_from_args(args))
    host.install_signal_handlers()
    return host.run()


def _cmd_export(args: argparse.Namespace) -> int:
    from ..model.export import export_saved_model

    config = model_config_from_args(args)
    description = export_saved_model(config, args.out)
    print(
        f"wrote a SavedModel to {args.out}: signature serving_default(input_ids, input_mask, segment_ids) -> "
        f"embeddings [batch, {description['output_dim']}], {description['pooling_strategy']}, {description['dtype']}",
        file=sys.stderr,
    )
    return 0


def _cmd_embed(args: argparse.Namespace) -> int:
    """As ``bertserve encode`` does on a server: one vector a line, blank lines and empty input
    refused unless ``--skip-blank``, and ``|||`` a sentence pair only with ``--pairs``."""
    source = source_name(args.input)
    lines = numbered(read_lines(args.input, keep_blank=True), source, skip_blank=args.skip_blank)
    if not args.pairs and (unpaired := unpaired_warning(lines, source, False)):
        print_status("warning", unpaired)
    texts = lines.texts if args.pairs else [one_sentence(text) for text in lines.texts]
    config = model_config_from_args(args)
    from ..model.opening import open_model

    vectors = open_model(config).encode(texts)
    written = save(args.output, vectors, lines.numbers)
    if skipped := skipped_note(lines, source, written):
        print(skipped, file=sys.stderr)
    count = vectors.shape[0]
    print(
        f"wrote {count} vector{'' if count == 1 else 's'} of dimension {vectors.shape[-1]} to {written}",
        file=sys.stderr,
    )
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    """Encode the input's lines in this process and write each dimension's range, which the
    int8 and uint8 embedding types cut into 256 steps."""
    from ..model.calibration import CALIBRATION_FILE, write_calibration
    from ..model.encoder import Encoder

    source = source_name(args.input)
    lines = numbered(read_lines(args.input, keep_blank=True), source, skip_blank=True)
    config = model_config_from_args(args)
    encoder = Encoder(config)
    if encoder.head.task != "embed" or encoder.token_level:
        raise BertServeError("calibration ranges are for sentence vectors: this model answers scores or token vectors")
    vectors = encoder.encode([one_sentence(text) for text in lines.texts])
    out = args.out or os.path.join(config.model_dir, CALIBRATION_FILE)
    write_calibration(out, vectors)
    print(f"wrote {out}: the ranges of {vectors.shape[1]} dimensions over {len(vectors)} sentences", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertserve", description="BERT sentence embeddings, served.", formatter_class=HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"bertserve {__version__}")
    _add_verbose(parser, default=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    start = commands.add_parser(
        "start",
        help="start the server in the foreground (Ctrl-C or `bertserve stop` ends it)",
        usage="%(prog)s [options]",
        formatter_class=HelpFormatter,
    )
    _add_verbose(start)
    add_flags(start, [*MODEL_FLAGS, *SERVER_FLAGS, *TELEMETRY_FLAGS], docs="docs/server.md")
    start.set_defaults(run=_cmd_start)

    worker = commands.add_parser(
        "worker",
        help="run workers on this machine for a head started with --worker-port (Ctrl-C ends them)",
        description="Worker processes that join a head over tcp. The model options come from the head; "
        "this machine's model files must be the same (checked by sha256).",
        usage="%(prog)s --server HOST --worker-port PORT [options]",
        formatter_class=HelpFormatter,
    )
    _add_verbose(worker)
    add_flags(worker, [*WORKER_FLAGS, *TELEMETRY_FLAGS], docs="docs/deployment.md and docs/server.md")
    worker.set_defaults(run=_cmd_worker)
    add_client_commands(commands)

    embed = commands.add_parser(
        "embed",
        help="encode lines of text in this process, write a .npy file",
        usage="%(prog)s [options] [input]",
        formatter_class=HelpFormatter,
    )
    embed.add_argument("input", nargs="?", default="-", help="text file, one sentence a line (default: stdin)")
    embed.add_argument(
        "-o",
        "--output",
        default="embeddings.npy",
        metavar="FILE",
        help="where to write the vectors (NAME.npz: with line numbers)",
    )
    embed.add_argument("--skip-blank", action="store_true", help="leave blank lines out and name them, not fail")
    embed.add_argument(
        "--pairs",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="read a line 'first ||| second' as a sentence pair (default: off, one sentence a line)",
    )
    _add_verbose(embed)
    add_flags(embed, MODEL_FLAGS, docs="docs/server.md")
    embed.set_defaults(run=_cmd_embed)

    calibrate = commands.add_parser(
        "calibrate",
        help="write the ranges the int8 and uint8 embedding types need, from a file of sentences",
        usage="%(prog)s [options] [input]",
        description="Encode the sentences of a text file (one a line; a few thousand like the ones the server "
        "will see) and write each dimension's minimum and maximum to MODEL_DIR/calibration.json, where the "
        "server finds them, or to --out.",
        formatter_class=HelpFormatter,
    )
    calibrate.add_argument("input", nargs="?", default="-", help="text file, one sentence a line (default: stdin)")
    calibrate.add_argument(
        "--out", metavar="FILE", help="where to write the ranges (default: calibration.json in the model directory)"
    )
    _add_verbose(calibrate)
    add_flags(calibrate, MODEL_FLAGS, docs="docs/server.md")
    calibrate.set_defaults(run=_cmd_calibrate)

    export = commands.add_parser(
        "export",
        help="write the optimized graph as a TensorFlow SavedModel (for TF Serving or Triton)",
        usage="%(prog)s --out DIR [options]",
        formatter_class=HelpFormatter,
    )
    export.add_argument("--out", required=True, metavar="DIR", help="directory to write (new, or empty)")
    _add_verbose(export)
    add_flags(export, MODEL_FLAGS, docs="docs/server.md")
    export.set_defaults(run=_cmd_export)

    add_model_dir_commands(commands)
    return parser


def _add_verbose(parser: argparse.ArgumentParser, default: Any = argparse.SUPPRESS) -> None:
    """``-v`` before the command (``default=False``) or after it (``bertserve start -v``,
    which leaves the first one's value alone unless given)."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default,
        help="log debug messages, and show TensorFlow's and LiteRT's C++ lines",
    )


def _check_server_requirements(command: str) -> None:
    """Before server command ``command`` does anything: the server's packages are all installed."""
    missing = missing_server_requirements()
    if missing:
        names = [requirement.name for requirement in missing]
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        raise BertServeError(
            f"`bertserve {command}` needs the server's packages, and {listed} {'is' if len(names) == 1 else 'are'} "
            f"not installed; install them with: {install_command(missing)}"
        )


def _say(kind: str, message: str, json_role: str | None) -> None:
    """A warning or an error of the command: ``bertserve: error: ...`` on stderr, or with
    ``--log-format json`` a JSON line like the log's, of the process's role (``json_role``)."""
    if json_role is not None:
        level = logging.ERROR if kind == "error" else logging.WARNING
        print(json_line(message, level=level, role=json_role), file=sys.stderr, flush=True)
    else:
        print_status(kind, message)


def main(argv: Sequence[str] | None = None) -> int:
    json_role = None  # with --log-format json, the role its JSON lines name
    try:
        args = parse_args(build_parser(), argv)
        if args.command in SERVER_COMMANDS:  # said in words: the JSON writer may be what is missing
            _check_server_requirements(args.command)
        if getattr(args, "log_format", "text") == "json":
            json_role = _ROLES[args.command]
        # Only start and worker log for a server's processes and trace: a client command reads no OTEL_* variable.
        telemetry = (
            telemetry_from_args(args)
            if args.command in _ROLES
            else Telemetry(logging.DEBUG if args.verbose else logging.INFO)
        )
        setup_logging(telemetry.level, json=telemetry.json_logs, role=_ROLES.get(args.command, "cli"))
        quiet_native_logs(args.verbose)  # before anything imports TensorFlow, here or in a worker
        with warnings.catch_warnings():
            # "bertserve: warning: ...", not a source line
            warnings.showwarning = lambda message, *_, **__: _say("warning", str(message), json_role)
            return int(args.run(args))
    except ImportError as exc:  # a server package gone since the check, or there but broken
        missing = missing_server_requirements()
        _say("error", f"{exc}; install them with: {install_command(missing)}" if missing else str(exc), json_role)
        return 2
    except (BertServeError, ValueError, TypeError, OSError) as exc:
        _say("error", str(exc), json_role)
        return 2
    except KeyboardInterrupt:
        return 130
