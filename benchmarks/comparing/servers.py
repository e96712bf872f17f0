"""The suite's servers, built on the one launcher the tests use too
(``bertserve.server.testing.launcher``), so that tests and benchmarks start, watch and stop
servers alike: :class:`ServerOptions` (the flags a benchmark varies), :class:`ServerProcess`
(a server with its RSS and work counters) and :class:`ServerPool` (starts servers together
and stops every one of them).
"""

from __future__ import annotations

import itertools
import math
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bertserve.client import BertClient
from bertserve.server.testing.launcher import ServerStartError, start_server
from lib.report import Progress
from lib.rss import RssSampler

START_TIMEOUT_S = 900.0  # a cold start builds the graph; on a busy machine that takes a while
STOP_TIMEOUT_S = 60.0
RSS_SAMPLE_S = 0.2
CLIENT_TIMEOUT_MS = 900_000  # 64 clients queueing behind 4,096-sentence jobs wait minutes on two busy cores


class BenchmarkError(Exception):
    """A benchmark could not run: a server did not start, clients failed."""


@dataclass(frozen=True)
class ServerOptions:
    """The ``bertserve start`` flags a benchmark varies."""

    model_dir: Path | None
    graph_dir: Path | None
    max_seq_len: str = "128"
    dtype: str = "fp32"
    num_worker: int = 1
    max_batch_size: int = 256
    pooling_layer: int = -1
    merge_requests: bool = True

    def flags(self) -> list[str]:
        flags = [
            "--max-seq-len",
            self.max_seq_len,
            "--dtype",
            self.dtype,
            "--num-worker",
            str(self.num_worker),
            "--max-batch-size",
            str(self.max_batch_size),
            "--pooling-layer",
            str(self.pooling_layer),
            "--merge-requests",
            "true" if self.merge_requests else "false",
        ]
        if self.model_dir is not None:
            flags += ["--model-dir", str(self.model_dir)]
        if self.graph_dir is not None:
            flags += ["--graph-dir", str(self.graph_dir)]
        return flags

    def with_value(self, name: str, value: str) -> ServerOptions:
        """A copy with the field for flag ``name`` (``max-seq-len``) set from the string ``value``."""
        attribute = name.replace("-", "_")
        current = getattr(self, attribute)
        return replace(self, **{attribute: type(current)(value)})

    def describe(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


@dataclass
class WorkCounters:
    """The workers' cumulative counters from ``server_status``; subtract two to get a window's."""

    jobs: int = 0
    busy_seconds: float = 0.0
    tokens: int = 0
    slots: int = 0

    @classmethod
    def from_status(cls, status: dict[str, Any]) -> WorkCounters:
        workers = status.get("workers", [])
        return cls(
            jobs=sum(int(w.get("jobs_done", 0)) for w in workers),
            busy_seconds=sum(float(w.get("busy_s", 0.0)) for w in workers),
            tokens=sum(int(w.get("tokens", 0)) for w in workers),
            slots=sum(int(w.get("token_slots", 0)) for w in workers),
        )

    def __sub__(self, other: WorkCounters) -> WorkCounters:
        return WorkCounters(
            self.jobs - other.jobs,
            self.busy_seconds - other.busy_seconds,
            self.tokens - other.tokens,
            self.slots - other.slots,
        )

    @property
    def padding_fraction(self) -> float:
        """Padded token slots / all token slots the model computed."""
        return 1 - self.tokens / self.slots if self.slots > 0 else math.nan


_LOG_NUMBERS = itertools.count(1)


class ServerProcess:
    """One ``bertserve start`` process (the shared launcher's), its output in a log file, its
    family's RSS sampled every ``RSS_SAMPLE_S`` from launch to stop."""

    def __init__(self, name: str, options: ServerOptions, log_dir: Path) -> None:
        self.name = name
        self.options = options
        self.log_path = log_dir / f"{name.replace(' ', '_')}-{next(_LOG_NUMBERS)}.log"
        self.server = start_server(*options.flags(), expect_ready=False, echo=False, log_path=self.log_path)
        self.port, self.port_out = self.server.port, self.server.port_out
        self.rss = RssSampler(self.server, RSS_SAMPLE_S).start()
        self._control: BertClient | None = None

    @property
    def ready_seconds(self) -> float:
        return self.server.ready_seconds

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> float:
        """Seconds from launch to the ready line; raises BenchmarkError if it never comes."""
        try:
            return self.server.wait_ready(timeout)
        except ServerStartError as exc:
            raise BenchmarkError(f"server {self.name} did not become ready (log {self.log_path}): {exc}") from None

    def client(self, timeout_ms: float = CLIENT_TIMEOUT_MS) -> BertClient:
        return BertClient("127.0.0.1", self.port, self.port_out, timeout=timeout_ms, check_length=False)

    def status(self) -> dict[str, Any]:
        """``server_status``, through one control client kept for the server's life."""
        if self._control is None:
            self._control = self.client(timeout_ms=60_000)
        return self._control.server_status

    def counters(self) -> WorkCounters:
        return WorkCounters.from_status(self.status())

    def terminate(self) -> None:
        """Send SIGTERM (the server's graceful stop); :meth:`wait_stopped` waits for it."""
        if self._control is not None:
            self._control.close()
            self._control = None
        self.server.terminate()

    def wait_stopped(self) -> None:
        """Wait for the server and its children; whatever is left after ``STOP_TIMEOUT_S`` is killed."""
        for problem in self.server.wait_stopped(STOP_TIMEOUT_S):
            print(f"server {self.name}: {problem}; killed", file=sys.stderr)
        self.rss.stop(timeout=None)


class ServerPool:
    """Starts servers into a scratch directory for their logs and stops every one of them."""

    def __init__(self, stack: ExitStack, progress: Progress) -> None:
        self.log_dir = Path(tempfile.mkdtemp(prefix="bertserve-bench-"))
        self.progress = progress
        self.failed = False
        self.refused: dict[str, str] = {}  # optional servers that did not start, and why
        stack.callback(self._clean_up)

    def _clean_up(self) -> None:
        if self.failed:
            print(f"server logs kept in {self.log_dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    @contextmanager
    def running(
        self, *named: tuple[str, ServerOptions], optional: Sequence[tuple[str, ServerOptions]] = ()
    ) -> Iterator[list[ServerProcess]]:
        """Start the servers together, wait until all are ready, stop them all at the end. A
        server of ``optional`` that does not start (a flag this bertserve refuses, say) is left
        out of the list, and why is kept in ``refused``."""
        servers: list[ServerProcess] = []
        ready: list[ServerProcess] = []
        optional_names = {name for name, _ in optional}
        try:
            for name, options in (*named, *optional):
                servers.append(ServerProcess(name, options, self.log_dir))
            for server in servers:
                try:
                    seconds = server.wait_ready()
                except BenchmarkError:
                    if server.name not in optional_names:
                        raise
                    why = _last_error_line(server.server.tail(40))
                    self.refused[server.name] = f"{server.name} left out, it did not start: {why}"
                    self.progress(self.refused[server.name])
                    continue
                ready.append(server)
                self.progress(f"server {server.name} ready in {seconds:.1f} s (port {server.port})")
            yield ready
        except BaseException:
            self.failed = True
            raise
        finally:
            for server in servers:
                server.terminate()
            for server in servers:
                server.wait_stopped()


def _last_error_line(tail: str) -> str:
    """The last line of a server's output that says what went wrong, else its last line."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if "error" in line.lower() or "unknown" in line.lower() or "invalid" in line.lower():
            return line[-300:]
    return lines[-1][-300:] if lines else "no output"
