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
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

import numpy as np
import psutil
from bertserve.client import BertClient
from bertserve.server.testing.launcher import start_server
from comparing.onnx_contenders import ONNX_FP32, onnx_missing
from lib.contenders import NO_ST_HINT, ST_NAME
from lib.inputs import model_dir_or_exit, model_parser, model_tokenizer, read_corpus
from lib.load import timed
from lib.report import describe_cpu, environment, format_load, pyplot, tagged_log, write_report
from lib.stats import cosine_rows, latency_row, median, ratio

MAX_SEQ_LEN = 512
SERVER_FLAGS = ("--num-worker", "1", "--cpu", "--max-seq-len", str(MAX_SEQ_LEN))
AUTO, FP32, SERVER = "Encoder auto", "Encoder fp32", "server"
BULK = (AUTO, FP32, ST_NAME, ONNX_FP32)
SINGLE = (AUTO, ONNX_FP32, ST_NAME, SERVER)
CHECKED_ROWS = 8  # vectors of the warm-up batch sent back, to check the contenders agree
COLOURS = {AUTO: "C0", FP32: "C1", ST_NAME: "C2", ONNX_FP32: "C3", SERVER: "C4"}  # the same in both panels


@dataclass(frozen=True)
class Plan:
    """How much is measured: the whole sweep, or ``--quick``'s seconds."""

    lengths: tuple[int, ...]
    bulk_tokens: int
    repeats: int
    single: int
    warmup: int


FULL = Plan(lengths=(16, 64, 128, 256, 512), bulk_tokens=32_768, repeats=3, single=30, warmup=3)
QUICK = Plan(lengths=(16, 64), bulk_tokens=1_024, repeats=1, single=5, warmup=2)


@dataclass(frozen=True)
class Target:
    """A ratio of two contenders' figures at one length, and its goal."""

    name: str
    kind: str  # "bulk" (inputs/s) or "single" (p50 ms)
    over: str
    goal: float
    at_least: bool

    def measure(self, row: dict[str, Any]) -> float:
        key = "per_s" if self.kind == "bulk" else "p50_ms"
        figures = row[self.kind]
        if AUTO not in figures or self.over not in figures:
            return float("nan")
        return ratio(figures[AUTO][key], figures[self.over][key])

    def verdict(self, value: float) -> str:
        if math.isnan(value):  # a contender left out
            return "n/a"
        return "PASS" if (value >= self.goal if self.at_least else value <= self.goal) else "MISS"

    @property
    def goal_text(self) -> str:
        return f"{'>=' if self.at_least else '<='} {self.goal:g}"


TARGETS = (
    Target("bulk / sentence-transformers", "bulk", ST_NAME, 2.0, at_least=True),
    Target("bulk / ONNX Runtime fp32", "bulk", ONNX_FP32, 1.5, at_least=True),
    Target("one-input p50 / ONNX Runtime fp32 p50", "single", ONNX_FP32, 1.0, at_least=False),
)


log = tagged_log("lengths")


# ----------------------------------------------------------------------------------------
# inputs of an exact length
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenStream:
    """The corpus's sentences end to end: the text, its tokens' character spans, and which
    tokens begin a word (a text cut there tokenizes as it did in the stream)."""

    text: str
    spans: list[tuple[int, int]]
    word_starts: np.ndarray

    @classmethod
    def of(cls, tokenizer: Any, corpus: Sequence[str]) -> TokenStream:
        text = " ".join(corpus)
        encoding = tokenizer.encode(text, add_special_tokens=False)
        words = encoding.word_ids
        starts = [i for i, word in enumerate(words) if i == 0 or word != words[i - 1]]
        return cls(text, list(encoding.offsets), np.asarray(starts))

    def cut(self, start: int, tokens: int) -> str:
        return self.text[self.spans[start][0] : self.spans[start + tokens - 1][1]]


