"""The ``bertserve`` command line.

``bertserve embed`` encodes lines of text in this process with the ``Encoder`` and writes
a ``.npy`` file. Every model flag may also come from the environment as
``BERTSERVE_<FLAG>`` (``BERTSERVE_MAX_SEQ_LEN=64``); a flag on the command line wins.
This module imports TensorFlow only when a command needs it.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bertserve.client import __version__
from bertserve.client.cli import HelpFormatter, add_client_commands, read_lines, unset_help
from bertserve.client.terminal import paint, print_status

from .config import (
    CLIENT_QUEUED_SENTENCES,
    HTTP_BODY_BYTES_TOTAL,
    QUEUED_BYTES,
    QUEUED_SENTENCES,
    REQUEST_SIZE,
    ModelConfig,
    ServerConfig,
)
from .errors import BertServeError
from .logs import quiet_native_logs, setup_logging
from .model.default import default_model_dir

logger = logging.getLogger("bertserve.cli")


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
class _Flag:
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

    @property
    def dest(self) -> str:
        return self.name[2:].replace("-", "_")

    @property
    def env(self) -> str:
        return "BERTSERVE_" + self.dest.upper()

    def add_to(self, group: Any) -> None:
        raw = os.environ.get(self.env)
        default = self.default if raw is None else self._parse_env(raw)
        help = unset_help(self.help, default, self.unset) if self.unset else self.help
        options: dict[str, Any] = {"type": self.kind, "default": default, "help": help}
        if self.many:
            options["nargs"] = "+"
        if self.switch:
            options.update(nargs="?", const=True)
        group.add_argument(self.name, **options)

    def _parse_env(self, raw: str) -> Any:
        try:
            if self.many:
                return [self.kind(item) for item in raw.replace(",", " ").split()]
            return self.kind(raw)
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise BertServeError(f"{self.env}={raw!r}: {exc}") from None


_MODEL_DEFAULT = "the model's, or "  # what a plain BERT directory gets when the model says nothing

MODEL_FLAGS = [
    _Flag("--model-dir", "BERT model directory", unset="all-MiniLM-L6-v2 if installed"),
    _Flag("--tuned-model-dir", "fine-tuned checkpoint directory whose weights override the model's", unset="none"),
    _Flag("--ckpt-name", "checkpoint prefix (Google layout)", default="bert_model.ckpt"),
    _Flag("--config-name", "config file name (Google layout)", default="bert_config.json"),
    _Flag("--vocab-name", "vocabulary file name", unset="vocab.txt, or tokenizer.json"),
    _Flag(
        "--max-seq-len", "longest input in tokens, or NONE for each batch's own longest", unset=_MODEL_DEFAULT + "25"
    ),
    _Flag(
        "--pooling-strategy",
        "NONE, REDUCE_MEAN, REDUCE_MAX, REDUCE_MEAN_MAX, CLS_TOKEN, SEP_TOKEN, CLS_POOLED",
        unset=_MODEL_DEFAULT + "REDUCE_MEAN",
    ),
    _Flag(
        "--pooling-layer",
        "encoder layer(s) to pool, -1 the last; several are concatenated",
        int,
        many=True,
        unset=_MODEL_DEFAULT + "-2",
    ),
    _Flag("--mask-cls-sep", "leave [CLS] and [SEP] out of pooling", _bool, False, switch=True),
    _Flag("--normalize", "L2-normalize the output", _bool, switch=True, unset="what the model says"),
    _Flag("--do-lower-case", "lower-case the input", _bool, unset="what the vocabulary implies"),
    _Flag("--dtype", "fp32, bf16 or fp16 weights and matrix products", default="fp32"),
    _Flag("--output-dtype", "float32 or float16 vectors", default="float32"),
    _Flag("--xla", "XLA-compile the graph", _bool, False, switch=True),
    _Flag("--graph-dir", "where optimized graphs are cached", unset="the user cache dir"),
    _Flag("--batch-size", "most sentences in one model run", int, 64),
    _Flag("--lite-max-tokens", "fp32 runs of at most this many padded tokens run on LiteRT (0: never)", int, 64),
    _Flag(
        "--long-inputs",
        "an input over max_seq_len tokens: truncate it, or chunk it (windows, vectors combined)",
        default="truncate",
    ),
    _Flag("--chunk-stride", "tokens that consecutive windows of a chunked input share", int, 0),
]

SERVER_FLAGS = [
    _Flag("--num-worker", "worker processes on this machine (0 with a worker port: only remote ones)", int, 1),
    _Flag("--port", "port that takes requests", int, 5555),
    _Flag("--port-out", "port that publishes results", int, unset="--port + 1"),
    _Flag("--bind", "address to listen on (0.0.0.0 for every interface)", default="127.0.0.1"),
    _Flag("--max-batch-size", "most sentences in one mini-job", int, 256),
    _Flag("--max-batch-tokens", "most padded tokens in one bulk mini-job, so jobs take similar time", int, 4096),
    _Flag("--max-latency-ms", "most a small request for a busy worker waits for company", float, 10.0),
    _Flag("--merge-requests", "merge small requests from different clients into one mini-job", _bool, True),
    _Flag("--feed", "what receives and tokenizes a worker's next jobs: thread, or tfdata", default="thread"),
    _Flag("--prefetch-size", "jobs a worker holds at once; more than 1 makes small requests wait longer", int, 1),
    _Flag("--cpu", "run on the CPU even where a GPU is visible", _bool, False, switch=True),
    _Flag("--device-map", "GPU ids the workers take in turn", int, (), many=True, unset="every visible GPU"),
    _Flag("--gpu-memory-fraction", "share of its GPU's memory a worker may take", float, unset="grow as needed"),
    _Flag("--threads-per-worker", "TensorFlow threads per CPU worker", int, unset="the cores shared out"),
    _Flag("--worker-nice", "how much lower the workers' CPU priority is, so requests move while they compute", int, 5),
    _Flag(
        "--max-request-size",
        "most inputs in one request",
        int,
        unset=f"{REQUEST_SIZE}, at most --max-client-queued-sentences",
    ),
    _Flag("--max-text-chars", "most characters in one input", int, 100_000),
    _Flag("--request-timeout-ms", "a request unfinished after this gets an error reply", int, 600_000),
    _Flag(
        "--max-queued-sentences",
        "most inputs queued at once; past it requests get a busy error",
        int,
        unset=f"{QUEUED_SENTENCES}, at least the two bounds below",
    ),
    _Flag(
        "--max-client-queued-sentences",
        "most inputs one client may have queued",
        int,
        unset=f"{CLIENT_QUEUED_SENTENCES}, within --max-request-size and --max-queued-sentences",
    ),
    _Flag(
        "--max-queued-bytes",
        "memory the texts of queued requests may hold; past it requests get a busy error",
        int,
        QUEUED_BYTES,
    ),
    _Flag(
        "--max-message-bytes",
        "largest request frame; a larger one is dropped unread",
        int,
        unset="what the size limits need, at most 16 MiB and --max-queued-bytes",
    ),
    _Flag("--reply-hwm", "replies queued per client that does not read them; more are dropped", int, 100),
    _Flag("--job-timeout-ms", "a worker holding a job longer than this is killed and replaced", int, 120_000),
    _Flag("--heartbeat-timeout-ms", "a worker silent this long is killed and replaced", int, 10_000),
    _Flag("--max-restarts", "failures in a row of one process before the server gives up", int, 5),
    _Flag(
        "--curve-dir",
        "serve with CURVE: DIR/server.key_secret; client keys in DIR/clients, admins in DIR/admins",
        unset="plain TCP",
    ),
    _Flag("--allow-terminate", "let clients stop the server", _bool, unset="on loopback without CURVE, or admins"),
    _Flag("--legacy-clients", "answer bert-as-service 1.x's own client too", _bool, True, switch=True),
    _Flag("--show-tokens-to-client", "send bert-as-service clients each input's tokens", _bool, False, switch=True),
    _Flag(
        "--model-class",
        "MODULE:NAME of a class implementing bertserve.server.model.interface.Model",
        unset="BERT from --model-dir",
    ),
    _Flag(
        "--http-port",
        "also serve HTTP on this port: OpenAI /v1/embeddings, /embed, /encode, /metrics, ...",
        int,
        unset="no HTTP",
    ),
    _Flag("--http-bind", "address the HTTP port listens on", unset="--bind"),
    _Flag(
        "--api-key",
        "HTTP callers must send Authorization: Bearer KEY (principal 'default'); prefer BERTSERVE_API_KEY, "
        "since a command line is visible to every user of the machine",
        unset="none needed",
    ),
    _Flag(
        "--api-keys",
        "FILE of NAME KEY lines: each key a principal of its own (bounds, turns, metrics)",
        unset="none",
    ),
    _Flag(
        "--max-http-body-bytes",
        "largest HTTP request body; larger is refused with 413",
        int,
        unset="16 MiB, at most the request frame limit",
    ),
    _Flag(
        "--max-http-body-bytes-total",
        "HTTP bodies held at once, each counted as its bytes plus 64 per comma, 232 per '{' and 88 per '['; "
        "past it 429",
        int,
        HTTP_BODY_BYTES_TOTAL,
    ),
    _Flag(
        "--metrics-port",
        "serve Prometheus /metrics alone on this port (with --http-port it is at /metrics)",
        int,
        unset="none",
    ),
    _Flag(
        "--model-version", "with --model-dir a base of numbered versions: the one to serve, or latest", default="latest"
    ),
    _Flag("--require-manifest", "refuse a model version without its bertserve.sha256", _bool, False, switch=True),
    _Flag(
        "--poll-interval-s",
        "with a repository of versions: look for a newer one this often and swap to it (0: only on `bertserve reload`)",
        float,
        0.0,
    ),
    _Flag(
        "--worker-port",
        "let remote workers (`bertserve worker`) join on this port: jobs, credits and results",
        int,
        unset="local workers only",
    ),
    _Flag("--served-model-name", "the model name the HTTP API lists and accepts", unset="the model directory's"),
    _Flag("--model-alias", "other names the HTTP API accepts for the model", many=True, default=(), unset="none"),
]


def _server_flag(name: str) -> _Flag:
    return next(flag for flag in [*SERVER_FLAGS, *MODEL_FLAGS] if flag.name == name)


WORKER_FLAGS = [
    _Flag("--server", "the head's host name or address", unset="required"),
    _Flag("--worker-port", "the head's --worker-port", int, unset="required"),
    _Flag("--num-worker", "worker processes on this machine", int, 1),
    _Flag(
        "--model-dir",
        "this machine's copy of the head's model directory (checked by sha256)",
        unset="all-MiniLM-L6-v2 if installed",
    ),
    _server_flag("--tuned-model-dir"),
    _server_flag("--graph-dir"),
    _Flag("--prefetch-size", "jobs a worker holds at once: its credits; give faster devices more", int, 1),
    *(_server_flag(name) for name in ("--cpu", "--device-map", "--gpu-memory-fraction", "--threads-per-worker")),
    *(_server_flag(name) for name in ("--worker-nice", "--feed", "--max-restarts")),
    _server_flag("--model-class"),  # the only class it may import: the head must serve the same
    _Flag(
        "--client-cert",
        "CURVE: this worker's NAME.key_secret, whose NAME.key is in the head's workers/",
        unset="plain TCP",
    ),
    _Flag("--server-key", "CURVE: the head's public key (its server.key file or z85 text)", unset="plain TCP"),
    _Flag("--health-port", "serve GET /health and /ready on this port, for container probes", int, unset="none"),
    _Flag("--health-bind", "address the health port listens on", default="127.0.0.1"),
]


def _add_flags(parser: argparse.ArgumentParser, title: str, flags: list[_Flag]) -> None:
    group = parser.add_argument_group(title)
    for flag in flags:
        flag.add_to(group)


def model_config_from_args(args: argparse.Namespace) -> ModelConfig:
    options = {flag.dest: getattr(args, flag.dest) for flag in MODEL_FLAGS}
    options["model_dir"] = args.model_dir or default_model_dir()
    return ModelConfig(**options)


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    options = {flag.dest: getattr(args, flag.dest) for flag in SERVER_FLAGS}
    return ServerConfig(model=model_config_from_args(args), **options)


def _cmd_start(args: argparse.Namespace) -> int:
    config = server_config_from_args(args)
    if config.api_key is not None and os.environ.get(_server_flag("--api-key").env) != args.api_key:
        logger.warning("--api-key on the command line is visible to every user of this machine (ps); "
                       "prefer BERTSERVE_API_KEY or --api-keys FILE")  # fmt: skip
    # Every process of this server writes its metrics here; prometheus_client reads the
    # variable when it is first imported, so it is set before anything imports it.
    metrics_dir = tempfile.mkdtemp(prefix="bertserve-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        return _serve(config, args)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _serve(config: ServerConfig, args: argparse.Namespace) -> int:
    from .serving.supervisor import BertServer

    server = BertServer(config, log_level=logging.DEBUG if args.verbose else logging.INFO)
    server.install_signal_handlers()
    server.run(on_ready=lambda info: announce_ready(config, info))
    return 0


def announce_ready(config: ServerConfig, info: dict[str, Any]) -> None:
    """The one line on stdout that says the server serves (green on a terminal); scripts
    and tests wait for it."""
    line = (
        f"bertserve {__version__} ready: requests on tcp://{config.bind}:{config.port}, "
        f"results on port {config.port_out}, {config.num_worker} worker(s), "
        f"{info.get('pooling_strategy')} of layer(s) {info.get('pooling_layer')}, "
        f"dim {info.get('output_dim')}, {info.get('dtype')}, model {info.get('model_dir') or config.model.model_dir}"
    )
    if str(info.get("model_version", "")).isdigit():  # a version of a model repository
        line += f" (version {info['model_version']})"
    if config.http_port is not None:
        line += f", HTTP on http://{config.http_bind or config.bind}:{config.http_port}"
    if config.worker_port is not None:
        line += f", remote workers join on tcp://{config.bind}:{config.worker_port}"
    print(paint(line, "green", sys.stdout), flush=True)


def _cmd_worker(args: argparse.Namespace) -> int:
    from .serving.remote import HostConfig, WorkerHost

    missing = [flag for flag in ("--server", "--worker-port") if getattr(args, flag[2:].replace("-", "_")) is None]
    if missing:
        raise BertServeError(f"bertserve worker needs {' and '.join(missing)}: where the head lets workers join")
    options = {flag.dest: getattr(args, flag.dest) for flag in WORKER_FLAGS}
    options["model_dir"] = args.model_dir or default_model_dir()
    host = WorkerHost(HostConfig(**options), log_level=logging.DEBUG if args.verbose else logging.INFO)
    host.install_signal_handlers()
    return host.run()


def _cmd_export(args: argparse.Namespace) -> int:
    from .model.export import export_saved_model

    config = model_config_from_args(args)
    description = export_saved_model(config, args.out)
    print(
        f"wrote a SavedModel to {args.out}: signature serving_default(input_ids, input_mask, segment_ids) -> "
        f"embeddings [batch, {description['output_dim']}], {description['pooling_strategy']}, {description['dtype']}",
        file=sys.stderr,
    )
    return 0


def _cmd_manifest(args: argparse.Namespace) -> int:
    from .model.checksum import manifest_problems, write_manifest

    if not os.path.isdir(args.directory):
        raise BertServeError(f"{args.directory} is not a directory")
    if not args.check:
        path, count = write_manifest(args.directory)
        print(f"wrote {path}: {count} files", file=sys.stderr)
        return 0
    try:
        problems = manifest_problems(args.directory)
    except FileNotFoundError:
        raise BertServeError(f"{args.directory} has no manifest: write one with `bertserve manifest DIR`") from None
    for problem in problems:
        print_status("error", problem)
    if not problems:
        print(f"{args.directory}: every file matches its manifest", file=sys.stderr)
    return 1 if problems else 0


def _cmd_embed(args: argparse.Namespace) -> int:
    import numpy as np

    config = model_config_from_args(args)
    texts = read_lines(args.input)
    from .model.encoder import Encoder

    encoder = Encoder(config)
    vectors = encoder.encode(texts)
    np.save(args.output, vectors)
    print(f"wrote {vectors.shape[0]} vectors of dimension {vectors.shape[-1]} to {args.output}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertserve", description="BERT sentence embeddings, served.", formatter_class=HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"bertserve {__version__}")
    _add_verbose(parser, default=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    embed = commands.add_parser(
        "embed", help="encode lines of text in this process, write a .npy file", formatter_class=HelpFormatter
    )
    embed.add_argument("input", nargs="?", default="-", help="text file, one sentence a line (default: stdin)")
    embed.add_argument("-o", "--output", default="embeddings.npy", help="where to write the vectors")
    _add_verbose(embed)
    _add_flags(embed, "model", MODEL_FLAGS)
    embed.set_defaults(run=_cmd_embed)

    manifest = commands.add_parser(
        "manifest",
        help="write DIR/bertserve.sha256 (sha256 of every model file), or --check a copy against it",
        formatter_class=HelpFormatter,
    )
    manifest.add_argument("directory", help="a model directory")
    manifest.add_argument("--check", action="store_true", help="check the files against the manifest instead")
    manifest.set_defaults(run=_cmd_manifest)

    export = commands.add_parser(
        "export",
        help="write the optimized graph as a TensorFlow SavedModel (for TF Serving or Triton)",
        formatter_class=HelpFormatter,
    )
    export.add_argument("--out", required=True, help="directory to write (new, or empty)")
    _add_verbose(export)
    _add_flags(export, "model", MODEL_FLAGS)
    export.set_defaults(run=_cmd_export)

    start = commands.add_parser(
        "start",
        help="start the server in the foreground (Ctrl-C or `bertserve stop` ends it)",
        formatter_class=HelpFormatter,
    )
    _add_verbose(start)
    _add_flags(start, "model", MODEL_FLAGS)
    _add_flags(start, "serving", SERVER_FLAGS)
    start.set_defaults(run=_cmd_start)

    worker = commands.add_parser(
        "worker",
        help="run workers on this machine for a head started with --worker-port (Ctrl-C ends them)",
        description="Worker processes that join a head over tcp. The model options come from the head; "
        "this machine's model files must be the same (checked by sha256).",
        formatter_class=HelpFormatter,
    )
    _add_verbose(worker)
    _add_flags(worker, "worker", WORKER_FLAGS)
    worker.set_defaults(run=_cmd_worker)
    add_client_commands(commands)
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


def _show_warning(message: Warning | str, *args: Any, **kwargs: Any) -> None:
    print_status("warning", str(message))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        setup_logging(logging.DEBUG if args.verbose else logging.INFO)
        quiet_native_logs(args.verbose)  # before anything imports TensorFlow, here or in a worker
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning  # "bertserve: warning: ...", not a source line
            return int(args.run(args))
    except ImportError as exc:  # a client-only install running a server command
        print_status("error", f"{exc}; the server needs: pip install 'bertserve[server]'")
        return 2
    except (BertServeError, ValueError, TypeError, OSError) as exc:
        print_status("error", str(exc))
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
