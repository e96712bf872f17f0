"""The client's ``bertserve`` sub-commands: ``encode``, ``status``, ``stop`` and ``keygen``.

They never import TensorFlow. ``encode``, ``status`` and ``stop`` talk to a running server;
``--host``, ``--port``, ``--port-out``, ``--server-key`` and ``--client-cert`` default to
``BERTSERVE_HOST``, ``BERTSERVE_PORT``, ``BERTSERVE_PORT_OUT``, ``BERTSERVE_SERVER_KEY`` and
``BERTSERVE_CLIENT_CERT`` when those are set; without either, ``--port-out`` is ``--port`` + 1,
as on the server. ``keygen`` writes a CURVE certificate pair.
Each command returns its exit code: 0, or 1 with a one-line error on stderr when the server
does not answer or answers with an error, or ``encode``'s input breaks its promise of one
vector a line (:mod:`~bertserve.client.lines`). Errors and warnings name the commands' flags,
not the Python API's options (:data:`CLI_ADVICE`). ``encode`` shows a progress bar on stderr
when stderr is a terminal, and says so there when the server takes over a second to answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from .advice import Advice
from .core.handshake import check_server
from .core.options import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_TIMEOUT_MS, LONG_INPUTS, EncodeOptions, tcp_address
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
from .security import keygen
from .sync.client import BertClient
from .terminal import is_terminal, print_status, progress_bar

_CONTROL_TIMEOUT_MS = 5_000  # status and stop: a server that answers at all answers these at once
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


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` that ends each flag's line with its default. A flag whose default is
    ``None`` or empty says what leaving it out means in its own help text (see
    :func:`unset_help`), and a switch that takes no value (``--is-tokenized``) is simply off
    unless given. A flag with a ``--no-`` form reads ``--cpu, --no-cpu`` and is on or off
    by default."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 28, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, width)  # room for --request-timeout-ms MS

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if _unset(action.default) or action.nargs == 0 or "(default" in (action.help or ""):
            return action.help
        if isinstance(action, argparse.BooleanOptionalAction) and isinstance(action.default, bool):
            return f"{action.help} (default: {'on' if action.default else 'off'})"
        return super()._get_help_string(action)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, argparse.BooleanOptionalAction):  # it may also take a word: --cpu false
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


def unset_help(help: str, default: object, meaning: str) -> str:
    """``help`` for a flag, ending with what leaving it out means while its default is None
    or empty (a default from the environment is shown by :class:`HelpFormatter` instead)."""
    return f"{help} (default: {meaning})" if _unset(default) else help


def _unset(default: object) -> bool:
    return default is None or (isinstance(default, (list, tuple)) and not default)


def add_client_commands(subparsers: Any) -> None:
    """Register ``encode``, ``status``, ``stop`` and ``keygen`` on an ``add_subparsers()``
    object; each sets ``run``, called as ``args.run(args)`` and returning the exit code."""
    encode = subparsers.add_parser(
        "encode",
        help="encode lines of text on a running server, write a .npy file",
        description="Encode each line of a UTF-8 text on a running server: row i of the output is line i+1. "
        "A blank line is an error unless --skip-blank leaves it out (the skipped lines are named on stderr); "
        "empty input is an error, and writes nothing. A line 'first ||| second' is a sentence pair only "
        "with --pairs. Write to NAME.npz to keep each row's line number beside the vectors.",
        formatter_class=HelpFormatter,
    )
    encode.add_argument("input", nargs="?", default="-", help="text file, one sentence a line (default: stdin)")
    encode.add_argument(
        "-o",
        "--output",
        default="embeddings.npy",
        help="where to write the vectors: NAME.npy, or NAME.npz with arrays vectors and lines (each row's "
        "line number, from 1)",
    )
    _add_connection_arguments(encode, DEFAULT_TIMEOUT_MS)
    encode.add_argument("--batch-size", type=_positive_int, default=256, help="sentences per request")
    encode.add_argument("--is-tokenized", action="store_true", help="each line is tokens separated by whitespace")
    encode.add_argument(
        "--skip-blank", action="store_true", help="leave blank lines out and name them on stderr, instead of failing"
    )
    encode.add_argument(
        "--pairs",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="read a line 'first ||| second' as a sentence pair (default: off, one sentence a line)",
    )
    encode.add_argument(
        "--long-inputs",
        choices=LONG_INPUTS,
        help=unset_help(
            "a line longer than the server's max_seq_len tokens: truncate it, or chunk it (windows, vectors "
            "combined; sentence pairs are truncated even so)",
            None,
            "the server's --long-inputs",
        ),
    )
    encode.add_argument(
        "--model",
        metavar="NAME",
        help=unset_help("the served model to encode with, on a server of several", None, "the server's default model"),
    )
    encode.set_defaults(run=_cmd_encode)

    status = subparsers.add_parser(
        "status", help="print a running server's status as JSON", formatter_class=HelpFormatter
    )
    _add_connection_arguments(status, _CONTROL_TIMEOUT_MS)
    status.set_defaults(run=_cmd_status)

    stop = subparsers.add_parser("stop", help="ask a running server to shut down", formatter_class=HelpFormatter)
    _add_connection_arguments(stop, _CONTROL_TIMEOUT_MS)
    stop.set_defaults(run=_cmd_stop)

    reload = subparsers.add_parser(
        "reload",
        help="have a server of a model repository look for a new version now, and swap to it",
        description="Ask the server to check its repository of model versions at once and swap its workers to "
        "the version found, one at a time, without failing a request; then follow the swap until it ends.",
        formatter_class=HelpFormatter,
    )
    _add_connection_arguments(reload, _CONTROL_TIMEOUT_MS)
    reload.add_argument(
        "--model-version", default="latest", help="a version number to serve (a rollback, say), or latest"
    )
    reload.add_argument(
        "--wait-s", type=float, default=600.0, help="follow the swap for at most this long (0: do not wait)"
    )
    reload.add_argument(
        "--model",
        metavar="NAME",
        help=unset_help("the served model to swap, on a server of several", None, "the server's default model"),
    )
    reload.set_defaults(run=_cmd_reload)

    keys = subparsers.add_parser(
        "keygen",
        help="write a CURVE certificate pair (NAME.key to share, NAME.key_secret to keep)",
        description="Write a CURVE certificate pair DIR/NAME.key (public: give it to the other side) and "
        "DIR/NAME.key_secret (secret, mode 0600). A server's directory holds server.key_secret, "
        "clients/ with each allowed client's NAME.key, and admins/ with the keys that may stop it.",
        formatter_class=HelpFormatter,
    )
    keys.add_argument("directory", metavar="DIR", help="where to write the pair (created if missing)")
    keys.add_argument("--name", required=True, help="file name of the pair, e.g. server or a client's name")
    keys.set_defaults(run=_cmd_keygen)


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, not {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, not {number}")
    return number


def _port(value: str) -> int:
    number = _positive_int(value)
    if number > 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, not {number}")
    return number


def _add_connection_arguments(parser: argparse.ArgumentParser, timeout_ms: int) -> None:
    group = parser.add_argument_group("server")
    env = os.environ.get
    # argparse applies ``type`` to string defaults, so values from the environment are checked too.
    group.add_argument("--host", default=env("BERTSERVE_HOST", DEFAULT_HOST), help="server host")
    group.add_argument(
        "--port", type=_port, default=env("BERTSERVE_PORT", DEFAULT_PORT), help="server port for requests"
    )
    port_out = env("BERTSERVE_PORT_OUT") or None
    group.add_argument(
        "--port-out", type=_port, default=port_out, help=unset_help("server port for replies", port_out, "--port + 1")
    )
    group.add_argument("--timeout", type=_positive_int, default=timeout_ms, help="milliseconds to wait for an answer")
    server_key = env("BERTSERVE_SERVER_KEY") or None
    group.add_argument(
        "--server-key",
        default=server_key,
        metavar="KEY",
        help=unset_help(
            "CURVE: the server's public key, its server.key file or z85 text (needs --client-cert)",
            server_key,
            "plain TCP",
        ),
    )
    client_cert = env("BERTSERVE_CLIENT_CERT") or None
    group.add_argument(
        "--client-cert",
        default=client_cert,
        metavar="FILE",
        help=unset_help(
            "CURVE: this client's NAME.key_secret, whose NAME.key the server lists (needs --server-key)",
            client_cert,
            "plain TCP",
        ),
    )


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


def _cmd_encode(args: argparse.Namespace) -> int:
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
        f"in {elapsed:.1f} s ({len(texts) / max(elapsed, 1e-9):.0f} sentences/s)",
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


def _cmd_status(args: argparse.Namespace) -> int:
    try:
        with _connect(args, check_version=False) as client:
            status = client.server_status
    except BertClientError as exc:
        return _fail(exc)
    print(json.dumps(status, indent=2, sort_keys=True))
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    try:
        with _connect(args, check_version=False) as client:
            client.terminate()
    except BertClientError as exc:
        return _fail(exc)
    print(f"the server at tcp://{args.host}:{args.port} is stopping")
    return 0


_SWAP_ENDS = {"unchanged": 0, "done": 0, "refused": 1, "rolled_back": 1}  # final swap states -> exit code


def _cmd_reload(args: argparse.Namespace) -> int:
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


def _cmd_keygen(args: argparse.Namespace) -> int:
    try:
        public, secret = keygen(args.directory, args.name)
    except (OSError, ValueError) as exc:
        return _fail(exc)
    print(public)
    print(secret)
    return 0