def exact_inputs(stream: TokenStream, tokenizer: Any, length: int, count: int, seed: int) -> list[str]:
    """``count`` different texts of exactly ``length`` tokens, ``[CLS]`` and ``[SEP]``
    included, from random word starts of ``stream``; the rare cut that tokenizes otherwise
    (a word's pieces counted anew) is passed over."""
    body = length - 2
    starts = stream.word_starts[stream.word_starts <= len(stream.spans) - body]
    order = np.random.default_rng(seed).permutation(starts)
    texts: list[str] = []
    seen: set[str] = set()
    for begin in range(0, len(order), count):
        candidates = [stream.cut(int(start), body) for start in order[begin : begin + count]]
        for text, encoding in zip(candidates, tokenizer.encode_batch(candidates), strict=True):
            if len(encoding.ids) == length and text not in seen:
                seen.add(text)
                texts.append(text)
        if len(texts) >= count:
            return texts[:count]
    raise SystemExit(f"the corpus holds {len(texts)} different inputs of {length} tokens, not {count}: pass --corpus")


@dataclass(frozen=True)
class LengthInputs:
    """Every input at one length: a warm-up batch, and each repeat's bulk and one-input sets."""

    tokens: int
    warm: list[str]
    bulk: list[list[str]]
    single: list[list[str]]  # the warm-up inputs first

    def everything(self) -> list[str]:
        return [*self.warm, *(t for texts in self.bulk for t in texts), *(t for texts in self.single for t in texts)]


