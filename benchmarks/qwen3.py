"""Qwen3-Embedding-0.6B's shape on this CPU: bertserve's ``Encoder`` against sentence-transformers,
bulk and one query at a time, next to the machine's own matrix-product rate at the model's shapes.

The model is Qwen3-Embedding-0.6B's config (28 layers, hidden 1024, 16 query heads over 8 key
and value heads of 128, SwiGLU 3072, a vocabulary of 151,669) with random weights in bfloat16,
as the real model ships, made once by the reference stack (transformers and
sentence-transformers on torch) and saved as sentence-transformers saves Qwen3-Embedding
(Transformer, last-token Pooling, Normalize), with the tiny Qwen3 tokenizer of
``tests/data/families/qwen3``: its ids are a few hundred, all valid rows of the big table, so
nothing is downloaded. The inputs are corpus sentences cut at a word start to exactly
``--tokens`` tokens of that tokenizer (its appended ``<|endoftext|>`` included), so that no
contender pads and every one computes the same tokens.

Each contender runs in a process of its own, one after the other, with the interpreter of
its stack: bertserve's (this one) for the ``Encoder`` at fp32, bf16 and auto, and
``--reference-python`` for sentence-transformers at fp32 and bf16. Each is built, warmed up,
then timed ``--repeats`` times on ``--bulk`` sentences in batches of ``--batch-size``, each
bulk run followed by ``--queries`` sentences encoded one at a time; its peak RSS is read when
it ends. ``--passes`` (2) go over them all, the second in reverse order, and the medians pool
the passes. A contender that fails to build is a row with its error, and is not run again.

Before and after the contenders, in a process of its own, the machine's matmul rate: a Qwen3
layer's four weight products (``[T,1024]x[1024,4096]`` for the fused query, key and value,
``[T,2048]x[2048,1024]``, ``[T,1024]x[1024,6144]`` for gate and up, ``[T,3072]x[3072,1024]``)
with TensorFlow in fp32 and bf16, ``T`` a bulk batch's tokens; the better of the two is the
ceiling. The model's FLOPs per token are 2 x the layers' weights, plus attention's own
products (``QK^T`` and ``AV``): 4 x L x d per layer, d the query heads' width (2,048).

    .venv/bin/python benchmarks/qwen3.py --markdown benchmarks/report/qwen3.md --json benchmarks/report/qwen3.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TINY_QWEN3 = ROOT / "tests" / "data" / "families" / "qwen3"
CORPUS = ROOT / "benchmarks" / "data" / "corpus-long.txt"
DEFAULT_WORK_DIR = Path("/var/tmp/bertserve-qwen3-bench")
DEFAULT_REFERENCE_PYTHON = Path("/var/tmp/refstack/bin/python")
THREADS = 2
MAX_SEQ_LEN = 128
CHILD_TIMEOUT_S = 1200.0
RETRY_AFTER_S = 30.0
CHECKED = 16  # sentences whose vectors every contender keeps, for the cosine to sentence-transformers fp32

# Qwen3-Embedding-0.6B's config.json, less its weights
QWEN3_0_6B = dict(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151669,
    max_position_embeddings=32768,
    rope_theta=1_000_000,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
)

ST = "sentence-transformers"
# name -> (stack, dtype); the order they run in, the stacks taking turns
CONTENDERS = {
    f"{ST} fp32": ("reference", "fp32"),
    "Encoder fp32": ("bertserve", "fp32"),
    f"{ST} bf16": ("reference", "bf16"),
    "Encoder bf16": ("bertserve", "bf16"),
    "Encoder auto": ("bertserve", "auto"),
}


def log(message: str) -> None:
    print(f"[qwen3 {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------
# the model's sizes and FLOPs
# ----------------------------------------------------------------------------------------


def products(config: dict[str, int]) -> list[tuple[int, int]]:
    """A layer's weight products as (in, out): fused q/k/v, attention out, gate and up, down."""
    h, heads, kv, d, i = (
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
        config["intermediate_size"],
    )
    return [(h, (heads + 2 * kv) * d), (heads * d, h), (h, 2 * i), (i, h)]


