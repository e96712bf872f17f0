"""``latency.py``'s in-process contenders, one sentence per call: sentence-transformers (when
installed) and the ``Encoder`` at each dtype, each in a process of its own (``python -m
lib.in_process``): PyTorch's OpenMP threads spin after a call and would slow TensorFlow's next
one in a shared process, and each Encoder's graphs and threads are its own."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

from lib.contenders import encoder_contender, st_contender
from lib.load import timed
from lib.protocols import module_command
from lib.report import last_line
from lib.stats import latency_row

ST = "sentence-transformers"
NO_LITE = "Encoder fp32, TensorFlow only"  # --lite-max-tokens 0: every run on oneDNN
ENCODERS = ("Encoder auto", "Encoder fp32", NO_LITE, "Encoder bf16", "Encoder int8")  # auto: the default dtype


def measure(
    model_dir: Path, graph_dir: Path | None, texts: list[str], *, warmup: int, max_seq_len: int, st: bool, log: Any
) -> tuple[dict[str, dict], dict[str, str]]:
    """Each contender (sentence-transformers first, if ``st`` and installed) in two rounds
    that take turns, each round on half of the sentences after the first ``warmup``. Returns
    the rows, and the contenders that cannot run here with the reason each gave."""
    names = list(ENCODERS)
    if st and importlib.util.find_spec("sentence_transformers") is not None:
        names.insert(0, ST)
    else:
        log("sentence-transformers left out (pip install -r requirements-bench.txt)")
    timed_texts = texts[warmup:]
    halves = [timed_texts[: len(timed_texts) // 2], timed_texts[len(timed_texts) // 2 :]]
    times: dict[str, list[float]] = {name: [] for name in names}
    left_out: dict[str, str] = {}
    command, env = module_command("lib.in_process")
    for half in halves:
        for name in [n for n in names if n not in left_out]:
            log(f"in process: {name}, {len(half)} sentences")
            request: dict[str, Any] = {"name": name, "model_dir": str(model_dir), "graph_dir": str(graph_dir or "")}
            request |= {"max_seq_len": max_seq_len, "warmup": texts[:warmup], "texts": half}
            child = subprocess.run(command, input=json.dumps(request), capture_output=True, text=True, env=env)
            if child.returncode != 0:
                left_out[name] = last_line(child.stderr)
                log(f"{name} left out: {left_out[name]}")
                continue
            times[name] += json.loads(child.stdout.strip().splitlines()[-1])
    return {name: latency_row(values) for name, values in times.items() if name not in left_out}, left_out


def _child() -> int:
    """One in-process contender: read what to time on stdin, print the seconds as JSON."""
    request = json.loads(sys.stdin.read())
    model_dir, name, max_seq_len = Path(request["model_dir"]), request["name"], request["max_seq_len"]
    if name == ST:
        contender = st_contender(model_dir, max_seq_len=max_seq_len, batch_size=32)
        assert contender is not None
    else:
        graph_dir = Path(request["graph_dir"]) if request["graph_dir"] else None
        dtype = name.split()[1].rstrip(",")
        lite = 0 if name == NO_LITE else None
        contender = encoder_contender(
            model_dir, dtype, max_seq_len=max_seq_len, batch_size=None, graph_dir=graph_dir, lite_max_tokens=lite
        )
    for text in request["warmup"]:
        contender.encode([text])
    print(json.dumps([timed(partial(contender.encode, [text]))[0] for text in request["texts"]]))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
