"""The in-process contenders of ``lengths.py``, each in a process of its own, built once and
kept for the whole run. The parent starts them as ``python lengths.py --child NAME``; that
command hands its arguments to ``child``, which builds the contender and answers."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, NoReturn

import numpy as np
from comparing.onnx_contenders import ONNX_FP32, onnx_missing
from lib.contenders import NO_ST_HINT, ST_NAME
from lib.load import timed

from lengthwise.inputs import LengthInputs
from lengthwise.plan import AUTO, BULK, FP32, MAX_SEQ_LEN, log


class Child:
    """One in-process contender in a process of its own, built once and kept for the run:
    asked in JSON lines on its stdin, it answers in JSON lines; its stderr goes to a log.
    ``command`` is the script that runs it when given ``--child NAME`` (``lengths.py``)."""

    def __init__(self, name: str, command: str, flags: list[str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name.replace(' ', '-')}.log"
        self._log = self.log_path.open("w", encoding="utf-8")
        self.process = subprocess.Popen(
            [sys.executable, command, "--child", name, *flags],
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
    command: str, args: argparse.Namespace, model_dir: Path, log_dir: Path, stack: contextlib.ExitStack
) -> dict[str, Child]:
    """The contenders' processes, one after another (each build has the machine to itself),
    each ``command --child NAME``; the ``Encoder`` at auto first: the others take its batch size."""
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
        children[name] = stack.enter_context(contextlib.closing(Child(name, command, flags, log_dir)))
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
