"""The head's staged shutdown, which :class:`.supervisor.BertServer` runs when it stops
serving (a signal, ``TERMINATE``, a process that kept failing) or could not start. It fits the
stop budget (``--stop-timeout``), counted from the signal, whose deadlines
(:class:`...config.stopping.StopPlan`) end each stage:

1. stop accepting: a new request gets a ``shutdown`` error at once (HTTP: a 503 with
   ``Connection: close``, as the HTTP process relays the head's answer), ``/ready`` says 503,
   and the log says how many requests are in flight;
2. drain: they get until the drain's deadline to finish;
3. what is left fails, with an error reply to each client, and the workers are told to stop;
   the sink publishes those replies and exits, then the HTTP front end is told to stop (it
   sends what it holds, each response with ``Connection: close``);
4. a worker still in a model run at its share of the budget is killed, since nobody waits for
   its answer; the rest of the children are joined until the budget's end, then killed.

A second Ctrl-C (``force_exit``) cuts this short at any stage: what is in flight fails at
once, the workers are killed rather than waited for, and the sink and the front end get
:data:`.lifecycle.FORCED_STOP_SECONDS` to send the failures. A start that failed stops the
same quick way, without a drain or a word of its own (the error says why): its workers were
still loading the model.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING

from .children import FRONT_ENDS, Children, worker_name
from .lifecycle import FORCED_STOP_SECONDS, ExitFlags

if TYPE_CHECKING:
    from ...config.stopping import StopBudget, StopPlan
    from ..head.ventilator import Ventilator

logger = logging.getLogger("bertserve.server")

SHUTTING_DOWN = "the server is shutting down"
STOPPED_NOW = "the server is shutting down: it was told to stop at once (Ctrl-C twice) before this request finished"


def shut_down(
    ventilator: Ventilator | None, children: Children, flags: ExitFlags, budget: StopBudget, *, serving: bool
) -> None:
    """Stop the head's children in stages within ``budget`` (see the module docstring).
    ``serving``: the server got ready (else the start failed, and this says nothing of it)."""
    plan = budget.plan(flags.began_stopping())
    if ventilator is not None:
        ventilator.stop_accepting()
        if serving:
            logger.info("%s", stopping_message(ventilator.in_flight, flags.stop_signal, plan))
            _drain(ventilator, flags, plan)
        ventilator.fail_everything(STOPPED_NOW if flags.force_exit else SHUTTING_DOWN)
        if serving:
            ventilator.poll_once(0)  # a request that came meanwhile is refused now, not left to its timeout
    quick = flags.force_exit or not serving
    workers = [worker_name(index) for index in children.workers()]
    if ventilator is not None:
        ventilator.stop_workers()  # and remote hosts are told the head is going
    if quick:
        for name in workers:  # a run in progress is lost, and nothing waits for it
            children.kill(name)
    if ventilator is not None:
        ventilator.stop_sink(FORCED_STOP_SECONDS / 2 if quick else plan.left(plan.sink_until, time.monotonic()))
    children.stop_front_ends()  # each answers what it holds (the sink sent the failures), then exits
    if not quick:
        share = plan.left(plan.workers_until, time.monotonic())
        children.join(workers, seconds=share, hurry=lambda: flags.force_exit, warn=False)
    seconds = FORCED_STOP_SECONDS if quick else plan.left(plan.end, time.monotonic())
    children.join([*workers, *FRONT_ENDS, "sink"], seconds=seconds, hurry=lambda: quick or flags.force_exit)
    if serving:
        logger.info("bertserve stopped in %.1f s", time.monotonic() - plan.began)


def stopping_message(in_flight: int, signum: int | None, plan: StopPlan) -> str:
    """What the log says as shutdown begins: how many requests it waits for, how long, and,
    after a Ctrl-C, how not to wait."""
    if not in_flight:
        return "stopping: no requests in flight"
    drain = max(0.0, plan.drain_until - plan.began)
    said = f"stopping: {_requests(in_flight)} in flight; they get {drain:.1f} s to finish"
    return f"{said}; Ctrl-C again to stop now" if signum == signal.SIGINT else said


def _drain(ventilator: Ventilator, flags: ExitFlags, plan: StopPlan) -> None:
    """Serve what is in flight (refusing what is new) until it is done, the drain's time is
    up, or the user asks to stop now; say which of the last two left requests unfinished."""
    while not ventilator.idle and not flags.force_exit:
        if time.monotonic() >= plan.drain_until:
            if ventilator.in_flight:
                count = ventilator.in_flight
                logger.warning(
                    "%s did not finish in %.1f s; failing %s",
                    _requests(count),
                    plan.drain_until - plan.began,
                    "it" if count == 1 else "them",
                )
            return
        ventilator.poll_once(int(min(50.0, plan.left(plan.drain_until, time.monotonic()) * 1000)) + 1)
    if flags.force_exit and ventilator.in_flight:
        logger.warning("stopping now: failing %s in flight", _requests(ventilator.in_flight))


def _requests(count: int) -> str:
    return f"{count} request" if count == 1 else f"{count} requests"
