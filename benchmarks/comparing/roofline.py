"""This machine's own matrix-product rate at a BERT model's shapes, and the throughput ceiling
each rate implies.

Per token and layer a BERT encoder computes four products with weights: ``[T,H]x[H,3H]``
(the fused query/key/value projection), ``[T,H]x[H,H]`` (the attention output),
``[T,H]x[H,I]`` and ``[T,I]x[I,H]`` (the feed-forward pair), ``T`` being the tokens of a bulk
batch. Those four, timed here with the thread count the contenders get, give the rate
(GFLOP/s) in fp32 and bf16 with TensorFlow, and in int8 with LiteRT's dynamically quantized
fully connected op (a tiny model of the four products, its weights int8 per channel, its
activations quantized per row at run time). The model's FLOPs per token (2 x the MACs of
the four products x layers) and the corpus's mean tokens per sentence turn a rate into
sentences/s: the ceiling no implementation of that precision can pass on this machine.
Attention's own products (``QK^T`` and ``AV``, 2 x ``T_seq`` x ``H`` MACs per token and layer)
are left out: at corpus lengths they are under 2 % of the work (the report gives the share).

The measurement runs in a process of its own (``python benchmarks/comparing/roofline.py``), so
that TensorFlow's thread count is set before it starts and no other runtime's threads are
about; :class:`RooflineRun` starts it and reads its JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOFLINE_TIMEOUT_S = 600.0
DTYPES = ("fp32", "bf16", "int8")


@dataclass(frozen=True)
class Shapes:
    """The model's sizes that set its products: hidden ``H``, intermediate ``I``, layers."""

    hidden: int
    intermediate: int
    layers: int

    @classmethod
    def of_model(cls, model_dir: Path) -> Shapes | None:
        """From ``config.json`` (Hugging Face) or ``bert_config.json`` (Google); None when neither."""
        for name in ("config.json", "bert_config.json"):
            path = model_dir / name
            if path.is_file():
                raw = json.loads(path.read_text(encoding="utf-8"))
                return cls(int(raw["hidden_size"]), int(raw["intermediate_size"]), int(raw["num_hidden_layers"]))
        return None

    def macs_per_token_layer(self) -> int:
        """MACs of the four weight products for one token in one layer: 4H^2 + 2HI."""
        h, i = self.hidden, self.intermediate
        return 3 * h * h + h * h + h * i + i * h

    def flops_per_token(self) -> float:
        return 2.0 * self.macs_per_token_layer() * self.layers

    def attention_share(self, tokens_per_sentence: float) -> float:
        """What attention's own products (``QK^T``, ``AV``) would add, as a share of the four."""
        return 2 * tokens_per_sentence * self.hidden / self.macs_per_token_layer()


@dataclass
class Rate:
    dtype: str
    gflops: float | None  # median of the repeats; None when this runtime cannot run it here
    runs: list[float] = field(default_factory=list)
    how: str = ""


@dataclass
class Roofline:
    """The measured rates, and the ceiling in sentences/s each implies for the corpus."""

    shapes: dict[str, int]
    tokens: int  # T, the rows of each product
    threads: int
    flops_per_token: float
    tokens_per_sentence: float
    attention_share: float
    rates: dict[str, Rate]
    ceilings: dict[str, float | None]  # dtype -> sentences/s
    error: str | None = None

    def ceiling(self, dtype: str) -> float | None:
        return self.ceilings.get(dtype)


