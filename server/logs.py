"""Logging for the CLI and the server's child processes (colour only in the formatter, and
only where :func:`~bertserve.client.terminal.colour_wanted` says so), and the quieting of
what TensorFlow's and LiteRT's C++ code writes to stderr."""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar

from bertserve.client.terminal import colour_wanted

from .config.telemetry import Telemetry

TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
"""0 shows TensorFlow's C++ INFO lines and up, 1 WARNING, 2 ERROR, 3 only FATAL ones."""
_QUIET_LEVEL = "3"

# The C++ line formats, and the TF_CPP_MIN_LOG_LEVEL at which each line is hidden.
_ABSL_LINE = re.compile(r"([IWEF])\d{4} ")  # "I0000 00:00:1796120996.136590 5284 cudart_stub.cc:31] ..."
_PLAIN_LINE = re.compile(r"(INFO|WARNING|ERROR): ")  # LiteRT's, and absl's notice before its set-up
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3, "INFO": 0, "WARNING": 1, "ERROR": 2}
_OTHER = 4  # a line of any other form (Python's own output, a crash report) always shows


class _Formatter(logging.Formatter):
    _COLOURS: ClassVar[dict[int, str]] = {
        logging.DEBUG: "blue",
        logging.INFO: "green",
        logging.WARNING: "yellow",
        logging.ERROR: "red",
    }

    def __init__(self, colour: bool) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s[%(process)d]: %(message)s", "%H:%M:%S")
        self._colour = colour

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if self._colour:
            from termcolor import colored

            return colored(text, self._COLOURS.get(record.levelno, "red"), force_color=True)
        return text


REQUEST_ID: ContextVar[str | None] = ContextVar("bertserve_request_id", default=None)
"""The id of the request being served in this task (an HTTP request's, :mod:`.http.request_ids`):
the ``request_id`` of a log line that does not name one."""

ANSWERED_BY: ContextVar[str | None] = ContextVar("bertserve_answered_by", default=None)
"""The served model the HTTP request being served in this task reached (:mod:`.http.catalog`):
its access line names it."""


class _Fields(logging.Filter):
    """Gives every record of a process the fields a JSON line names even when the call did not
    (``role``, ``model``, ``request_id``: the request served in this task, if any); one the
    call gave (``extra=``) is kept."""

    def __init__(self, role: str, model: str | None) -> None:
        super().__init__()
        self._defaults = {"role": role, "model": model, "request_id": None}

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in self._defaults.items():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        access = record.args if record.name == "uvicorn.access" else None
        if isinstance(access, tuple) and len(access) == 5:  # (client, method, path, HTTP version, status)
            record.client, record.method, record.path, _, record.status = access
            model = ANSWERED_BY.get()
            if model is not None:  # the model that answered, in the text line as in the JSON one
                record.model, record.msg, record.args = model, f"{record.msg} model=%s", (*access, model)
        return True


def _json_formatter() -> logging.Formatter:
    """One JSON object a line (python-json-logger): ``time`` (ISO 8601, UTC), ``level``,
    ``role``, ``pid``, ``logger``, ``message``, and ``model`` and ``request_id`` where known;
    an access line adds ``client``, ``method``, ``path`` and ``status``; an exception, ``exc_info``."""
    from pythonjsonlogger.core import RESERVED_ATTRS
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        ["levelname", "role", "process", "name", "message", "model", "request_id"],
        rename_fields={"levelname": "level", "process": "pid", "name": "logger"},
        timestamp="time",
        reserved_attrs=[*RESERVED_ATTRS, "color_message"],  # uvicorn's coloured copy of the message
    )


def json_line(message: str, *, level: int = logging.INFO, role: str = "cli", **fields: Any) -> str:
    """What the CLI prints itself (the ready line, an error), as ``--log-format json`` writes a
    record of its logger ``bertserve.cli``, with ``fields`` added: one JSON object, one line."""
    record = logging.LogRecord("bertserve.cli", level, __file__, 0, message, None, None)
    record.__dict__.update(fields)
    _Fields(role, None).filter(record)
    return _json_formatter().format(record)


def setup_logging(
    level: int = logging.INFO, *, json: bool = False, role: str = "cli", model: str | None = None
) -> None:
    """Send the ``bertserve`` loggers to stderr, as text (coloured on a terminal) or, with
    ``json``, one JSON object a line naming the process's ``role`` (and ``model``, the one it
    serves); TensorFlow's Python logger says only errors unless ``level`` is DEBUG."""
    handler = logging.StreamHandler()
    handler.setFormatter(_json_formatter() if json else _Formatter(colour=colour_wanted(sys.stderr)))
    handler.addFilter(_Fields(role, model))
    root = logging.getLogger("bertserve")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    # TensorFlow's Python logger warns of deprecations inside its own APIs: noise unless -v.
    logging.getLogger("tensorflow").setLevel(logging.NOTSET if level <= logging.DEBUG else logging.ERROR)


