"""What the client's ``bertserve`` sub-commands do, once :mod:`~bertserve.client.cli` has
read their flags.

Each command returns its exit code: 0, or 1 with a one-line error on stderr when the server
does not answer or answers with an error, or ``encode``'s input breaks its promise of one
vector a line (:mod:`~bertserve.client.lines`). Errors and warnings name the commands' flags,
not the Python API's options (:data:`CLI_ADVICE`). ``encode`` shows a progress bar on stderr
when stderr is a terminal, and says so there when the server takes over a second to answer.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .advice import Advice
from .core.handshake import check_server
from .core.options import EncodeOptions, tcp_address
from .core.requests import length_warning
from .errors import BertClientError, NoServerError
from .lines import (
    Lines,
    empty_sided_pair,
    long_pairs,
    numbered,
    read_lines,
    save,
    skipped_note,
    some_lines,
    source_name,
    unpaired_warning,
)
from .security import keygen as write_keys
from .status_text import status_summary
from .sync.client import BertClient
from .terminal import is_terminal, print_status, progress_bar

_WAITING_AFTER_S = 1.0  # encode says it waits for the server once the handshake takes this long

CLI_ADVICE = Advice(
    chunk="pass --long-inputs chunk",
    silence_length="pass --long-inputs truncate",
    silence_version=None,
    max_seq_len="--max-seq-len",
    server_elsewhere="pass its --host and --port",
    input="line",
)
"""How the commands' messages say what to change: with their flags."""


def _connect(args: argparse.Namespace, **options: Any) -> BertClient:
    """A client for the command's server; a bad CURVE option becomes a :class:`BertClientError`
    so that the command reports it in one line like any other failure."""
    try:
        return BertClient(
            args.host,
            args.port,
            args.port_out,
            timeout=args.timeout,
            server_key=args.server_key,
            client_cert=args.client_cert,
            **options,
        )
    except ValueError as exc:
        raise BertClientError(str(exc)) from exc


def _duration(seconds: float) -> str:
    """``1.3 s``, or ``45 ms`` under a second (where ``0.0 s`` would say nothing)."""
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"


def _fail(exc: Exception) -> int:
    print_status("error", exc.advise(CLI_ADVICE) if isinstance(exc, NoServerError) else str(exc))
    return 1