def flops_per_token(config: dict[str, int], tokens: int) -> dict[str, float]:
    """2 x the non-embedding weights (each a multiply and an add per token), and attention's
    own products, ``QK^T`` and ``AV``: 4 x L x d per layer, d the query heads' width."""
    layers = config["num_hidden_layers"]
    weights = sum(a * b for a, b in products(config)) * layers
    attention = 4.0 * tokens * config["num_attention_heads"] * config["head_dim"] * layers
    return {"weights": 2.0 * weights, "attention": attention, "total": 2.0 * weights + attention}


# ----------------------------------------------------------------------------------------
# children: the model made once, the matmul rate, each contender
# ----------------------------------------------------------------------------------------


def make_model(work_dir: Path, tokens: int, count: int) -> None:
    """(reference stack) The random Qwen3-Embedding-0.6B in ``work_dir/model``, and the inputs
    in ``work_dir/sentences.json``: corpus sentences cut to exactly ``tokens`` tokens."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(TINY_QWEN3))
    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    out = work_dir / "model"
    if not (out / "modules.json").is_file():
        torch.manual_seed(0)
        config = transformers.Qwen3Config(**QWEN3_0_6B, bos_token_id=end, eos_token_id=end, use_cache=False)
        started = time.perf_counter()
        model = transformers.AutoModel.from_config(config).to(torch.bfloat16)
        log(f"random Qwen3 made in {time.perf_counter() - started:.0f} s")
        with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            del model
            transformer = Transformer(tmp, model_kwargs={"dtype": torch.bfloat16}, max_seq_length=MAX_SEQ_LEN)
            hidden = transformer.get_embedding_dimension()
            modules = [transformer, Pooling(hidden, pooling_mode="lasttoken"), Normalize()]
            partial = work_dir / "model.partial"
            SentenceTransformer(modules=modules, device="cpu").save(str(partial), create_model_card=False)
            partial.rename(out)
        log(f"saved {out}")
    sentences = []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        words = line.split()
        for n in range(len(words), 0, -1):
            text = " ".join(words[:n])
            found = len(tokenizer(text)["input_ids"])
            if found <= tokens:
                if found == tokens:
                    sentences.append(text)
                break
        if len(sentences) == count:
            break
    (work_dir / "sentences.json").write_text(json.dumps(sentences, indent=1) + "\n", encoding="utf-8")


def matmul_rates(tokens: int, repeats: int) -> dict[str, Any]:
    """(bertserve stack) GFLOP/s of a layer's four weight products, fp32 and bf16, TensorFlow."""
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    shapes = products(QWEN3_0_6B)
    flops = 2.0 * tokens * sum(a * b for a, b in shapes)
    rng = np.random.default_rng(0)
    rates: dict[str, Any] = {}
    for name, dtype in (("fp32", tf.float32), ("bf16", tf.bfloat16)):
        weights = [tf.constant(rng.standard_normal((a, b), dtype=np.float32) * 0.05, dtype=dtype) for a, b in shapes]
        inputs = [tf.constant(rng.standard_normal((tokens, a), dtype=np.float32), dtype=dtype) for a, _ in shapes]

        @tf.function
        def layer(xs: list[Any] = inputs, ws: list[Any] = weights) -> Any:
            # one element of each product comes back: copying whole products out would be timed too
            return tf.add_n([tf.cast(tf.matmul(x, w)[0, 0], tf.float32) for x, w in zip(xs, ws, strict=True)])

        def run(fn: Callable[[], Any] = layer) -> None:
            fn().numpy()

        run()
        runs = []
        for _ in range(repeats):
            started = time.perf_counter()
            run()
            runs.append(flops / (time.perf_counter() - started) / 1e9)
        rates[name] = {"gflops": statistics.median(runs), "runs": runs}
    return {"rates": rates, "tokens": tokens, "shapes": shapes, "tensorflow": tf.__version__}


def _encoder(model_dir: Path, dtype: str, work_dir: Path, batch_size: int) -> tuple[Callable, dict[str, Any]]:
    import numpy as np
    from bertserve.server import Encoder

    encoder = Encoder(
        str(model_dir), dtype=dtype, max_seq_len=MAX_SEQ_LEN, batch_size=batch_size, graph_dir=str(work_dir / "graphs")
    )
    info = {
        "graph_built": encoder.graph_built,
        "graph_mib": round(encoder.graph_size / 2**20),
        "graph_dtype": encoder.spec.dtype,
        "small_runs_on_litert": encoder.uses_lite,
        "describe": encoder.describe(),
    }
    return (lambda texts: np.asarray(encoder.encode(texts), dtype=np.float32)), info