class Refusals:
    """Logs refused messages to ``logger`` at most once per ``interval_s``, counting the ones
    not logged, so a flood of bad messages cannot flood the log."""

    def __init__(self, logger: logging.Logger, interval_s: float = 1.0, level: int = logging.WARNING) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._level = level
        self._next = 0.0
        self._quiet = 0

    def log(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now < self._next:
            self._quiet += 1
            return
        if self._quiet:
            message += " (and %d more refused in the last second)"
            args = (*args, self._quiet)
        self._logger.log(self._level, message, *args)
        self._next, self._quiet = now + self._interval_s, 0


def child_telemetry(telemetry: Telemetry, role: str, model: str | None = None) -> None:
    """A spawned child starts with no logging set up: apply the server's (its level and form),
    naming the child's ``role`` and the ``model`` it serves; and its traces, if they are on
    (:mod:`.tracing`), whose last spans are sent as the child exits."""
    setup_logging(telemetry.level, json=telemetry.json_logs, role=role, model=model)
    if telemetry.traces_endpoint is not None:
        from multiprocessing.util import Finalize

        from . import tracing

        tracing.setup(telemetry.traces_endpoint, role, model)
        # A spawned child ends with os._exit, which runs no atexit handler, but after the
        # finalizers registered with an exit priority: the spans still batched are sent then.
        Finalize(None, tracing.shutdown, exitpriority=10)


def quiet_native_logs(verbose: bool) -> None:
    """Keep TensorFlow's and LiteRT's C++ start-up lines off stderr unless ``verbose``.

    Sets ``TF_CPP_MIN_LOG_LEVEL=3`` in the environment, which every process the server spawns
    inherits, unless the user set it. It must come before any process imports TensorFlow,
    which reads it as it loads; then what TensorFlow logs once loaded (a CPU-only machine's
    "failed call to cuInit", oneDNN's notices) stays hidden, and :func:`held_native_output`
    applies the same level to what comes earlier.
    """
    if not verbose:
        os.environ.setdefault(TF_LOG_LEVEL, _QUIET_LEVEL)


def quiet_tensorflow(verbose: bool | None = None) -> None:
    """For TensorFlow run outside the CLI (an ``Encoder`` in a program of one's own): what
    ``bertserve start`` does, unless ``verbose``: :func:`quiet_native_logs`, and TensorFlow's
    Python logger at ERROR unless its level was set. ``None`` leaves a process whose logging
    :func:`setup_logging` set up (a ``bertserve`` command or its workers) as ``-v`` made it,
    and quiets any other."""
    if verbose is None:
        handlers = logging.getLogger("bertserve").handlers
        if any(isinstance(f, _Fields) for handler in handlers for f in handler.filters):
            return
        verbose = False
    quiet_native_logs(verbose)
    tf_logger = logging.getLogger("tensorflow")  # deprecation warnings from inside TensorFlow's own APIs
    if not verbose and tf_logger.level == logging.NOTSET:
        tf_logger.setLevel(logging.ERROR)


def min_log_level() -> int:
    """``TF_CPP_MIN_LOG_LEVEL`` as TensorFlow reads it: 0 when unset or not a number."""
    try:
        return int(os.environ.get(TF_LOG_LEVEL, "0"))
    except ValueError:
        return 0


@contextmanager
def held_native_output() -> Iterator[None]:
    """Hold back what is written to stderr inside the block; when it ends, let through the
    lines at or above ``TF_CPP_MIN_LOG_LEVEL``, and every line of another form.

    TensorFlow's libraries log from their static initializers, before they read the level
    (absl's "All log messages before absl::InitializeLog() is called are written to STDERR",
    "Could not find cuda drivers on your machine"), and LiteRT's logger never reads it
    ("Created TensorFlow Lite XNNPACK delegate for CPU."). So only the calls that write those
    lines are wrapped: the first ``import tensorflow`` and LiteRT's first allocation. With
    the level at 0 (``-v``) nothing is held. A native crash inside the block loses what the
    block held; ``-v`` shows it.
    """
    level = min_log_level()
    if level <= 0:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                held.seek(0)
                lines = held.read().decode("utf-8", "replace").splitlines(keepends=True)
                shown = "".join(line for line in lines if _severity(line) >= level)
                if shown:
                    os.write(2, shown.encode("utf-8"))
    finally:
        os.close(saved)


def _severity(line: str) -> int:
    match = _ABSL_LINE.match(line) or _PLAIN_LINE.match(line)
    return _SEVERITY[match[1]] if match else _OTHER
