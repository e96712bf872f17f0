"""Input length: bertserve beside its peers from 16 to 512 tokens, in bulk and one input at a time.

    python benchmarks/lengths.py --json benchmarks/report/lengths.json \\
        --markdown benchmarks/report/lengths.md --plot benchmarks/report/lengths.png

On all-MiniLM-L6-v2 by default (``--model-dir``), at ``max_seq_len`` 512 so that nothing is
truncated, with inputs of exactly 16, 64, 128, 256 and 512 tokens (``--lengths``; ``[CLS]``
and ``[SEP]`` included): runs of the corpus's sentences put end to end, each begun at a word
and counted by the model's tokenizer, then again by the ``Encoder``'s; every input a
different text, and every run its own inputs.

1. **Bulk**, inputs/s: the ``Encoder`` at its default dtype (``auto``) and at fp32,
   sentence-transformers (PyTorch, CPU, 2 threads) and ONNX Runtime fp32 (2 threads), each
   encoding ``--bulk-tokens`` / length inputs in one call, all with the ``Encoder``'s batch size.
2. **One input at a time**, p50 ms: the ``Encoder`` (auto), ONNX Runtime fp32 and
   sentence-transformers, ``--single`` inputs after ``--warmup``; and a real server
   (``--num-worker 1 --cpu --max-seq-len 512``, its default dtype) through ``BertClient``.

Each in-process contender lives in a process of its own (the threads of TensorFlow, PyTorch
and ONNX Runtime would compete in one), built once and kept for the whole run; at each length
the contenders take turns, in an order that rotates, ``--repeats`` times, so that noise on a
shared machine falls on all of them alike. One untimed batch per contender and length comes
first. Bulk rates are medians of the repeats; latencies pool the repeats' inputs. Targets at
each length, bertserve being the in-process ``Encoder`` at auto: bulk / sentence-transformers
>= 2, bulk / ONNX Runtime fp32 >= 1.5, one-input p50 / ONNX Runtime fp32's <= 1. ``--quick``
is a smoke run: 16 and 64 tokens, few inputs, one repeat, no server.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
from bertserve.client import BertClient
from bertserve.server.testing.launcher import start_server
from lengthwise.children import check_counts, child, start_children
from lengthwise.inputs import length_inputs
from lengthwise.plan import AUTO, FULL, MAX_SEQ_LEN, QUICK, SERVER_FLAGS, Plan, log
from lengthwise.report import markdown, plot
from lengthwise.sweep import sweep
from lib.inputs import model_dir_or_exit, model_parser, model_tokenizer, read_corpus
from lib.report import environment, format_load, write_report
from lib.token_lengths import TokenStream


def parse_lengths(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def chosen_plan(args: argparse.Namespace) -> Plan:
    """``--quick`` or the whole sweep, with whatever was given on the command line."""
    base = QUICK if args.quick else FULL
    given = {key: getattr(args, key) for key in ("lengths", "bulk_tokens", "repeats", "single", "warmup")}
    return Plan(**{key: getattr(base, key) if value is None else value for key, value in given.items()})


def check_lengths(parser: argparse.ArgumentParser, lengths: Sequence[int], model_dir: Path) -> None:
    config = model_dir / "config.json"
    positions = json.loads(config.read_text())["max_position_embeddings"] if config.is_file() else MAX_SEQ_LEN
    for length in lengths:
        if not 3 <= length <= min(MAX_SEQ_LEN, positions):
            parser.error(f"--lengths: {length} is not within 3 and {min(MAX_SEQ_LEN, positions)}")


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    parser.add_argument("--lengths", type=parse_lengths, help="tokens per input, e.g. 16,64,128,256,512 (the default)")
    parser.add_argument("--bulk-tokens", type=int, help="tokens of one bulk call: inputs = this / length (32768)")
    parser.add_argument("--repeats", type=int, help="runs of each contender at each length, in turns (3)")
    parser.add_argument("--single", type=int, help="inputs timed one at a time per run (30)")
    parser.add_argument("--warmup", type=int, help="one-at-a-time inputs before each run, untimed (3)")
    parser.add_argument("--batch-size", type=int, help="every contender's batch size (default: the Encoder's)")
    parser.add_argument("--graph-dir", type=Path, help="graph cache of the Encoders and the server")
    parser.add_argument("--plot", type=Path, help="write a PNG here: inputs/s and p50 ms against length")
    parser.add_argument("--no-server", action="store_true")
    parser.add_argument("--no-sentence-transformers", action="store_true")
    parser.add_argument("--no-onnx", action="store_true")
    parser.add_argument("--quick", action="store_true", help="16 and 64 tokens, few inputs, one repeat, no server")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    model_dir = model_dir_or_exit(parser, args.model_dir)
    plan = chosen_plan(args)
    check_lengths(parser, plan.lengths, model_dir)
    load_start, started = psutil.getloadavg(), time.perf_counter()
    tokenizer = model_tokenizer(model_dir, MAX_SEQ_LEN)
    tokenizer.no_truncation()  # a count must see every token
    stream = TokenStream.of(tokenizer, read_corpus(args.corpus))
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bertserve-lengths-")))
        children = start_children(__file__, args, model_dir, scratch, stack)
        batch_size = int(children[AUTO].info["batch_size"])
        inputs = {n: length_inputs(stream, tokenizer, n, plan, batch_size) for n in sorted(set(plan.lengths))}
        check_counts(children[AUTO], inputs)
        server, client = None, None
        if not (args.quick or args.no_server):
            extra = ("--graph-dir", str(args.graph_dir)) if args.graph_dir else ()
            log(f"starting a server: {' '.join(SERVER_FLAGS)}")
            running = start_server("--model-dir", str(model_dir), *SERVER_FLAGS, *extra, echo=False)
            stack.callback(running.stop)
            client = stack.enter_context(BertClient(**running.client_kwargs, timeout=120_000))
            server = {"ready_s": running.ready_seconds, "ready_line": (running.ready_line or "").strip()}
        rows = sweep(plan, inputs, children, client)
        contenders = {name: {k: c.info[k] for k in ("note", "setup_s")} for name, c in children.items()}
    report: dict[str, Any] = {
        "command": "python benchmarks/lengths.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "load_average": {"start": format_load(load_start), "end": format_load(psutil.getloadavg())},
        "seconds": time.perf_counter() - started,
        "model_dir": str(model_dir),
        "corpus": args.corpus.name,
        "max_seq_len": MAX_SEQ_LEN,
        "plan": {**dataclasses.asdict(plan), "batch_size": batch_size},
        "contenders": contenders,
        "server": server,
        "rows": rows,
    }
    write_report(report, markdown(report), args.json, args.markdown)
    if args.plot:
        plot(report, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
