"""The default server's two front doors, ZeroMQ and HTTP, each as one call, ``encode(texts)``,
for ``latency.py``'s paced queries and its client sweep (:mod:`lib.paced`, :mod:`lib.client_sweep`).

One server answers both: ``bertserve start`` with its HTTP port, one CPU worker, no ``--dtype``
(the default, auto). Over ZeroMQ a call is ``BertClient.encode``; over HTTP it is a POST to the
OpenAI route ``/v1/embeddings`` on a kept-alive ``httpx.Client``, the vectors asked as base64
(the ``openai`` package's default, and the least JSON to make and read) and decoded into an
array, so that each side's time includes its client's decoding, as ``BertClient``'s does.
"""

from __future__ import annotations

import base64
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer, free_port, start_server

from lib.inputs import BENCHMARKS_DIR

ZMQ, HTTP = "ZeroMQ", "HTTP"
PROTOCOLS = (ZMQ, HTTP)
ROUTE = "/v1/embeddings"
TIMEOUT_S = 120.0

Encode = Callable[[list[str]], Any]


@dataclass(frozen=True)
class Doors:
    """Where the server answers: its ZeroMQ ports and its HTTP base URL (plain values, so a
    client process is told them as JSON)."""

    port: int
    port_out: int
    http_url: str

    @classmethod
    def of(cls, data: dict[str, Any]) -> Doors:
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def server_flags(max_seq_len: int, http_port: int) -> tuple[str, ...]:
    return ("--num-worker", "1", "--cpu", "--max-seq-len", str(max_seq_len), "--http-port", str(http_port))


def start_default_server(model_dir: Path, graph_dir: Path | None, max_seq_len: int) -> tuple[RunningServer, Doors]:
    """The default server (no ``--dtype``) with its HTTP port, and its doors."""
    http_port = free_port()
    extra = ("--graph-dir", str(graph_dir)) if graph_dir is not None else ()
    running = start_server("--model-dir", str(model_dir), *server_flags(max_seq_len, http_port), *extra, echo=False)
    return running, Doors(running.port, running.port_out, f"http://127.0.0.1:{http_port}")


def http_port(doors: Doors) -> int:
    return int(doors.http_url.rsplit(":", 1)[1])


def _over_http(session: httpx.Client, texts: list[str]) -> np.ndarray:
    reply = session.post(ROUTE, json={"input": texts, "encoding_format": "base64"})
    reply.raise_for_status()
    rows = [base64.b64decode(item["embedding"]) for item in reply.json()["data"]]
    return np.frombuffer(b"".join(rows), dtype="<f4").reshape(len(rows), -1)


@contextlib.contextmanager
def connected(protocol: str, doors: Doors) -> Iterator[Encode]:
    """One client of ``protocol`` (its own sockets or connection), as ``encode(texts)``."""
    if protocol == ZMQ:
        with BertClient(port=doors.port, port_out=doors.port_out, timeout=int(TIMEOUT_S * 1000)) as client:
            yield client.encode
    elif protocol == HTTP:
        with httpx.Client(base_url=doors.http_url, timeout=TIMEOUT_S) as session:
            yield lambda texts: _over_http(session, texts)
    else:
        raise ValueError(f"no such protocol: {protocol!r}")


def benchmarks_pythonpath() -> str:
    """``PYTHONPATH`` with ``benchmarks/`` first: a child started as ``python -m lib.NAME``
    imports ``lib`` and ``comparing`` as a command does."""
    return os.pathsep.join(filter(None, [str(BENCHMARKS_DIR), os.environ.get("PYTHONPATH")]))


def module_command(module: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``module`` (``lib.paced``, say) as a child."""
    return [sys.executable, "-m", module], {**os.environ, "PYTHONPATH": benchmarks_pythonpath()}