def length_inputs(stream: TokenStream, tokenizer: Any, length: int, plan: Plan, batch_size: int) -> LengthInputs:
    per_bulk, per_single = max(plan.bulk_tokens // length, 1), plan.warmup + plan.single
    texts = exact_inputs(stream, tokenizer, length, batch_size + plan.repeats * (per_bulk + per_single), seed=length)
    warm, rest = texts[:batch_size], texts[batch_size:]
    bulk = [rest[r * per_bulk : (r + 1) * per_bulk] for r in range(plan.repeats)]
    rest = rest[plan.repeats * per_bulk :]
    single = [rest[r * per_single : (r + 1) * per_single] for r in range(plan.repeats)]
    return LengthInputs(length, warm, bulk, single)


# ----------------------------------------------------------------------------------------
# the in-process contenders, each in a process of its own
# ----------------------------------------------------------------------------------------


class Child:
    """One in-process contender in a process of its own, built once and kept for the run:
    asked in JSON lines on its stdin, it answers in JSON lines; its stderr goes to a log."""

    def __init__(self, name: str, flags: list[str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name.replace(' ', '-')}.log"
        self._log = self.log_path.open("w", encoding="utf-8")
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--child", name, *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.info = self._reply()  # sent once the contender is built

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._reply()

    def _reply(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(30)
            self._fail(f"exited with {self.process.returncode}")
        reply = json.loads(line)
        if "error" in reply:
            self._fail(reply["error"])
        return reply

    def _fail(self, why: str) -> NoReturn:
        self._log.flush()
        tail = "".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines(True)[-30:])
        raise RuntimeError(f"{self.name}: {why}\n{tail}")

    def close(self) -> None:
        """Close its stdin (it exits at the end of its input); kill it if it does not."""
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


def _encoder(model_dir: Path, dtype: str, batch_size: int | None, graph_dir: Path | None) -> tuple[Any, dict]:
    # TensorFlow is imported before the clock starts: "setup s" is the Encoder's own build time.
    import tensorflow  # noqa: F401
    from bertserve.server import Encoder

    options: dict[str, Any] = {"max_seq_len": MAX_SEQ_LEN, "dtype": dtype}
    if batch_size is not None:
        options["batch_size"] = batch_size
    if graph_dir is not None:
        options["graph_dir"] = str(graph_dir)
    setup, encoder = timed(lambda: Encoder(model_dir, **options))
    described = encoder.describe()
    lite = f", LiteRT up to {described['lite_max_tokens']} tokens" if described["lite_max_tokens"] else ""
    note = (
        f"dtype {described['dtype']} ({described['runtime']}{lite}), batch size {encoder.config.batch_size}, "
        f"{'graph built' if encoder.graph_built else 'graph from cache'}"
    )
    return encoder, {
        "setup_s": setup,
        "note": note,
        "batch_size": encoder.config.batch_size,
        "max_len": encoder.max_len,
    }


def child(args: argparse.Namespace) -> int:
    """Build one contender, then answer what the parent asks: ``bulk`` (one call on all the
    texts), ``single`` (one call per text, the first ``warmup`` untimed) or ``count`` (the
    ``Encoder``'s token count of each text)."""
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")  # the answers; what libraries print goes to stderr
    os.dup2(2, 1)
    name, model_dir = args.child, Path(args.model_dir)
    encoder = None
    if name in (AUTO, FP32):
        encoder, info = _encoder(model_dir, name.split()[1], args.batch_size, args.graph_dir)
        encode: Callable[[list[str]], Any] = encoder.encode
    else:
        contender = _library_contender(name, model_dir, args.batch_size)
        encode = contender.encode
        info = {"setup_s": contender.setup_seconds, "note": contender.note, "batch_size": args.batch_size}
    _answer(channel, info)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            _answer(channel, _serve(request, encode, encoder))
        except Exception as exc:  # the parent says which contender failed, with this log's tail
            _answer(channel, {"error": f"{type(exc).__name__}: {exc}"})
    return 0


def _library_contender(name: str, model_dir: Path, batch_size: int) -> Any:
    if name == ST_NAME:
        from lib.contenders import st_contender

        contender = st_contender(model_dir, max_seq_len=MAX_SEQ_LEN, batch_size=batch_size)
        if contender is None:
            raise SystemExit(NO_ST_HINT)
        return contender
    from comparing.onnx_contenders import onnx_contender

    return onnx_contender(model_dir, max_seq_len=MAX_SEQ_LEN, batch_size=batch_size)


def _serve(request: dict[str, Any], encode: Callable[[list[str]], Any], encoder: Any) -> dict[str, Any]:
    texts = request["texts"]
    if request["op"] == "count":
        return {"lengths": encoder.tokenize(texts).lengths.tolist()}
    if request["op"] == "bulk":
        seconds, vectors = timed(lambda: np.asarray(encode(texts)))
        return {"seconds": seconds, "vectors": vectors[: request.get("rows", 0)].tolist()}
    if request["op"] != "single":
        raise ValueError(f"no such request: {request['op']!r}")
    for text in texts[: request["warmup"]]:
        encode([text])
    return {"seconds": [timed(lambda t=text: encode([t]))[0] for text in texts[request["warmup"] :]]}


def _answer(channel: IO[str], reply: dict[str, Any]) -> None:
    channel.write(json.dumps(reply) + "\n")
    channel.flush()


def start_children(
    args: argparse.Namespace, model_dir: Path, log_dir: Path, stack: contextlib.ExitStack
) -> dict[str, Child]:
    """The contenders' processes, one after another (each build has the machine to itself);
    the ``Encoder`` at auto first: the others take its batch size."""
    flags = ["--model-dir", str(model_dir)] + (["--graph-dir", str(args.graph_dir)] if args.graph_dir else [])
    if args.batch_size:
        flags += ["--batch-size", str(args.batch_size)]
    children: dict[str, Child] = {}
    for name in BULK:
        why = why_left_out(name, args)
        if why:
            log(f"{name} left out: {why}")
            continue
        log(f"building {name} in a process of its own")
        children[name] = stack.enter_context(contextlib.closing(Child(name, flags, log_dir)))
        log(f"{name}: {children[name].info['note']}, setup {children[name].info['setup_s']:.1f} s")
        if name == AUTO and not args.batch_size:
            flags += ["--batch-size", str(children[name].info["batch_size"])]
    return children


def why_left_out(name: str, args: argparse.Namespace) -> str | None:
    if name == ST_NAME:
        if args.no_sentence_transformers:
            return "--no-sentence-transformers"
        return NO_ST_HINT if importlib.util.find_spec("sentence_transformers") is None else None
    if name == ONNX_FP32:
        return "--no-onnx" if args.no_onnx else onnx_missing()
    return None


def check_counts(encoder: Child, inputs: dict[int, LengthInputs]) -> None:
    """Every input is as long as planned by the ``Encoder``'s own tokenizer too."""
    if encoder.info["max_len"] < max(inputs):
        raise SystemExit(f"the Encoder's max_seq_len is {encoder.info['max_len']}, below {max(inputs)} tokens")
    for length, planned in inputs.items():
        counted = encoder.ask(op="count", texts=planned.everything())["lengths"]
        wrong = sorted({n for n in counted if n != length})
        if wrong:
            raise SystemExit(f"inputs planned at {length} tokens are {wrong} tokens to the Encoder's tokenizer")
        log(f"{length} tokens: {len(counted)} inputs, each {length} tokens to the Encoder's tokenizer too")


# ----------------------------------------------------------------------------------------
# the sweep
# ----------------------------------------------------------------------------------------


def rotated(names: Sequence[str], turn: int) -> list[str]:
    shift = turn % len(names)
    return [*names[shift:], *names[:shift]]


def server_seconds(client: BertClient, texts: list[str], warmup: int) -> list[float]:
    for text in texts[:warmup]:
        client.encode([text])
    return [timed(lambda t=text: client.encode([t]))[0] for text in texts[warmup:]]


def sweep(
    plan: Plan, inputs: dict[int, LengthInputs], children: dict[str, Child], client: BertClient | None
) -> list[dict]:
    """Every length, ``plan.repeats`` times, the contenders taking turns at each: bulk, then
    one input at a time. One untimed batch per contender and length first."""
    bulk_names = [name for name in BULK if name in children]
    single_names = [name for name in SINGLE if name in children or (name == SERVER and client is not None)]
    rates = {length: {name: [] for name in bulk_names} for length in inputs}
    seconds = {length: {name: [] for name in single_names} for length in inputs}
    cosines = {}
    for length, planned in inputs.items():
        warm = {name: children[name].ask(op="bulk", texts=planned.warm, rows=CHECKED_ROWS) for name in bulk_names}
        cosines[length] = agreement(warm)
        if client is not None:
            client.encode(planned.warm)
        log(f"{length} tokens, warm-up batch: " + ", ".join(f"{n} {r['seconds']:.2f} s" for n, r in warm.items()))
    for repeat in range(plan.repeats):
        for index, (length, planned) in enumerate(inputs.items()):
            turn = repeat * len(inputs) + index
            bulk, single = planned.bulk[repeat], planned.single[repeat]
            for name in rotated(bulk_names, turn):
                rates[length][name].append(len(bulk) / children[name].ask(op="bulk", texts=bulk)["seconds"])
            for name in rotated(single_names, turn):
                if name == SERVER:
                    assert client is not None
                    seconds[length][name].append(server_seconds(client, single, plan.warmup))
                else:
                    reply = children[name].ask(op="single", texts=single, warmup=plan.warmup)
                    seconds[length][name].append(reply["seconds"])
            log(
                f"repeat {repeat + 1}/{plan.repeats}, {length} tokens: "
                + ", ".join(f"{n} {rates[length][n][-1]:.0f}/s" for n in bulk_names)
                + "; p50 "
                + ", ".join(f"{n} {1000 * median(seconds[length][n][-1]):.1f} ms" for n in single_names)
            )
    return [row(length, inputs[length], rates[length], seconds[length], cosines[length]) for length in inputs]


def agreement(warm: dict[str, dict]) -> dict[str, float]:
    """Each contender's least cosine to the ``Encoder`` at fp32 (else at auto) on the first
    rows of the warm-up batch: a check that all encode the same inputs alike."""
    reference = FP32 if FP32 in warm else AUTO
    base = np.asarray(warm[reference]["vectors"], dtype=np.float64)
    return {
        name: round(float(cosine_rows(np.asarray(reply["vectors"], dtype=np.float64), base).min()), 5)
        for name, reply in warm.items()
        if name != reference
    }


def row(length: int, planned: LengthInputs, rates: dict, seconds: dict, cosines: dict) -> dict[str, Any]:
    out: dict[str, Any] = {
        "tokens": length,
        "bulk_inputs": len(planned.bulk[0]),
        "bulk": {name: {"per_s": median(runs), "runs": runs} for name, runs in rates.items()},
        "single": {
            name: {**latency_row([s for run in runs for s in run]), "p50_ms_by_run": [1000 * median(r) for r in runs]}
            for name, runs in seconds.items()
        },
        "min_cosine": cosines,
    }
    values = {target: target.measure(out) for target in TARGETS}
    out["targets"] = {
        t.name: {"value": value, "goal": t.goal_text, "verdict": t.verdict(value)} for t, value in values.items()
    }
    return out


# ----------------------------------------------------------------------------------------
# the report
# ----------------------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    rows, plan = report["rows"], report["plan"]
    bulk_names = list(rows[0]["bulk"])
    single_names = list(rows[0]["single"])
    sizes = ", ".join(f"{r['bulk_inputs']} at {r['tokens']}" for r in rows)
    lines = [
        "# bertserve by input length: bulk and one input at a time",
        "",
        f"Command: `{report['command']}`",
        "",
        f"CPU: {describe_cpu(report['environment'])}. Load average {report['load_average']['start']} at the start, "
        f"{report['load_average']['end']} at the end; {report['seconds']:.0f} s in all.",
        "",
        f"Model `{report['model_dir']}`, `max_seq_len` {MAX_SEQ_LEN} (nothing truncated). Inputs of exactly the "
        f"tokens shown (`[CLS]` and `[SEP]` included), cut from `{report['corpus']}` run together and counted by "
        "the model's tokenizer and by the `Encoder`'s, a different text each. Bulk: one call of "
        f"{plan['bulk_tokens']:,} tokens per run ({sizes} inputs), median of {plan['repeats']} runs in turns; "
        f"one input at a time: p50 of {plan['repeats']} x {plan['single']} inputs, {plan['warmup']} of warm-up "
        "before each run. Each in-process contender in a process of its own.",
        "",
        "| contender | how | setup s |",
        "| --- | --- | ---: |",
    ]
    for name, info in report["contenders"].items():
        lines.append(f"| {name} | {info['note']} | {info['setup_s']:.1f} |")
    if report["server"]:
        server = report["server"]
        ready = server["ready_line"].replace("|", "\\|")
        lines.append(f"| {SERVER} | `{' '.join(SERVER_FLAGS)}`: {ready} | {server['ready_s']:.1f} |")
    lines += ["", "Bulk, inputs/s (median):", "", _header(bulk_names)]
    for r in rows:
        lines.append(f"| {r['tokens']} | " + " | ".join(f"{r['bulk'][n]['per_s']:,.1f}" for n in bulk_names) + " |")
    lines += ["", "One input at a time, p50 ms (p90 in brackets):", "", _header(single_names)]
    for r in rows:
        cells = [f"{r['single'][n]['p50_ms']:.1f} ({r['single'][n]['p90_ms']:.1f})" for n in single_names]
        lines.append(f"| {r['tokens']} | " + " | ".join(cells) + " |")
    lines += ["", "Targets, bertserve being the in-process `Encoder` at auto:", ""]
    lines.append(_header([f"{t.name} ({t.goal_text})" for t in TARGETS]))
    for r in rows:
        cells = [_target_cell(r["targets"][t.name]) for t in TARGETS]
        lines.append(f"| {r['tokens']} | " + " | ".join(cells) + " |")
    least = {name: min(r["min_cosine"][name] for r in rows) for name in rows[0]["min_cosine"]}
    if least:
        lines += [
            "",
            "Least cosine to the `Encoder` at fp32 on the warm-up batches' first rows: "
            + ", ".join(f"{name} {value:.4f}" for name, value in least.items())
            + ".",
        ]
    return "\n".join(lines) + "\n"


def _target_cell(measured: dict[str, Any]) -> str:
    if measured["verdict"] == "n/a":
        return "n/a"
    return f"{measured['value']:.2f} {measured['verdict']}"


def _header(names: Sequence[str]) -> str:
    return "| tokens | " + " | ".join(names) + " |\n| ---: |" + " ---: |" * len(names)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rows = report["rows"]
    lengths = [r["tokens"] for r in rows]
    fig, (bulk, single) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in rows[0]["bulk"]:
        bulk.plot(lengths, [r["bulk"][name]["per_s"] for r in rows], marker="o", color=COLOURS[name], label=name)
    p50s = {name: [r["single"][name]["p50_ms"] for r in rows] for name in rows[0]["single"]}
    for name, values in p50s.items():
        single.plot(lengths, values, marker="o", color=COLOURS[name], label=name)
    bulk.set_yscale("log")
    bulk.set_ylabel("inputs/s (log)")
    bulk.set_title("Bulk (higher is better)")
    every = [v for values in p50s.values() for v in values if not math.isnan(v)]
    wide = bool(every) and max(every) > 30 * min(every)  # sentence-transformers alone would flatten the rest
    single.set_yscale("log" if wide else "linear")
    single.set_ylabel("p50 ms" + (" (log)" if wide else ""))
    single.set_title("One input at a time (lower is better)")
    for ax in (bulk, single):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set_xlabel("tokens per input")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


# ----------------------------------------------------------------------------------------
# the command line
# ----------------------------------------------------------------------------------------


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
        children = start_children(args, model_dir, scratch, stack)
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
