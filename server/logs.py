"""Logging for the CLI and the server's child processes (colour only in the formatter, and
only where :func:`~bertserve.client.terminal.colour_wanted` says so)."""

from __future__ import annotations

import logging
import os
import sys
from typing import ClassVar

from bertserve.client.terminal import colour_wanted


class _Formatter(logging.Formatter):
    _COLOURS: ClassVar[dict[int, str]] = {
        logging.DEBUG: "blue", logging.INFO: "green", logging.WARNING: "yellow", logging.ERROR: "red",
    }  # fmt: skip

    def __init__(self, colour: bool) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s[%(process)d]: %(message)s", "%H:%M:%S")
        self._colour = colour

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if self._colour:
            from termcolor import colored

            return colored(text, self._COLOURS.get(record.levelno, "red"), force_color=True)
        return text


def setup_logging(level: int = logging.INFO) -> None:
    """Send the ``bertserve`` loggers to stderr; quiet TensorFlow's C++ start-up chatter."""
    handler = logging.StreamHandler()
    handler.setFormatter(_Formatter(colour=colour_wanted(sys.stderr)))
    root = logging.getLogger("bertserve")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def child_logging(level: int) -> None:
    """A spawned child starts with no logging set up: apply the parent's."""
    setup_logging(level)
