"""The client's ``bertserve`` sub-commands and their flags: ``encode``, ``rerank``, ``status``, ``stop``,
``reload`` and ``keygen``.

They never import TensorFlow. ``encode``, ``status`` and ``stop`` talk to a running server;
``--host``, ``--port``, ``--port-out``, ``--server-key`` and ``--client-cert`` default to
``BERTSERVE_HOST``, ``BERTSERVE_PORT``, ``BERTSERVE_PORT_OUT``, ``BERTSERVE_SERVER_KEY`` and
``BERTSERVE_CLIENT_CERT`` when those are set; without either, ``--port-out`` is ``--port`` + 1,
as on the server. ``keygen`` writes a CURVE certificate pair. What each command does is
:mod:`~bertserve.client.commands`'.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from . import commands
from .core.options import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_TIMEOUT_MS, LONG_INPUTS

_CONTROL_TIMEOUT_MS = 5_000  # status and stop: a server that answers at all answers these at once


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
    encode.set_defaults(run=commands.encode)

    rerank = subparsers.add_parser(
        "rerank",
        help="rank documents, one a line, by their relevance to a query, with a reranker on a running server",
        description="Rank the documents of a UTF-8 text, one a line (blank lines left out), by their relevance to "
        "QUERY, with a reranker (a cross-encoder) the server serves. Prints one line a document, best first: its "
        "score, its line number and its text, tab-separated; or JSON with --json.",
        formatter_class=HelpFormatter,
    )
    rerank.add_argument("query", help="the query the documents are ranked for")
    rerank.add_argument("input", nargs="?", default="-", help="text file, one document a line (default: stdin)")
    _add_connection_arguments(rerank, DEFAULT_TIMEOUT_MS)
    rerank.add_argument("--top-n", type=_positive_int, help=unset_help("print the n best", None, "every document"))
    rerank.add_argument("--raw-scores", action="store_true", help="print the model's logits, not its scores")
    rerank.add_argument("--json", action="store_true", help="print a JSON list of {index, line, score, text}")
    rerank.add_argument(
        "--model",
        metavar="NAME",
        help=unset_help("the served reranker, on a server of several", None, "the server's default model"),
    )
    rerank.set_defaults(run=commands.rerank)

    status = subparsers.add_parser(
        "status",
        help="print a running server's status: models, workers, queue, requests, uptime (--json: every figure)",
        formatter_class=HelpFormatter,
    )
    _add_connection_arguments(status, _CONTROL_TIMEOUT_MS)
    status.add_argument("--json", action="store_true", help="print the whole status as JSON")
    status.set_defaults(run=commands.status)

    stop = subparsers.add_parser("stop", help="ask a running server to shut down", formatter_class=HelpFormatter)
    _add_connection_arguments(stop, _CONTROL_TIMEOUT_MS)
    stop.set_defaults(run=commands.stop)

    reload = subparsers.add_parser(
        "reload",
        help="have a server of a model repository look for a new version now, and swap to it",
        description="Ask the server to check its repository of model versions at once and swap its workers to "
        "the version found, one at a time, without failing a request; then follow the swap until it ends.",
        formatter_class=HelpFormatter,
    )
    _add_connection_arguments(reload, _CONTROL_TIMEOUT_MS)
    reload.add_argument(
        "--model-version",
        "--version",
        default="latest",
        help="a version number to serve (a rollback, say), or latest",
    )
    reload.add_argument(
        "--wait-s", type=float, default=600.0, help="follow the swap for at most this long (0: do not wait)"
    )
    reload.add_argument(
        "--model",
        metavar="NAME",
        help=unset_help("the served model to swap, on a server of several", None, "the server's default model"),
    )
    reload.set_defaults(run=commands.reload)

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
    keys.set_defaults(run=commands.keygen)


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
