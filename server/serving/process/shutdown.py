"""The head's staged shutdown, which :class:`.supervisor.BertServer` runs when it stops
serving (a signal, ``TERMINATE``, a process that kept failing) or could not start:

1. stop accepting: the HTTP front end is told to stop (SIGTERM: uvicorn lets its requests
   finish), the ventilator reads no new request, and the log says how many are in flight;
2. drain: they get :data:`.lifecycle.DRAIN_SECONDS` to finish;
3. what is left fails, with an error reply to each client;
4. the workers stop, then the sink (which publishes those replies), and they are joined.

A second Ctrl-C (``force_exit``) cuts this short at any stage: what is in flight fails at
once, the workers are killed rather than waited for (a model run can take seconds), and the
sink and the front end get :data:`.lifecycle.FORCED_STOP_SECONDS` to send the failures. A
start that failed stops the same quick way, without a drain or a word of its own (the error
says why): its workers were still loading the model.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING

from .children import Children, worker_name
from .lifecycle import DRAIN_SECONDS, FORCED_STOP_SECONDS, JOIN_SECONDS, ExitFlags

if TYPE_CHECKING:
    from ..head.ventilator import Ventilator

logger = logging.getLogger("bertserve.server")

SHUTTING_DOWN = "the server is shutting down"
STOPPED_NOW = "the server is shutting down: it was told to stop at once (Ctrl-C twice) before this request finished"


def shut_down(ventilator: Ventilator | None, children: Children, flags: ExitFlags, *, serving: bool) -> None:
    """Stop the head's children in stages (see the module docstring). ``serving``: the server
    got ready (else the start failed, and this says nothing of it)."""
    http = children.get("http")
    if http is not None and http.is_alive():
        http.terminate()  # uvicorn stops accepting and lets in-flight requests finish
    if ventilator is not None:
        ventilator.stop_accepting()
        if serving:
            logger.info("%s", stopping_message(ventilator.in_flight, flags.stop_signal))
            _drain(ventilator, flags)
        ventilator.fail_everything(STOPPED_NOW if flags.force_exit else SHUTTING_DOWN)
    quick = flags.force_exit or not serving
    workers = [worker_name(index) for index in children.workers()]
    if ventilator is not None:
        ventilator.stop_workers()  # and remote hosts are told the head is going
    if quick:
        for name in workers:  # a run in progress is lost, and nothing waits for it
            children.kill(name)
    if ventilator is not None:
        ventilator.stop_sink(FORCED_STOP_SECONDS / 2 if quick else 5.0)
    seconds = FORCED_STOP_SECONDS if quick else JOIN_SECONDS
    children.join([*workers, "http", "sink"], seconds=seconds, hurry=lambda: quick or flags.force_exit)
    if serving:
        logger.info("bertserve stopped")


def stopping_message(in_flight: int, signum: int | None) -> str:
    """What the log says as shutdown begins: how many requests it waits for, and, after a
    Ctrl-C, how not to wait."""
    if not in_flight:
        return "stopping: no requests in flight"
    if signum == signal.SIGINT:
        return f"stopping: {_requests(in_flight)} in flight; Ctrl-C again to stop now"
    return f"stopping: {_requests(in_flight)} in flight; they get {DRAIN_SECONDS:.0f} s to finish"


def _drain(ventilator: Ventilator, flags: ExitFlags) -> None:
    """Serve what is in flight until it is done, the drain's time is up, or the user asks to
    stop now; say which of the last two left requests unfinished."""
    deadline = time.monotonic() + DRAIN_SECONDS
    while not ventilator.idle and not flags.force_exit:
        if time.monotonic() >= deadline:
            if ventilator.in_flight:
                count = ventilator.in_flight
                logger.warning(
                    "%s did not finish in %.0f s; failing %s",
                    _requests(count),
                    DRAIN_SECONDS,
                    "it" if count == 1 else "them",
                )
            return
        ventilator.poll_once(50)
    if flags.force_exit and ventilator.in_flight:
        logger.warning("stopping now: failing %s in flight", _requests(ventilator.in_flight))


def _requests(count: int) -> str:
    return f"{count} request" if count == 1 else f"{count} requests"
