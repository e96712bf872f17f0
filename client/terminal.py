"""What bertserve shows a person at a terminal, and keeps out of pipes and files: colour,
and progress bars.

Colour follows the common conventions, decided per stream: none when ``NO_COLOR`` (or
termcolor's ``ANSI_COLORS_DISABLED``) is set to anything but the empty string, colour on any
stream when ``FORCE_COLOR`` is, none on ``TERM=dumb``, and otherwise colour only on a
terminal. termcolor is asked to colour only once this module has decided to: on its own
it looks at stdout whichever stream the text goes to, and remembers its first answer.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Literal, TextIO

from termcolor import colored

_STATUS_COLOURS = {"error": "red", "warning": "yellow"}


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (False for pipes, files and closed streams)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def colour_wanted(stream: TextIO) -> bool:
    """Whether text written to ``stream`` should be coloured (see the module docstring)."""
    if os.environ.get("NO_COLOR") or os.environ.get("ANSI_COLORS_DISABLED"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("TERM") == "dumb":
        return False
    return is_terminal(stream)


def paint(text: str, colour: str, stream: TextIO, *, bold: bool = False) -> str:
    """``text`` in ``colour`` if it is going to a stream that wants colour, else as it is."""
    if not colour_wanted(stream):
        return text
    return colored(text, colour, attrs=["bold"] if bold else None, force_color=True)


def print_status(kind: Literal["error", "warning"], message: str, stream: TextIO | None = None) -> None:
    """One ``bertserve: error: ...`` (or ``warning``) line on ``stream`` (stderr), its label
    coloured on a terminal."""
    stream = sys.stderr if stream is None else stream
    label = paint(f"bertserve: {kind}:", _STATUS_COLOURS[kind], stream, bold=True)
    print(f"{label} {message}", file=stream, flush=True)


def progress_bar(total: int, *, file: TextIO | None = None, disable: bool = False) -> Any:
    """A tqdm bar on ``file`` (stderr) that counts ``total`` texts as they are encoded;
    ``disable`` makes it show nothing."""
    from tqdm import tqdm  # imported when first needed: most programs never show a bar

    return tqdm(total=total, unit="text", desc="encoding", file=file, disable=disable, dynamic_ncols=True)
