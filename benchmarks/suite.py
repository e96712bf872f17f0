"""End-to-end benchmark suite: real bertserve server processes, started on free ports.

Two sub-commands; each starts its own servers (``python -m bertserve.server.cli start``),
waits for the ``bertserve ... ready: ...`` line, measures, and stops them with SIGTERM.

``sweep``: varies one thing at a time from a base configuration and reports, per point,
sentences/second and the p50/p90/p99 request latency. Client-side parameters (request size,
concurrent clients) run on the base server, which stays up for the whole sweep; server-side
parameters (max_seq_len, max_batch_size, pooling_layer, dtype, workers) start a server for
every value but the base one, all sharing one graph cache.

``compare``: on benchmarks/data/corpus.txt, side by side in one run, repeated round-robin:
the server end to end (fp32, bf16, and int8 and auto where this bertserve has them), the
in-process Encoder, sentence-transformers, ONNX Runtime fp32 and int8, 32 single-sentence
clients with and without cross-client merging, latency under load, memory, cold and warm
start, padding, each contender's share of this machine's matmul ceiling; then a table of
targets, each PASS or MISS.

    python benchmarks/suite.py sweep --json benchmarks/results/sweep.json --plots benchmarks/results/plots
    python benchmarks/suite.py compare --json benchmarks/results/compare.json --plots benchmarks/results/plots
    python benchmarks/suite.py sweep --quick --model-dir /tmp/tiny_bert      # a seconds-long smoke run

Progress goes to stderr, the markdown tables to stdout. The command line is here; the runs
are in ``comparing/`` (``sweep``; ``compare`` with its latency, roofline, targets and report;
the servers and the load both start), built on the one launcher the tests use
(``bertserve.server.testing.launcher``) and on the benchmarks' library, ``lib/`` (inputs,
RSS, statistics, reports).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from comparing.compare import run_compare
from comparing.report import compare_markdown, plot_compare
from comparing.servers import BenchmarkError
from comparing.sweep import SWEEP_PARAMETERS, plot_sweep, run_sweep, sweep_markdown
from lib.inputs import DEFAULT_CORPUS, NO_MODEL_HINT, resolve_model_dir
from lib.report import Progress, format_load, write_report

# ----------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------

QUICK_DEFAULTS: dict[str, dict[str, Any]] = {
    "sweep": {"duration": 0.5, "max_seq_len": 32, "client_load": "1x16", "server_load": "2x32"},
    "compare": {
        "duration": 0.5,
        "latency_duration": 0.5,
        "repeats": 1,
        "idle_requests": 5,
        "start_repeats": 1,
        "max_seq_len": 32,
        "limit": 300,
        "clients": 8,
        "bulk_request": 256,
    },
}


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--model-dir", type=Path, default=None, help="model directory (default: all-MiniLM-L6-v2 if installed)")
    add("--graph-dir", type=Path, default=None, help="graph cache shared by every server (default: bertserve's)")
    add("--corpus", type=Path, default=DEFAULT_CORPUS, help="one sentence a line (default: %(default)s)")
    add("--max-seq-len", type=int, default=None, help="base max_seq_len (default: 128; 32 with --quick)")
    add("--duration", type=float, default=None, help="seconds of load per point (default: 10; 0.5 with --quick)")
    add("--quick", action="store_true", help="a seconds-long smoke run: tiny durations, few points")
    add("--json", type=Path, default=None, metavar="PATH", help="write the results as JSON")
    add("--markdown", type=Path, default=None, metavar="PATH", help="write the markdown report here too")
    add("--plots", type=Path, default=None, metavar="DIR", help="write PNG plots into DIR")


def _two_ratios(text: str) -> tuple[float, float]:
    try:
        fp32, bf16 = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers like 1.5,3, not {text!r}") from None
    return fp32, bf16


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sweep = commands.add_parser("sweep", help="vary one parameter at a time from a base configuration")
    add_common_arguments(sweep)
    names = ", ".join(p.name for p in SWEEP_PARAMETERS)
    add = sweep.add_argument
    add(
        "--only",
        action="append",
        choices=[p.name for p in SWEEP_PARAMETERS],
        metavar="PARAM",
        help=f"run only this parameter (repeatable): {names}",
    )
    add(
        "--client-load",
        default=None,
        metavar="CxB",
        help="base load of the client-side sweeps: C clients of B sentences (default: 1x16)",
    )
    add(
        "--server-load",
        default=None,
        metavar="CxB",
        help="load of the server-side sweeps (default: 4x256, enough to keep workers busy)",
    )
    compare = commands.add_parser("compare", help="server vs Encoder vs sentence-transformers, with targets")
    add_common_arguments(compare)
    add = compare.add_argument
    add("--repeats", type=int, default=None, help="rounds, interleaved (default: 3)")
    add("--limit", type=int, default=None, help="use only the first N sentences of the corpus")
    add(
        "--batch-size",
        type=int,
        default=None,
        help="sentences per model run of the in-process contenders (default: the server's)",
    )
    add("--bulk-request", type=int, default=None, help="sentences per bulk request (default: 4096)")
    add("--clients", type=int, default=None, help="single-sentence clients (default: 32)")
    add("--latency-duration", type=float, default=None, help="seconds of single requests under load (default: 20)")
    add("--idle-requests", type=int, default=None, help="single requests timed on the idle server (default: 50)")
    add("--start-repeats", type=int, default=None, help="cold and warm starts timed (default: 3)")
    add("--no-sentence-transformers", action="store_true", help="leave sentence-transformers out")
    add("--no-onnx", action="store_true", help="leave ONNX Runtime (fp32 and int8) out")
    add("--no-roofline", action="store_true", help="do not measure this machine's matmul rates")
    add(
        "--st-targets",
        type=_two_ratios,
        default=(1.5, 3.0),
        metavar="FP32,BF16",
        help="server / sentence-transformers throughput goals (default: 1.5,3; 2,4 for corpus-long.txt)",
    )
    return parser


FULL_DEFAULTS: dict[str, dict[str, Any]] = {
    "sweep": {"duration": 10.0, "max_seq_len": 128, "client_load": "1x16", "server_load": "4x256"},
    "compare": {
        "duration": 10.0,
        "latency_duration": 20.0,
        "repeats": 3,
        "idle_requests": 50,
        "start_repeats": 3,
        "max_seq_len": 128,
        "limit": None,
        "clients": 32,
        "bulk_request": 4096,
    },
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Options left out take the full or the ``--quick`` defaults."""
    parser = build_parser()
    args = parser.parse_args(argv)
    defaults = (QUICK_DEFAULTS if args.quick else FULL_DEFAULTS)[args.command]
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.command == "compare" and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def emit(markdown: str, report: Any, plots: Callable[[Path], list[Path]], args: argparse.Namespace) -> None:
    write_report(asdict(report), markdown, args.json, args.markdown)
    if args.plots is not None:
        for path in plots(args.plots):
            print(f"wrote {path}", file=sys.stderr)


def stop_on_signals() -> None:
    """SIGTERM and SIGINT (even where a background shell ignores SIGINT) end the run through
    the usual exception path, so every server started so far is stopped."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupt)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_signals()
    progress = Progress()
    progress(f"load average (1/5/15 min): {format_load(os.getloadavg())}")
    model_dir = resolve_model_dir(args.model_dir)
    if args.model_dir is not None and model_dir is None:
        print(f"no model directory at {args.model_dir}", file=sys.stderr)
        return 2
    try:
        if args.command == "sweep":
            sweep = run_sweep(args, args.model_dir, progress)
            emit(sweep_markdown(sweep), sweep, lambda d: plot_sweep(sweep, d), args)
        else:
            if model_dir is None:
                print(NO_MODEL_HINT, file=sys.stderr)
                return 2
            compare = run_compare(args, model_dir, progress)
            emit(compare_markdown(compare), compare, lambda d: plot_compare(compare, d), args)
    except BenchmarkError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        print(f"interrupted ({exc or 'SIGINT'}); the servers were stopped", file=sys.stderr)
        return 130
    progress(f"done; load average (1/5/15 min): {format_load(os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