def _sentence_transformers(model_dir: Path, dtype: str, batch_size: int) -> tuple[Callable, dict[str, Any]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(THREADS)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = SentenceTransformer(str(model_dir), device="cpu", model_kwargs={"dtype": torch_dtype})
    model.max_seq_length = MAX_SEQ_LEN

    def encode(texts: list[str]) -> Any:
        with torch.inference_mode():
            out = model.encode(texts, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)
        return out.float().numpy()

    info = {
        "weights_dtype": str(next(model.parameters()).dtype),
        "torch": torch.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "threads": torch.get_num_threads(),
    }
    return encode, info


def run_contender(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """(either stack) Build ``name``, warm it up, time it; its vectors of the first sentences
    go to ``work_dir/vectors``."""
    import numpy as np

    stack, dtype = CONTENDERS[name]
    sentences = json.loads((args.work_dir / "sentences.json").read_text(encoding="utf-8"))
    bulk, queries = sentences[: args.bulk], sentences[args.bulk : args.bulk + args.queries] or sentences[: args.queries]
    model_dir = args.work_dir / "model"
    started = time.perf_counter()
    if stack == "bertserve":
        encode, info = _encoder(model_dir, dtype, args.work_dir, args.batch_size)
    else:
        encode, info = _sentence_transformers(model_dir, dtype, args.batch_size)
    build_s = time.perf_counter() - started
    rss_built = _rss_mib()
    log(f"{name}: built in {build_s:.0f} s, {rss_built:.0f} MiB")
    vectors = encode(bulk[: args.batch_size])  # warmup: a whole batch, then one query
    encode(queries[:1])
    np.save(args.work_dir / "vectors" / f"{name.replace(' ', '-')}.npy", vectors[:CHECKED])
    bulk_rates, query_ms = [], []
    for repeat in range(args.repeats):
        started = time.perf_counter()
        encode(bulk)
        bulk_rates.append(len(bulk) / (time.perf_counter() - started))
        for text in queries:
            started = time.perf_counter()
            encode([text])
            query_ms.append((time.perf_counter() - started) * 1000)
        log(
            f"{name}: repeat {repeat + 1}: {bulk_rates[-1]:.2f} sentences/s, query {statistics.median(query_ms):.0f} ms"
        )
    return {
        "build_s": build_s,
        "bulk_sentences_per_s": bulk_rates,
        "query_ms": query_ms,
        "rss_built_mib": rss_built,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **info,
    }


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _where(exc: BaseException) -> str:
    """Where in bertserve's code ``exc`` went through last: `` (in server/model/graph.py:211, build_graph)``."""
    ours = [f for f in traceback.extract_tb(exc.__traceback__) if "/server/" in f.filename]
    if not ours:
        return ""
    frame = ours[-1]
    path = "server/" + frame.filename.rsplit("/server/", 1)[1]
    return f" (in {path}:{frame.lineno}, {frame.name}: {frame.line})"


def child(args: argparse.Namespace) -> int:
    """Print one JSON line: what was asked, or ``{"error": ...}`` when it failed."""
    # The Encoder's peak RSS is many times the weights; on a shared machine that runs out of
    # memory, the kernel is to kill this process before anyone else's.
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("1000")
    try:
        if args.child == "make-model":
            make_model(args.work_dir, args.tokens, args.bulk + args.queries)
            result: dict[str, Any] = {"made": str(args.work_dir / "model")}
        elif args.child == "matmul":
            result = matmul_rates(args.batch_size * args.tokens, args.matmul_repeats)
        else:
            result = run_contender(args.child, args)
    except Exception as exc:  # the row records it: a contender that does not build is a finding
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}{_where(exc)}"[:2000]}
    result["peak_rss_mib"] = result.get("peak_rss_mib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(result), flush=True)
    return 1 if "error" in result else 0


# ----------------------------------------------------------------------------------------
# the parent: the children in turn, the table
# ----------------------------------------------------------------------------------------


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def snapshot(revision: str, work_dir: Path) -> tuple[str, dict[str, str]]:
    """``revision``'s bertserve, exported once under ``work_dir/src``, and the environment in
    which a child imports it from there: the working tree may change while the run goes on."""
    commit = _git("rev-parse", revision)
    tree = work_dir / "src" / commit
    if not (tree / "server").is_dir():
        partial = tree.with_suffix(".partial")
        partial.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(partial)], input=archive, check=True)
        partial.rename(tree)
    package = work_dir / "src" / f"{commit}.import" / "bertserve"
    if not package.is_dir():
        package.mkdir(parents=True)
        (package / "__init__.py").symlink_to(tree / "package" / "__init__.py")
        for name in ("client", "server"):
            (package / name).symlink_to(tree / name, target_is_directory=True)
    env = {"PYTHONPATH": str(package.parent)}
    code = "import os, bertserve.server as s; print(os.path.realpath(s.__file__))"
    found = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    if found.returncode or not Path(found.stdout.strip()).is_relative_to(tree):
        raise SystemExit(f"bertserve is imported from {found.stdout.strip() or found.stderr.strip()}, not {tree}")
    return commit, env


