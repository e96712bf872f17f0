"""The child processes of a supervising process: the head's sink, HTTP front end and workers
(:mod:`.supervisor`), or a worker machine's workers (:mod:`..remote.host`).

:class:`Children` owns the process objects, by name (``sink``, ``http``, ``grpc``, ``worker 0``...): it
starts each child in a fresh interpreter (spawn), tells which died and which are due to start
again, and at the end joins them, killing what does not exit in time.

Only the supervising process decides when its children stop, in stages (a drain, error
replies through the sink, then each child told to stop), and a signal to the whole process
group must not cut that short: Ctrl-C at a terminal sends SIGINT to every process of the
group, and ``timeout`` and systemd's default ``KillMode`` send SIGTERM. A child starts with
SIGINT blocked, and keeps it so. It starts with SIGTERM blocked too, until it has a handler
(:func:`_child_main`) that leaves the stop to its supervisor while that lives, and stops the
child as SIGTERM always did once it is an orphan. The HTTP process keeps that rule under
uvicorn (:mod:`...http.process`): its supervisor stops it with :meth:`Children.stop_front_ends`, as the gRPC process.
When to start a child again, and when to give up, is the :class:`.restarts.RestartPolicy`'s
to say; what a death means (jobs handed on, the requests a sink held failed) is the supervisor's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from multiprocessing import resource_tracker
from multiprocessing.process import BaseProcess
from typing import Any

from ...config.stopping import FRONT_END_STOP_SIGNAL
from .lifecycle import FORCED_STOP_SECONDS
from .restarts import Exit, Fate, RestartPolicy

_WORKER = "worker "
FRONT_ENDS = ("http", "grpc")
"""The front ends' children, by name."""


def worker_name(index: int) -> str:
    return f"{_WORKER}{index}"


def worker_index(name: str) -> int | None:
    """The index of the worker ``name`` (``None``: not a worker)."""
    return int(name[len(_WORKER) :]) if name.startswith(_WORKER) else None


class Children:
    """Child processes by name, supervised with one :class:`.restarts.RestartPolicy`."""

    def __init__(self, max_restarts: int, logger: logging.Logger) -> None:
        self.policy = RestartPolicy(max_restarts)
        self._logger = logger
        self._spawn = multiprocessing.get_context("spawn")
        self._processes: dict[str, BaseProcess] = {}

    def __len__(self) -> int:
        return len(self._processes)

    def __contains__(self, name: str) -> bool:
        return name in self._processes

    def get(self, name: str) -> BaseProcess | None:
        return self._processes.get(name)

    def workers(self) -> dict[int, BaseProcess]:
        """The worker processes, by index."""
        return {index: p for name, p in self._processes.items() if (index := worker_index(name)) is not None}

    def start(self, name: str, target: Callable[..., None], args: tuple[Any, ...], process_name: str) -> BaseProcess:
        """Start (or start again) the child ``name``, running ``target(*args)``."""
        process = self._spawn.Process(
            target=_child_main, args=(os.getpid(), target, args), name=process_name, daemon=True
        )
        with _stop_signals_blocked():
            process.start()
        self._processes[name] = process
        self.policy.started(name, time.monotonic())
        return process

    def due(self, now: float) -> list[str]:
        """The children to start again now: their delay after a failure is over."""
        return [name for name in self._processes if self.policy.due(name, now)]

    def dead(self) -> list[tuple[str, BaseProcess]]:
        """The children that exited and were not handled yet (none waits for its restart)."""
        return [(n, p) for n, p in self._processes.items() if not self.policy.waiting(n) and not p.is_alive()]

    def exited(self, name: str, now: float, *, wanted: Callable[[], bool] | None = None) -> Exit:
        """``name`` was found dead: whether and when it starts again (see
        :meth:`.restarts.RestartPolicy.exited`). One that does not is forgotten."""
        exit = self.policy.exited(name, now, wanted=wanted)
        if exit.fate in (Fate.RETIRED, Fate.LET_GO):
            del self._processes[name]
        return exit

    def retire(self, name: str) -> None:
        """``name`` is told to stop: when it exits it does not start again."""
        self.policy.retire(name)

    def retiring(self, name: str) -> bool:
        return self.policy.retiring(name)

    def alive(self, name: str) -> bool:
        process = self._processes.get(name)
        return process is not None and process.is_alive()

    def kill(self, name: str, pid: int | None = None) -> bool:
        """Kill ``name`` if it runs (and is process ``pid``, if given); whether it was."""
        process = self._processes.get(name)
        if process is None or (pid is not None and process.pid != pid) or not process.is_alive():
            return False
        process.kill()
        return True

    def stop_front_ends(self) -> None:
        """Tell the HTTP and gRPC front ends to stop: each stops accepting, answers what it holds
        (an HTTP response with ``Connection: close``) and exits. SIGUSR1, since each leaves
        SIGTERM to this process while it lives, as every child does."""
        for name in FRONT_ENDS:
            process = self._processes.get(name)
            if process is not None and process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, FRONT_END_STOP_SIGNAL)

    def forgive(self, now: float) -> None:
        self.policy.forgive(now)

    def join(
        self,
        names: list[str] | None = None,
        *,
        seconds: float,
        hurry: Callable[[], bool] | None = None,
        warn: bool = True,
    ) -> None:
        """Give the children (``names``, else all) ``seconds`` together to exit, then kill
        those still running, with a warning (``warn``; else a line of INFO: a stop that kills
        what nobody waits for any more). Once ``hurry()`` is true (the user asked to stop now)
        they get at most :data:`.lifecycle.FORCED_STOP_SECONDS` more, and are killed without a
        word."""
        processes = [self._processes[n] for n in (self._processes if names is None else names) if n in self._processes]
        deadline = time.monotonic() + seconds
        hurried = False
        for process in processes:
            while process.is_alive() and (left := deadline - time.monotonic()) > 0:
                if not hurried and hurry is not None and hurry():
                    hurried = True
                    deadline = min(deadline, time.monotonic() + FORCED_STOP_SECONDS)
                process.join(min(left, 0.05))
        hurried = hurried or (hurry is not None and hurry())
        for process in processes:
            if process.is_alive():
                if not hurried and warn:
                    self._logger.warning("%s did not stop in time; killing it", process.name)
                elif not hurried:
                    self._logger.info("%s was still running at its share of the stop budget; killing it", process.name)
                process.kill()
                process.join(5)

    def clear(self) -> None:
        """Forget every child (they were stopped)."""
        self._processes.clear()
        self.policy.clear()


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread while it starts a child, which inherits the
    mask (through exec too) and so never sees them before :func:`_child_main` says how; a
    signal that comes meanwhile reaches this process once the block ends."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no masks, and no process groups to signal
        yield
        return
    # The first child starts multiprocessing's resource tracker, which unblocks both signals
    # once it has spawned that (it ignores them itself): it must run first.
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _child_main(supervisor: int, target: Callable[..., None], args: tuple[Any, ...]) -> None:
    """A child's first steps, in the child: SIGTERM left to its ``supervisor`` process, then
    unblocked; then ``target(*args)``. SIGINT stays blocked (and the child may ignore it too)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.signal(signal.SIGTERM, functools.partial(_leave_to_supervisor, supervisor))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    target(*args)


def _leave_to_supervisor(supervisor: int, signum: int, frame: Any) -> None:
    """SIGTERM in a child: ignored while its supervisor lives, since that decides when its
    children stop (a signal to the whole group reached it too; one sent to this child alone
    is ignored as well). An orphan stops, as SIGTERM always stopped it."""
    if os.getppid() == supervisor:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.raise_signal(signal.SIGTERM)
