"""What the scheduler queues and hands out: a :class:`Piece` is rows of one request that
travel together; a :class:`Job` is the pieces one worker runs at once. And the two ways a
request is refused at admission: :class:`Busy` and :class:`TooLarge`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


class Busy(Exception):
    """The queues are full: the request was not queued; the client may retry later."""


class TooLarge(Exception):
    """The request is larger than a client may ever queue."""


@dataclass
class Piece:
    """Rows of one request that travel together in a job."""

    key: str
    client: bytes
    rows: np.ndarray  # row indexes in the request
    texts: list[Any]
    is_tokenized: bool
    show_tokens: bool
    arrived: float
    chunk: bool = False  # long inputs are encoded in windows, not truncated
    version: int | None = None  # the model version it runs on, pinned at admission
    deadline: float = float("inf")  # past it the request is answered as expired: its work is not run
    truncation: str = "right"  # the side an over-long input is cut on
    trace: str | None = None  # the traceparent of the head's span of its request, when traced
    adapter: int = 0  # the LoRA task adapter its prompt chose (its place + 1; 0: none)
    task: str = "embed"  # what it asks of the model: a late-interaction model answers several in one job
    reads: str = ""  # how a late-interaction model reads its texts: as documents, "query" or "pairs"

    @property
    def kind(self) -> tuple[bool, bool, int | None, str, int, str]:
        """Pieces of one kind may share a job: the worker reads the input kind, chunking,
        truncation side, adapter and reading from the job, and only a worker of the version
        runs it. Pieces of different tasks read alike share one: one run answers each."""
        return self.is_tokenized, self.chunk, self.version, self.truncation, self.adapter, self.reads


@dataclass
class Job:
    """A mini-job: pieces of one or more requests that one worker runs at once."""

    job_id: str
    pieces: list[Piece]
    bulk: bool
    failures: int = 0  # times a worker died or hung while holding it

    @property
    def size(self) -> int:
        return sum(len(piece.rows) for piece in self.pieces)

    @property
    def keys(self) -> list[str]:
        return [piece.key for piece in self.pieces]

    @property
    def texts(self) -> list[Any]:
        return [text for piece in self.pieces for text in piece.texts]

    @property
    def version(self) -> int | None:
        return self.pieces[0].version

    @property
    def deadline(self) -> float:
        """When the last of its requests expires: past it, nothing of the job is worth running."""
        return max(piece.deadline for piece in self.pieces)

    def drop_expired(self, now: float) -> int:
        """Leave out the pieces of requests past their deadline; how many rows they held."""
        live = [piece for piece in self.pieces if piece.deadline > now]
        dropped = self.size - sum(len(piece.rows) for piece in live)
        self.pieces = live
        return dropped

    def parts(self) -> list[dict[str, Any]]:
        """Whose rows the job carries, in the order of its rows, with each traced request's
        traceparent (the parent of the worker's spans of it)."""
        return [
            {
                "key": piece.key,
                "rows": piece.rows.tolist(),
                **({"trace": piece.trace} if piece.trace else {}),
                **({"task": piece.task} if piece.task != "embed" else {}),
            }
            for piece in self.pieces
        ]

    def header(self, now: float) -> dict[str, Any]:
        """The job's header for its worker; ``expires_in_s`` counts from ``now``, as the
        worker's clock may not be this one's (a remote worker's)."""
        first = self.pieces[0]
        header: dict[str, Any] = {
            "parts": self.parts(),
            "is_tokenized": first.is_tokenized,
            "show_tokens": any(piece.show_tokens for piece in self.pieces),
            "bulk": self.bulk,
            **({"chunk": True} if first.chunk else {}),
            **({"truncation_direction": first.truncation} if first.truncation != "right" else {}),
            **({"adapter": first.adapter} if first.adapter else {}),
            **({"reads": first.reads} if first.reads else {}),
        }
        if self.deadline != float("inf"):
            header["expires_in_s"] = round(self.deadline - now, 4)
        return header


def cut_by_length(lengths: np.ndarray, max_rows: int, max_tokens: int) -> list[np.ndarray]:
    """Row indexes sorted by ``lengths`` (tokens per row), cut into chunks of at most
    ``max_rows`` rows and ``max_tokens`` padded tokens (rows times the longest), so each pads little."""
    order = np.argsort(lengths, kind="stable")
    sorted_lengths = lengths[order]
    chunks, start = [], 0
    for end in range(1, len(order) + 1):
        rows = end - start
        if rows > max_rows or (rows > 1 and rows * int(sorted_lengths[end - 1]) > max_tokens):
            chunks.append(order[start : end - 1])
            start = end - 1
    chunks.append(order[start:])
    return chunks