def _ask(python: Path, what: str, args: argparse.Namespace, tag: str = "") -> dict[str, Any]:
    """Run ``what`` in a child of ``python``; its stderr goes to ``work_dir/logs``."""
    flags = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("work_dir", "tokens", "bulk", "queries")]
    flags += [f"--batch-size={args.batch_size}", f"--repeats={args.repeats}", f"--matmul-repeats={args.matmul_repeats}"]
    log_path = args.work_dir / "logs" / f"{what.replace(' ', '-')}{tag}.log"
    started = time.perf_counter()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH="")
    if python == Path(sys.executable):  # bertserve's stack: the code of the revision measured
        env.update(args.bertserve_env)
    with log_path.open("w", encoding="utf-8") as err:
        process = subprocess.Popen(
            [str(python), __file__, "--child", what, *flags], stdout=subprocess.PIPE, stderr=err, text=True, env=env
        )
        timer = threading.Timer(CHILD_TIMEOUT_S, process.kill)
        timer.start()
        try:
            assert process.stdout is not None
            lines = process.stdout.read().strip().splitlines()
            # wait4, not wait: the child's own peak RSS, even when it was killed
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            timer.cancel()
    returncode = os.waitstatus_to_exitcode(status)
    result = json.loads(lines[-1]) if lines else {"error": _no_answer(returncode)}
    result.setdefault("peak_rss_mib", usage.ru_maxrss / 1024)
    process.returncode = returncode  # reaped by wait4: Popen is not to wait for it again
    result["wall_s"] = time.perf_counter() - started
    result["load_after"] = os.getloadavg()
    if "error" in result:
        log(f"{what}: {result['error'][:300]} (log: {log_path})")
    return result


def _no_answer(returncode: int) -> str:
    if returncode == -signal.SIGKILL:
        return "killed (SIGKILL: out of memory, or over the time limit; the kernel log says which)"
    return f"exited with {returncode} and no answer"


def _cosines(work_dir: Path, names: list[str]) -> dict[str, dict[str, float]]:
    import numpy as np

    def load(name: str) -> Any:
        path = work_dir / "vectors" / f"{name.replace(' ', '-')}.npy"
        return np.load(path) if path.is_file() else None

    reference = load(f"{ST} fp32")
    found = {}
    for name in names:
        vectors = load(name)
        if reference is None or vectors is None:
            continue
        a = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        b = reference / np.linalg.norm(reference, axis=1, keepdims=True)
        cos = (a * b).sum(1)
        found[name] = {"min": float(cos.min()), "mean": float(cos.mean())}
    return found


