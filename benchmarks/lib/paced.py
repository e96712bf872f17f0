"""One query the way users send it: one request, then a pause (``latency.py``'s paced section).

A user's query comes alone, tens of milliseconds or more after the last one. Sent back to back,
one-sentence requests keep every thread spinning and every cache warm; after a pause the
server's threads have slept and must wake, and that is the latency a user sees. So each
contender waits ``pause_s`` (``--pause-ms``, 50 ms by default) before every query:

- the default server over ZeroMQ and over HTTP (:mod:`lib.protocols`), one query to each in
  turn, the order swapped every query;
- ``Encoder`` auto (the server's default dtype) and ONNX Runtime fp32 (``comparing/onnx_contenders.py``,
  left out with the reason when onnxruntime, onnx or torch is missing) in process, each in a
  process of its own (``python -m lib.paced``: PyTorch's and ONNX Runtime's threads would
  spin into TensorFlow's in a shared one), paced the same way.

The inputs are texts of exactly 16, 64, 128 and 256 tokens (``[CLS]`` and ``[SEP]`` included),
cut at word starts from the corpus run together (:mod:`lib.token_lengths`), the same texts for
every contender; the server and the Encoder truncate at :data:`MAX_SEQ_LEN`. Two rounds, each
on half of the timed texts after the same warm-up texts, the contenders' order reversed in
the second, so that noise on a shared machine falls on all alike. :func:`targets`: at each
length and over each protocol, the server's p50 within 1.5 ms of the Encoder's, and no more
than ONNX Runtime fp32's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from comparing.onnx_contenders import ONNX_FP32, onnx_contender, onnx_missing
from comparing.targets import Target, target

from lib.contenders import Contender, encoder_contender
from lib.inputs import model_tokenizer
from lib.load import timed
from lib.protocols import HTTP, PROTOCOLS, ZMQ, Doors, Encode, connected, module_command
from lib.report import last_line
from lib.stats import latency_row
from lib.token_lengths import TokenStream, exact_inputs

LENGTHS = (16, 64, 128, 256)
MAX_SEQ_LEN = 256  # the longest input; all-MiniLM-L6-v2 has 512 positions
ENCODER = "Encoder auto"
ONNX_BATCH = 32  # a query is one row: the batch size never binds
ROUNDS = 2
ENCODER_SLACK_MS = 1.5


def server_name(protocol: str) -> str:
    return f"server auto, {protocol}"


@dataclass(frozen=True)
class Pacing:
    """What the paced section runs: the pause before every query, the timed queries per
    contender at each length (over both rounds), and the warm-up queries of each round."""

    pause_s: float
    queries: int
    warmup: int
    lengths: tuple[int, ...] = LENGTHS

    @classmethod
    def of(cls, args: argparse.Namespace) -> Pacing | None:
        """The plan of :func:`add_options`' flags; None with ``--no-paced``."""
        if args.no_paced:
            return None
        if args.quick:  # a smoke run: each length, briefly
            return cls(pause_s=args.pause_ms / 1000, queries=6, warmup=2)
        return cls(pause_s=args.pause_ms / 1000, queries=args.paced_queries, warmup=args.paced_warmup)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The paced section's flags (``--quick``, the command's, cuts the queries to 6 after 2)."""
    add = parser.add_argument
    add("--pause-ms", type=float, default=50.0, help="the paced queries' pause before each query (default 50)")
    add("--paced-queries", type=int, default=100, help="timed paced queries per contender and length")
    add("--paced-warmup", type=int, default=10, help="paced warm-up queries per contender, length and round")
    add("--no-paced", action="store_true", help="leave out the paced queries")


def paced_inputs(model_dir: Path, corpus: list[str], pacing: Pacing) -> dict[str, dict[str, list[str]]]:
    """At each length (a string: a JSON key), the warm-up texts and the timed texts."""
    tokenizer = model_tokenizer(model_dir, MAX_SEQ_LEN)
    tokenizer.no_truncation()  # a count must see every token
    stream = TokenStream.of(tokenizer, corpus)
    inputs = {}
    for length in pacing.lengths:
        texts = exact_inputs(stream, tokenizer, length, pacing.warmup + pacing.queries, seed=length)
        inputs[str(length)] = {"warmup": texts[: pacing.warmup], "timed": texts[pacing.warmup :]}
    return inputs


def _paced(encode: Encode, text: str, pause_s: float) -> float:
    """Seconds of one query of ``text``, sent ``pause_s`` after the caller's last."""
    time.sleep(pause_s)
    return timed(partial(encode, [text]))[0]