@contextmanager
def _said_if_slow(message: str) -> Iterator[None]:
    """Print ``message`` on stderr if the block takes over :data:`_WAITING_AFTER_S`, and only
    when stderr is a terminal: a person waiting learns what for, a pipe stays clean."""
    if not is_terminal(sys.stderr):
        yield
        return
    lock = threading.Lock()
    finished = threading.Event()

    def say() -> None:
        with lock:
            if not finished.is_set():
                print(message, file=sys.stderr, flush=True)

    timer = threading.Timer(_WAITING_AFTER_S, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            finished.set()
        timer.cancel()


def _batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def encode(args: argparse.Namespace) -> int:
    source = source_name(args.input)
    try:
        lines = numbered(read_lines(args.input, keep_blank=True), source, skip_blank=args.skip_blank)
        if args.pairs and (problem := empty_sided_pair(lines, args.is_tokenized)):
            raise ValueError(f"{problem}: write both sentences, or pass --no-pairs")
    except (OSError, ValueError) as exc:
        return _fail(exc)
    if not args.pairs and (unpaired := unpaired_warning(lines, source, args.is_tokenized)):
        print_status("warning", unpaired)
    texts: list[Any] = [line.split() for line in lines.texts] if args.is_tokenized else lines.texts
    started = time.perf_counter()
    address = tcp_address(args.host, args.port)
    try:
        with _said_if_slow(f"waiting for the server at {address} ..."):
            client = _connect(args, model=args.model, check_version=False, check_length=False)
        with client:
            _check_server(client.server_config, address, lines, texts, args)
            parts = []
            batches = _batches(texts, args.batch_size)
            with progress_bar(len(texts), disable=not is_terminal(sys.stderr)) as bar:
                for part in client.encode_async(
                    batches, is_tokenized=args.is_tokenized, pairs=args.pairs, long_inputs=args.long_inputs
                ):
                    parts.append(part)
                    bar.update(len(part))
            vectors = np.concatenate(parts, axis=0)
    except BertClientError as exc:
        return _fail(exc)
    elapsed = time.perf_counter() - started
    written = save(args.output, vectors, lines.numbers)
    if skipped := skipped_note(lines, source, written):
        print(skipped, file=sys.stderr)
    count = vectors.shape[0]
    print(
        f"wrote {count} {'vector' if count == 1 else 'vectors'} of dimension {vectors.shape[-1]} to {written} "
        f"in {_duration(elapsed)} ({len(texts) / max(elapsed, 1e-9):,.0f} sentences/s)",
        file=sys.stderr,
    )
    return 0


def _check_server(
    config: dict[str, Any], address: str, lines: Lines, texts: list[Any], args: argparse.Namespace
) -> None:
    """What ``BertClient`` checks and warns of on its own (the server's protocol and version,
    lines that will be cut), said in flags and line numbers; and sentence pairs that
    ``--long-inputs chunk`` will cut even so."""
    advice = replace(CLI_ADVICE, line_numbers=lines.numbers)
    check_server(config, address, stacklevel=2, advice=advice)
    if EncodeOptions(long_inputs=args.long_inputs).chunks_long_inputs(config):
        limit = config.get("max_seq_len")
        if args.pairs and isinstance(limit, int) and (cut := long_pairs(lines, limit, args.is_tokenized)):
            are, they = ("is a sentence pair", "it") if len(cut) == 1 else ("are sentence pairs", "they")
            print_status(
                "warning",
                f"{some_lines(cut)} {are} longer than the server's max_seq_len={limit} tokens: --long-inputs "
                f"chunk encodes single sentences in windows, never pairs, so {they} will be truncated",
            )
    elif args.long_inputs != "truncate" and (message := length_warning(config, texts, args.is_tokenized, advice)):
        print_status("warning", message)


def rerank(args: argparse.Namespace) -> int:
    """Rank the input's non-blank lines by their relevance to the query; print them best first."""
    try:
        text = sys.stdin.read() if args.input == "-" else Path(args.input).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return _fail(BertClientError(f"cannot read {source_name(args.input)}: {exc}"))
    numbered_lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not numbered_lines:
        return _fail(BertClientError(f"{source_name(args.input)} holds no document: give one a line"))
    try:
        with _connect(args) as client, _said_if_slow(f"waiting for the server at {args.host}:{args.port} ..."):
            ranked = client.rerank(
                args.query,
                [line for _, line in numbered_lines],
                args.top_n,
                raw_scores=args.raw_scores,
                model=args.model,
            )
    except (BertClientError, ValueError) as exc:
        return _fail(exc)
    rows = [
        {"index": r.index, "line": numbered_lines[r.index][0], "score": r.score, "text": numbered_lines[r.index][1]}
        for r in ranked
    ]
    if args.json:
        print(json.dumps(rows, ensure_ascii=False))
    else:
        for row in rows:
            print(f"{row['score']:.6f}\t{row['line']}\t{row['text']}")
    return 0


def status(args: argparse.Namespace) -> int:
    try:
        with _connect(args, check_version=False) as client:
            status = client.server_status
    except BertClientError as exc:
        return _fail(exc)
    print(json.dumps(status, indent=2, sort_keys=True) if args.json else status_summary(status))
    return 0


def stop(args: argparse.Namespace) -> int:
    try:
        with _connect(args, check_version=False) as client:
            client.terminate()
    except BertClientError as exc:
        return _fail(exc)
    print(f"the server at tcp://{args.host}:{args.port} is stopping")
    return 0


_SWAP_ENDS = {"unchanged": 0, "done": 0, "refused": 1, "rolled_back": 1}  # final swap states -> exit code


def reload(args: argparse.Namespace) -> int:
    """Send RELOAD, then print the swap's progress from the status until it ends."""
    try:
        with _connect(args, check_version=False) as client:
            answer = client.reload(args.model_version, model=args.model)
            print(f"the server serves version {answer.get('model_version')}; looking for {answer.get('wanted')}")
            deadline = time.monotonic() + args.wait_s
            said = ""
            while time.monotonic() < deadline:
                status = client.server_status
                swap = (status.get("models", {}).get(args.model, {}) if args.model else status).get("swap", {})
                if swap.get("reload") == answer["reload"]:
                    line = f"{swap.get('state')}: {swap.get('message', '')}".rstrip(": ")
                    if line != said:
                        print(line)
                        said = line
                    if swap.get("state") in _SWAP_ENDS:
                        return _SWAP_ENDS[swap["state"]]
                time.sleep(0.5)
    except BertClientError as exc:
        return _fail(exc)
    if args.wait_s > 0:
        print_status("warning", f"the swap had not ended after {args.wait_s:.0f} s; see `bertserve status`")
    return 0


def keygen(args: argparse.Namespace) -> int:
    try:
        public, secret = write_keys(args.directory, args.name)
    except (OSError, ValueError) as exc:
        return _fail(exc)
    print(public)
    print(secret)
    return 0