def _merged(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One contender's passes as one result: the runs of every pass that ran, pooled."""
    ran = [p for p in passes if "error" not in p]
    if not ran:
        return {**passes[0], "passes": passes}
    pooled = {key: [x for p in ran for x in p[key]] for key in ("bulk_sentences_per_s", "query_ms")}
    return {
        **ran[0],
        **pooled,
        "build_s": max(p["build_s"] for p in ran),
        "peak_rss_mib": max(p["peak_rss_mib"] for p in passes),
        "load_after": ran[-1]["load_after"],
        "passes": passes,
    }


def _row(name: str, result: dict[str, Any], flops: float, rates: dict[str, Any]) -> dict[str, Any]:
    stack, dtype = CONTENDERS[name]
    row: dict[str, Any] = {"contender": name, "stack": stack, "dtype": dtype, **result}
    if "error" in result:
        return row
    # what its big products run in: auto's graph dtype; its one-query runs may go elsewhere
    row["product_dtype"] = result.get("graph_dtype", dtype)
    rate = rates.get(row["product_dtype"], {}).get("gflops")
    row["bulk_median"] = statistics.median(result["bulk_sentences_per_s"])
    row["query_median_ms"] = statistics.median(result["query_ms"])
    row["bulk_gflops"] = row["bulk_median"] * flops / 1e9
    row["query_gflops"] = flops / (row["query_median_ms"] / 1000) / 1e9
    row["bulk_share"] = row["bulk_gflops"] / rate if rate else None
    row["query_share"] = row["query_gflops"] / rate if rate else None
    return row


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def markdown(report: dict[str, Any]) -> str:
    from lib.report import describe_cpu, format_load

    flops, rates, runs = report["flops_per_sentence"], report["matmul"].get("rates", {}), report["settings"]
    lines = [
        "# Qwen3-Embedding-0.6B's shape: bertserve against sentence-transformers",
        "",
        f"CPU: {describe_cpu(report['environment'])}.",
        "",
        f"Command: `{report['command']}` (bertserve {report['bertserve_revision']})",
        "",
        f"A random Qwen3 of Qwen3-Embedding-0.6B's config ({report['parameters'] / 1e6:.0f}M parameters, "
        f"{report['weights_parameters'] / 1e6:.0f}M of them in the layers' products), saved in bf16 as a "
        f"sentence-transformers directory. {runs['bulk']} sentences of exactly {runs['tokens']} tokens, in "
        f"batches of {runs['batch_size']}, {runs['repeats']} timed run(s) after a warmup, each followed by "
        f"{runs['queries']} sentences one at a time. Each contender in a process of its own, one after the "
        f"other, {THREADS} threads, in {runs['passes']} pass(es) over them all, every other one in reverse "
        "order; the medians pool every pass's runs (a contender that failed is not run again). "
        f"The model costs {flops / 1e9:.1f} GFLOP per sentence "
        f"({report['flops_per_token']['weights'] / 1e6:.0f} MFLOP per token in the weight products, "
        f"{report['flops_per_token']['attention'] / 1e6:.1f} in attention's own).",
        "",
        "| contender | sentences/s | runs | share of the matmul rate | one query, ms | its share | "
        "peak RSS, MiB | build, s | cosine to ST fp32 (min) | load after |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        if "error" in row:
            lines.append(
                f"| {row['contender']} | failed | | | | | {row['peak_rss_mib']:.0f} | | | {row['load_after'][0]:.2f} |"
            )
            continue
        cos = report["cosines"].get(row["contender"], {}).get("min")
        label = row["contender"] + (f" ({row['graph_dtype']})" if row["dtype"] == "auto" else "")
        lines.append(
            f"| {label} | {row['bulk_median']:.2f} | {', '.join(f'{r:.2f}' for r in row['bulk_sentences_per_s'])} | "
            f"{_fmt(row['bulk_share'], '.0%')} | {row['query_median_ms']:.0f} | {_fmt(row['query_share'], '.0%')} | "
            f"{row['peak_rss_mib']:.0f} | {row['build_s']:.0f} | {_fmt(cos, '.5f')} | {row['load_after'][0]:.2f} |"
        )
    lines += ["", "Shares are of the matmul rate in the dtype of the contender's products (auto's: its graph's).", ""]
    lines += ["| ratio | bulk | one query (latency, lower is better) |", "| --- | ---: | ---: |"]
    for label, (a, b) in report["ratios"].items():
        lines.append(f"| {label} | {_fmt(a, '.2f')} | {_fmt(b, '.2f')} |")
    lines += [
        "",
        f"Matmul rate: TensorFlow, {THREADS} threads, a layer's four weight products "
        f"({', '.join(f'[T,{a}]x[{a},{b}]' for a, b in products(report['model_config']))}; T = "
        f"{runs['batch_size']} x {runs['tokens']} tokens), median of each measure, before and after the "
        "contenders; the ceiling is the better of the two.",
        "",
        "| dtype | GFLOP/s before | GFLOP/s after | ceiling, sentences/s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for dtype, rate in rates.items():
        before, after = (report["matmul"][when].get("rates", {}).get(dtype, {}) for when in ("before", "after"))
        lines.append(
            f"| {dtype} | {_fmt(before.get('gflops'), '.0f')} | {_fmt(after.get('gflops'), '.0f')} | "
            f"{rate['gflops'] * 1e9 / flops:.2f} |"
        )
    if "error" in report["matmul"]:
        lines.append(f"\nThe matmul rate was not measured: {report['matmul']['error']}")
    failed = [line for row in report["rows"] for line in _failures(row)]
    if failed:
        lines += ["", "## What did not build, or was killed", "", *failed]
    notes = report.get("notes") or []
    if notes:
        lines += ["", *notes]
    lines += [
        "",
        f"Load average before {format_load(report['load_before'])}, after {format_load(report['load_after'])}.",
    ]
    return "\n".join(lines) + "\n"


def _failures(row: dict[str, Any]) -> list[str]:
    """A line for each try of the row's contender that failed: its pass, error and peak RSS."""
    tries = []
    for done in row.get("passes") or [row]:
        where = f", pass {done['pass']}" if "pass" in done else ""
        tries += [(f"{where}, first try", done["first_try"])] if "first_try" in done else []
        tries.append((where + (", second try" if "first_try" in done else ""), done))
    return [
        f"- {row['contender']}{where}: `{tried['error']}` (peak RSS {_fmt(tried.get('peak_rss_mib'), '.0f')} MiB)"
        for where, tried in tries
        if "error" in tried
    ]


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str, invert: bool = False) -> float | None:
    if not a or not b or key not in a or key not in b:
        return None
    return b[key] / a[key] if invert else a[key] / b[key]


def _best_rates(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The higher of the two medians of each dtype: the ceiling is the best this machine did."""
    rates: dict[str, Any] = {}
    for taken in (before, after):
        for dtype, rate in taken.get("rates", {}).items():
            if dtype not in rates or rate["gflops"] > rates[dtype]["gflops"]:
                rates[dtype] = rate
    errors = [taken["error"] for taken in (before, after) if "error" in taken]
    return {"rates": rates, "before": before, "after": after, **({"error": errors[0]} if errors else {})}


def parent(args: argparse.Namespace, argv: list[str]) -> int:
    for sub in ("logs", "vectors", "graphs"):
        (args.work_dir / sub).mkdir(parents=True, exist_ok=True)
    args.load_before = os.getloadavg()
    args.command = shlex.join([".venv/bin/python", "benchmarks/qwen3.py", *argv])
    if not (args.work_dir / "model" / "modules.json").is_file() or not (args.work_dir / "sentences.json").is_file():
        log(f"making the model in {args.work_dir / 'model'} (once)")
        made = _ask(args.reference_python, "make-model", args)
        if "error" in made:
            return 1
    if args.working_tree:
        revision, args.bertserve_env = f"the working tree at {_git('rev-parse', '--short', 'HEAD')}", {}
    else:
        commit, args.bertserve_env = snapshot(args.revision, args.work_dir)
        revision = f"{commit[:7]}, exported to {args.work_dir / 'src'}"
    args.revision_text = revision
    log(f"bertserve: {revision}")
    log("the matmul rate, before")
    matmul_before = _ask(Path(sys.executable), "matmul", args, "-before")
    names = [name for name in CONTENDERS if not args.only or name in args.only]
    passes: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for n in range(args.passes):
        # the second pass in the opposite order: a drift in the machine's load hits all alike
        for name in names if n % 2 == 0 else names[::-1]:
            done = passes[name]
            if done and all("error" in r and not r["error"].startswith("killed") for r in done):
                continue  # it failed as it will fail again
            log(f"pass {n + 1}: {name}")
            python = Path(sys.executable) if CONTENDERS[name][0] == "bertserve" else args.reference_python
            result = _ask(python, name, args, f"-pass{n + 1}")
            if result.get("error", "").startswith("killed"):  # memory another process held, perhaps
                log(f"{name}: once more in {RETRY_AFTER_S:.0f} s")
                time.sleep(RETRY_AFTER_S)
                result = {**_ask(python, name, args, f"-pass{n + 1}-again"), "first_try": result}
            done.append({**result, "pass": n + 1})
            _write(args, names, passes, matmul_before, {}, partial=True)
    log("the matmul rate, after")
    matmul_after = _ask(Path(sys.executable), "matmul", args, "-after")
    _write(args, names, passes, matmul_before, matmul_after, partial=False)
    return 0


def _write(
    args: argparse.Namespace,
    names: list[str],
    passes: dict[str, list[dict[str, Any]]],
    matmul_before: dict[str, Any],
    matmul_after: dict[str, Any],
    *,
    partial: bool,
) -> None:
    """The report of what has run so far: written after each contender, so that a run cut
    short still leaves its numbers (marked partial)."""
    from lib.report import environment, write_report

    names = [name for name in names if passes[name]]
    results = {name: _merged(passes[name]) for name in names}
    matmul = _best_rates(matmul_before, matmul_after)
    config = json.loads((args.work_dir / "model" / "config.json").read_text(encoding="utf-8"))
    per_token = flops_per_token(config, args.tokens)
    flops = per_token["total"] * args.tokens
    rows = [_row(name, results[name], flops, matmul["rates"]) for name in names]
    by_name = {row["contender"]: row for row in rows if "error" not in row}
    weights = sum(a * b for a, b in products(config)) * config["num_hidden_layers"]
    ratios = {}
    for label, ours, theirs in (
        ("Encoder fp32 / ST fp32", "Encoder fp32", f"{ST} fp32"),
        ("Encoder bf16 / ST bf16", "Encoder bf16", f"{ST} bf16"),
        ("Encoder auto / ST bf16 (each one's default for this bf16 checkpoint)", "Encoder auto", f"{ST} bf16"),
        ("Encoder auto / ST fp32", "Encoder auto", f"{ST} fp32"),
    ):
        a, b = by_name.get(ours), by_name.get(theirs)
        ratios[label] = (_ratio(a, b, "bulk_median"), _ratio(a, b, "query_median_ms", invert=True))
    notes = list(args.note or [])
    if partial:
        notes.append(f"Partial: written after {sum(map(len, passes.values()))} contender runs, before the end.")
    report = {
        "command": args.command,
        "bertserve_revision": args.revision_text,
        "environment": environment(),
        "settings": {
            "tokens": args.tokens,
            "bulk": args.bulk,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "queries": args.queries,
            "passes": args.passes,
            "max_seq_len": MAX_SEQ_LEN,
            "threads": THREADS,
            "reference_python": str(args.reference_python),
        },
        "model_config": config,
        "parameters": weights + config["vocab_size"] * config["hidden_size"],
        "weights_parameters": weights,
        "flops_per_token": per_token,
        "flops_per_sentence": flops,
        "matmul": matmul,
        "rows": rows,
        "ratios": ratios,
        "cosines": _cosines(args.work_dir, names),
        "load_before": args.load_before,
        "load_after": os.getloadavg(),
        "partial": partial,
        "notes": notes,
    }
    write_report(report, markdown(report), args.json, args.markdown)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="the model, graphs and logs (kept between runs)")
    add("--reference-python", type=Path, default=DEFAULT_REFERENCE_PYTHON, help="torch and sentence-transformers")
    add("--tokens", type=int, default=27, help="tokens per sentence, <|endoftext|> included")
    add("--bulk", type=int, default=128, help="sentences of each timed bulk run")
    add("--batch-size", type=int, default=64)
    add("--repeats", type=int, default=3)
    add("--queries", type=int, default=8, help="one-sentence encodes after each bulk run")
    add("--matmul-repeats", type=int, default=10)
    add("--passes", type=int, default=2, help="passes over the contenders, every other one in reverse order")
    add("--revision", default="HEAD", help="the bertserve commit measured, exported under --work-dir")
    add("--working-tree", action="store_true", help="measure the working tree's bertserve instead, as it is")
    add("--only", action="append", choices=list(CONTENDERS), help="these contenders only (repeatable)")
    add("--note", action="append", help="a line for the report's end (repeatable)")
    add("--json", type=Path)
    add("--markdown", type=Path)
    add("--render", type=Path, help="write the report of this JSON again (with --note), measuring nothing")
    add("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.render:  # the markdown again from a run's JSON, with --note lines added
        from lib.report import write_report

        report = json.loads(args.render.read_text(encoding="utf-8"))
        report["notes"] = [*report.get("notes", []), *(args.note or [])]
        write_report(report, markdown(report), args.json, args.markdown)
        return 0
    if args.child:
        return child(args)
    return parent(args, argv)


if __name__ == "__main__":
    sys.exit(main())