def _half(texts: list[str], round_index: int) -> list[str]:
    middle = len(texts) // 2
    return texts[:middle] if round_index == 0 else texts[middle:]


def _server_round(
    calls: dict[str, Encode], inputs: dict[str, dict[str, list[str]]], round_index: int, pause_s: float
) -> dict[str, dict[str, list[float]]]:
    """The server over each protocol, in turns (the first swapped every query), at each length."""
    names = list(calls)
    times: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for length, texts in inputs.items():
        for text in texts["warmup"]:
            for name in names:
                _paced(calls[name], text, pause_s)
        for name in names:
            times[name][length] = []
        for i, text in enumerate(_half(texts["timed"], round_index)):
            for name in names[i % 2 :] + names[: i % 2]:
                times[name][length].append(_paced(calls[name], text, pause_s))
    return times


def _child_round(name: str, request: dict[str, Any]) -> dict[str, list[float]] | str:
    """One in-process contender's round in a process of its own: the seconds at each length,
    or why it could not run."""
    command, env = module_command("lib.paced")
    sent = json.dumps({**request, "name": name})
    child = subprocess.run(command, input=sent, capture_output=True, text=True, env=env)
    if child.returncode != 0:
        return last_line(child.stderr)
    return json.loads(child.stdout.strip().splitlines()[-1])


def measure(
    doors: Doors, model_dir: Path, graph_dir: Path | None, corpus: list[str], pacing: Pacing, log: Any
) -> dict[str, Any]:
    """Every contender at every length, paced, in :data:`ROUNDS` rounds; per contender and
    length a :func:`lib.stats.latency_row`, and the contenders left out with why."""
    inputs = paced_inputs(model_dir, corpus, pacing)
    left_out: dict[str, str] = {}
    missing = onnx_missing()
    if missing is not None:
        left_out[ONNX_FP32] = missing
        log(f"paced: {ONNX_FP32} left out: {missing}")
    in_process = [name for name in (ENCODER, ONNX_FP32) if name not in left_out]
    servers = [server_name(protocol) for protocol in PROTOCOLS]
    times: dict[str, dict[str, list[float]]] = {name: {n: [] for n in inputs} for name in [*servers, *in_process]}
    with connected(ZMQ, doors) as over_zmq, connected(HTTP, doors) as over_http:
        calls = {server_name(ZMQ): over_zmq, server_name(HTTP): over_http}
        for round_index in range(ROUNDS):
            order = ["server", *in_process]
            for who in order if round_index % 2 == 0 else order[::-1]:
                if who in left_out:
                    continue
                log(f"paced, round {round_index + 1}: {who}, pause {1000 * pacing.pause_s:.0f} ms")
                if who == "server":
                    found = _server_round(calls, inputs, round_index, pacing.pause_s)
                else:
                    halves = {n: {**t, "timed": _half(t["timed"], round_index)} for n, t in inputs.items()}
                    request = {"model_dir": str(model_dir), "graph_dir": graph_dir and str(graph_dir)}
                    answer = _child_round(who, request | {"pause_s": pacing.pause_s, "inputs": halves})
                    if isinstance(answer, str):
                        left_out[who] = answer
                        log(f"paced: {who} left out: {answer}")
                        continue
                    found = {who: answer}
                for name, by_length in found.items():
                    for length, seconds in by_length.items():
                        times[name][length] += seconds
    kept = {name: by_length for name, by_length in times.items() if name not in left_out}
    rows = {name: {n: latency_row(s) for n, s in by_length.items()} for name, by_length in kept.items()}
    return {"pacing": asdict(pacing), "max_seq_len": MAX_SEQ_LEN, "rows": rows, "left_out": left_out}


