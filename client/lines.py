"""The input of ``bertserve encode``, one text a line, and the file its vectors go to.

The command promises one vector per line: row ``i`` is line ``i + 1``. A blank line would
break that promise in silence, so it is an error naming the line, unless the caller asks to
skip blank lines: then the rows follow the other lines, the skipped ones are named on
stderr, and an output named ``*.npz`` holds each row's line number (``lines``) beside the
vectors (``vectors``). Input with no lines at all is an error too, and no file is written.

A line holding ``|||`` is a sentence pair only when the caller says so (``--pairs``); the
helpers here find the lines a warning should name either way.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .protocol import PAIR_SEPARATOR


@dataclass(frozen=True)
class Lines:
    """The lines to encode, ``numbers`` the line number (from 1) of each, and ``skipped`` the
    numbers of the blank lines left out."""

    texts: list[str]
    numbers: list[int]
    skipped: list[int]


def source_name(path: str) -> str:
    """How messages name the input ``path`` (``"-"`` is stdin)."""
    return "stdin" if path == "-" else path


def read_lines(path: str, *, keep_blank: bool = False) -> list[str]:
    """The lines of a UTF-8 file, or of stdin for ``"-"``: the non-blank ones, or every one
    with ``keep_blank``. Lines end at ``\\n`` (a ``\\r`` before it is dropped), as ``wc -l``
    counts them; text that is not UTF-8 raises ``ValueError`` naming the input."""
    try:
        if path == "-":
            stdin = sys.stdin
            text = stdin.buffer.read().decode("utf-8-sig") if hasattr(stdin, "buffer") else stdin.read()
        else:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{source_name(path)} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines[-1] == "":  # the newline that ends the last line, or no text at all
        lines.pop()
    return lines if keep_blank else [line for line in lines if line.strip()]


def numbered(lines: list[str], source: str, *, skip_blank: bool) -> Lines:
    """``lines`` (of the input ``source``) with their numbers. ``ValueError`` if there are
    none, or if some are blank and ``skip_blank`` is not set (naming them); with it, blank
    lines are left out and listed in ``skipped``."""
    if not lines:
        raise ValueError(f"no input: {source} is empty; give one text a line")
    blank = [number for number, line in enumerate(lines, start=1) if not line.strip()]
    if blank and not skip_blank:
        are = "is" if len(blank) == 1 else "are"
        raise ValueError(
            f"{some_lines(blank)} of {source} {are} blank, and each line must become one vector: "
            "pass --skip-blank to leave blank lines out (stderr then names them)"
        )
    if len(blank) == len(lines):
        raise ValueError(f"no input: every line of {source} is blank")
    kept = [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    return Lines([line for _, line in kept], [number for number, _ in kept], blank)


def is_pair(text: str, is_tokenized: bool) -> bool:
    """Whether the line ``text`` is written as a sentence pair: it holds ``|||`` (with
    ``is_tokenized``, a ``|||`` token)."""
    return PAIR_SEPARATOR in (text.split() if is_tokenized else text)


def pair_sides(text: str, is_tokenized: bool) -> list[list[str]]:
    """The words of each side of the sentence pair ``text``."""
    if is_tokenized:
        tokens = text.split()
        cut = tokens.index(PAIR_SEPARATOR)
        return [tokens[:cut], tokens[cut + 1 :]]
    return [side.split() for side in text.split(PAIR_SEPARATOR, 1)]


def empty_sided_pair(lines: Lines, is_tokenized: bool) -> str | None:
    """What is wrong with the first line that would be a sentence pair with an empty side."""
    for number, text in zip(lines.numbers, lines.texts, strict=True):
        if is_pair(text, is_tokenized) and not all(pair_sides(text, is_tokenized)):
            return f"line {number} is a sentence pair with an empty side: {text!r}"
    return None


def pair_lines(lines: Lines, is_tokenized: bool) -> list[int]:
    """The numbers of the lines written as sentence pairs (:func:`is_pair`)."""
    return [number for number, text in zip(lines.numbers, lines.texts, strict=True) if is_pair(text, is_tokenized)]


def unpaired_warning(lines: Lines, source: str, is_tokenized: bool) -> str | None:
    """The warning for lines written as sentence pairs that, without ``--pairs``, are each
    encoded as one sentence; ``None`` if there are none."""
    held = pair_lines(lines, is_tokenized)
    if not held:
        return None
    holds = "holds" if len(held) == 1 else "hold"
    return (
        f"{some_lines(held)} of {source} {holds} '|||', encoded as one sentence a line: "
        "pass --pairs to encode such lines as sentence pairs"
    )


def skipped_note(lines: Lines, source: str, written: str) -> str | None:
    """What to say of the blank lines left out, for the file ``written``; ``None`` if none were."""
    if not lines.skipped:
        return None
    if written.endswith(".npz"):
        rows = f"the lines array of {written} holds each row's line number"
    else:
        rows = f"the rows of {written} follow the other lines in order (NAME.npz would keep their line numbers)"
    return f"skipped blank {all_lines(lines.skipped)} of {source}: {rows}"


def long_pairs(lines: Lines, max_seq_len: int, is_tokenized: bool) -> list[int]:
    """The numbers of the sentence pairs with more words than fit ``max_seq_len`` tokens with
    their [CLS] and two [SEP]: each word is one token at least, so these will be cut."""
    return [
        number
        for number, text in zip(lines.numbers, lines.texts, strict=True)
        if is_pair(text, is_tokenized) and sum(map(len, pair_sides(text, is_tokenized))) + 3 > max_seq_len
    ]


def some_lines(numbers: Sequence[int], most: int = 5) -> str:
    """``line 3``, ``lines 3 and 7``, or ``lines 3, 7, 9, 12, 15 and 4 more``."""
    if len(numbers) == 1:
        return f"line {numbers[0]}"
    shown = [str(number) for number in numbers[:most]]
    if len(numbers) > most:
        return f"lines {', '.join(shown)} and {len(numbers) - most} more"
    return f"lines {', '.join(shown[:-1])} and {shown[-1]}"


def all_lines(numbers: Sequence[int]) -> str:
    """Every one of ``numbers`` (ascending), runs written as ranges: ``lines 2, 5-9 and 14``."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    spans = [str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    if len(spans) == 1:
        return f"line {spans[0]}" if len(runs[0]) == 1 else f"lines {spans[0]}"
    return f"lines {', '.join(spans[:-1])} and {spans[-1]}"


def save(path: str, vectors: np.ndarray, numbers: list[int]) -> str:
    """Write ``vectors`` to ``path``, and the file name written: ``*.npz`` holds ``vectors``
    and ``lines`` (each row's line number, from 1); any other name is a ``.npy`` file of the
    vectors alone (``.npy`` added if the name lacks it, as numpy does)."""
    if path.endswith(".npz"):
        np.savez(path, vectors=vectors, lines=np.asarray(numbers, dtype=np.int64))
        return path
    np.save(path, vectors)
    return path if path.endswith(".npy") else f"{path}.npy"