class RooflineRun:
    """The measurement in its own process, started at once; :meth:`result` waits for it and
    turns each rate into the ceiling in sentences/s at ``tokens_per_sentence``."""

    def __init__(self, shapes: Shapes, *, tokens_per_sentence: float, tokens: int, threads: int, repeats: int) -> None:
        self.shapes, self.tokens_per_sentence, self.tokens, self.threads = shapes, tokens_per_sentence, tokens, threads
        command = [
            sys.executable,
            __file__,
            "--hidden",
            str(shapes.hidden),
            "--intermediate",
            str(shapes.intermediate),
            "--tokens",
            str(tokens),
            "--threads",
            str(threads),
            "--repeats",
            str(repeats),
        ]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def _rates(self) -> tuple[dict[str, Rate], str | None]:
        try:
            out, err = self._process.communicate(timeout=ROOFLINE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.communicate()
            return {}, f"the matmul measurement took over {ROOFLINE_TIMEOUT_S:.0f} s"
        if self._process.returncode != 0:
            return {}, f"the matmul measurement failed ({self._process.returncode}): {err.strip()[-500:]}"
        raw = json.loads(out.strip().splitlines()[-1])
        return {name: Rate(**value) for name, value in raw.items()}, None

    def result(self) -> Roofline:
        rates, error = self._rates()
        shapes = self.shapes
        per_sentence = shapes.flops_per_token() * self.tokens_per_sentence
        return Roofline(
            shapes={"hidden": shapes.hidden, "intermediate": shapes.intermediate, "layers": shapes.layers},
            tokens=self.tokens,
            threads=self.threads,
            flops_per_token=shapes.flops_per_token(),
            tokens_per_sentence=round(self.tokens_per_sentence, 2),
            attention_share=round(shapes.attention_share(self.tokens_per_sentence), 4),
            rates=rates,
            ceilings={
                dtype: (None if rate.gflops is None else round(rate.gflops * 1e9 / per_sentence, 1))
                for dtype, rate in rates.items()
            },
            error=error,
        )

    def stop(self) -> None:
        """End the measurement if it still runs (an interrupted benchmark)."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()


def roofline_markdown(roof: Roofline) -> list[str]:
    s = roof.shapes
    lines = [
        f"Machine matmul rate: the four weight products of a layer ([T,H]x[H,3H], [T,H]x[H,H], [T,H]x[H,I], "
        f"[T,I]x[I,H]; H {s['hidden']}, I {s['intermediate']}, T {roof.tokens}), {roof.threads} threads, median "
        f"of the repeats. The model costs {roof.flops_per_token / 1e6:.3g} MFLOP per token ({s['layers']} layers; "
        f"attention's own products, left out, would add {roof.attention_share:.1%} at the corpus's mean "
        f"{roof.tokens_per_sentence:.1f} tokens per sentence).",
        "",
    ]
    if roof.error:
        return [*lines, f"not measured: {roof.error}"]
    lines += ["| dtype | GFLOP/s | runs | ceiling, sentences/s | how |", "| --- | ---: | --- | ---: | --- |"]
    for dtype, rate in roof.rates.items():
        gflops = "n/a" if rate.gflops is None else f"{rate.gflops:.1f}"
        ceiling = roof.ceiling(dtype)
        runs = ", ".join(f"{r:.1f}" for r in rate.runs)
        lines.append(f"| {dtype} | {gflops} | {runs} | {'n/a' if ceiling is None else f'{ceiling:.0f}'} | {rate.how} |")
    return lines


def fraction(rate: float | None, ceiling: float | None) -> float | None:
    """``rate`` as a share of ``ceiling``; None when either is missing."""
    if rate is None or ceiling is None or not ceiling or math.isnan(rate):
        return None
    return round(rate / ceiling, 3)


# ----------------------------------------------------------------------------------------
# the child process: TensorFlow and LiteRT timed on the four products
# ----------------------------------------------------------------------------------------


def _weights(shapes: Shapes, dtype: Any) -> list[Any]:
    import numpy as np

    h, i = shapes.hidden, shapes.intermediate
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(shape) * 0.05).astype(dtype) for shape in ((h, 3 * h), (h, h), (h, i), (i, h))]


def _inputs(shapes: Shapes, tokens: int) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(1)
    x = rng.standard_normal((tokens, shapes.hidden)).astype(np.float32)
    y = rng.standard_normal((tokens, shapes.intermediate)).astype(np.float32)
    return x, y


def _time(run: Any, repeats: int, flops: float) -> list[float]:
    run()  # warmup: first-call allocation and kernel selection
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        rates.append(flops / (time.perf_counter() - started) / 1e9)
    return rates


def _tf_rate(shapes: Shapes, tokens: int, repeats: int, dtype: str) -> Rate:
    import tensorflow as tf

    tf_dtype = tf.float32 if dtype == "fp32" else tf.bfloat16
    weights = [tf.constant(w, dtype=tf_dtype) for w in _weights(shapes, "float32")]
    x, y = (tf.constant(a, dtype=tf_dtype) for a in _inputs(shapes, tokens))

    @tf.function
    def products() -> Any:
        qkv, out, up, down = weights
        return [tf.matmul(x, qkv), tf.matmul(x, out), tf.matmul(x, up), tf.matmul(y, down)]

    def run() -> None:
        for t in products():
            t.numpy()  # wait for the result

    flops = 2.0 * tokens * shapes.macs_per_token_layer()
    try:
        runs = _time(run, repeats, flops)
    except Exception as exc:  # a dtype this build has no kernel for
        return Rate(dtype, None, how=f"TensorFlow cannot run it: {type(exc).__name__}")
    return Rate(dtype, round(statistics.median(runs), 1), [round(r, 1) for r in runs], f"TensorFlow {tf.__version__}")


def _litert_rate(shapes: Shapes, tokens: int, repeats: int, threads: int) -> Rate:
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return Rate("int8", None, how="ai-edge-litert is not installed")
    import tensorflow as tf

    weights = [tf.constant(w) for w in _weights(shapes, "float32")]
    x, y = _inputs(shapes, tokens)

    @tf.function(input_signature=[tf.TensorSpec(x.shape, tf.float32), tf.TensorSpec(y.shape, tf.float32)])
    def products(a: Any, b: Any) -> Any:
        qkv, out, up, down = weights
        return tf.matmul(a, qkv), tf.matmul(a, out), tf.matmul(a, up), tf.matmul(b, down)

    converter = tf.lite.TFLiteConverter.from_concrete_functions([products.get_concrete_function()], products)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]  # int8 weights, activations quantized at run time
    interpreter = Interpreter(model_content=converter.convert(), num_threads=threads)
    interpreter.allocate_tensors()
    by_shape = {tuple(d["shape"]): d["index"] for d in interpreter.get_input_details()}
    interpreter.set_tensor(by_shape[x.shape], x)
    interpreter.set_tensor(by_shape[y.shape], y)
    ops = sorted({op["op_name"] for op in interpreter._get_ops_details()})  # what the converter made of them
    flops = 2.0 * tokens * shapes.macs_per_token_layer()
    runs = _time(interpreter.invoke, repeats, flops)
    how = f"LiteRT dynamic-range int8 ({', '.join(ops)}), FLOP/s of the fp32 products"
    return Rate("int8", round(statistics.median(runs), 1), [round(r, 1) for r in runs], how)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="time the four products of a BERT layer; print JSON")
    add = parser.add_argument
    add("--hidden", type=int, required=True)
    add("--intermediate", type=int, required=True)
    add("--tokens", type=int, required=True)
    add("--threads", type=int, required=True)
    add("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.set_visible_devices([], "GPU")
    shapes = Shapes(args.hidden, args.intermediate, 1)
    rates = [_tf_rate(shapes, args.tokens, args.repeats, dtype) for dtype in ("fp32", "bf16")]
    rates.append(_litert_rate(shapes, args.tokens, args.repeats, args.threads))
    print(json.dumps({r.dtype: vars(r) for r in rates}))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