def targets(result: dict[str, Any] | None) -> list[Target]:
    """At each length and over each protocol: the server's p50 <= the Encoder's + 1.5 ms, and
    <= ONNX Runtime fp32's (n/a where a contender was left out); none without the section."""
    if result is None:
        return []
    rows, pause = result["rows"], 1000 * result["pacing"]["pause_s"]

    def p50(name: str, length: str) -> float:
        return rows.get(name, {}).get(length, {}).get("p50_ms", math.nan)

    found = []
    for length in map(str, result["pacing"]["lengths"]):
        for protocol in PROTOCOLS:
            server = p50(server_name(protocol), length)
            detail = f"p50s, each side paced {pause:.0f} ms"
            prefix = f"paced query, {length} tokens, {protocol}: server p50"
            encoder, onnx = p50(ENCODER, length) + ENCODER_SLACK_MS, p50(ONNX_FP32, length)
            found.append(target(f"{prefix} <= {ENCODER} p50 + 1.5 ms, ms", server, "<=", round(encoder, 2), detail))
            found.append(target(f"{prefix} <= {ONNX_FP32} p50, ms", server, "<=", round(onnx, 2), detail))
    return found


def markdown(result: dict[str, Any] | None) -> list[str]:
    """The section's paragraph and its table, p50 / p90 per contender and length."""
    if result is None:
        return []
    pacing, rows = result["pacing"], result["rows"]
    lengths = list(map(str, pacing["lengths"]))
    lines = [
        "",
        "## One paced query",
        "",
        f"Each query waits {1000 * pacing['pause_s']:.0f} ms after the caller's last, as a user's does: the default "
        f"server (one worker, no `--dtype`, `--max-seq-len {result['max_seq_len']}`) over ZeroMQ (`BertClient.encode`) "
        f"and over HTTP (`httpx`, POST `/v1/embeddings`, base64), in turns; `Encoder` auto and {ONNX_FP32} in "
        f"process, each in a process of its own. Inputs of exactly {', '.join(lengths)} tokens; "
        f"{pacing['queries']} timed queries per contender and length after {pacing['warmup']} of warm-up, in "
        f"{ROUNDS} rounds, the order reversed in the second.",
        "",
        "| contender | " + " | ".join(f"{n} tokens p50 / p90 ms" for n in lengths) + " |",
        "| --- |" + " ---: |" * len(lengths),
    ]
    for name, by_length in rows.items():
        cells = [f"{by_length[n]['p50_ms']:.2f} / {by_length[n]['p90_ms']:.2f}" for n in lengths]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [line for name, why in result["left_out"].items() for line in ("", f"Left out: {name}: {why}")]


def _contender(request: dict[str, Any]) -> Contender:
    model_dir, name = Path(request["model_dir"]), request["name"]
    if name == ENCODER:
        graph_dir = Path(request["graph_dir"]) if request["graph_dir"] else None
        return encoder_contender(model_dir, "auto", max_seq_len=MAX_SEQ_LEN, batch_size=None, graph_dir=graph_dir)
    if name == ONNX_FP32:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the export reads the model directory, nothing else
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        return onnx_contender(model_dir, max_seq_len=MAX_SEQ_LEN, batch_size=ONNX_BATCH)
    raise SystemExit(f"no in-process contender {name!r}")


def _child() -> int:
    """One in-process contender's round: the request on stdin, the seconds at each length as
    JSON on stdout's last line."""
    request = json.loads(sys.stdin.read())
    contender, pause_s = _contender(request), request["pause_s"]
    times = {}
    for length, texts in request["inputs"].items():
        for text in texts["warmup"]:
            _paced(contender.encode, text, pause_s)
        times[length] = [_paced(contender.encode, text, pause_s) for text in texts["timed"]]
    print(json.dumps(times))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
