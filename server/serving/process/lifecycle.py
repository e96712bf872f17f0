"""What the two supervising processes share: the head's :class:`.supervisor.BertServer` and
a worker machine's :class:`..remote.host.WorkerHost`.

Signal handlers only set flags (``should_exit``; a second Ctrl-C sets ``force_exit``), and note
when the stop began, which the main loop polls. The whole stop then fits the stop budget
(``--stop-timeout``, :mod:`...config.stopping`), counted from that moment; after a second
Ctrl-C the children get :data:`FORCED_STOP_SECONDS`. Their restarts follow :mod:`.restarts`.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

FORCED_STOP_SECONDS = 1.0  # what is left gets this long once the user asked to stop now (a second Ctrl-C)


class ExitFlags:
    """``should_exit`` and ``force_exit``, set by SIGINT and SIGTERM once installed."""

    def __init__(self) -> None:
        self.should_exit = threading.Event()
        self.force_exit = False
        self.stop_signal: int | None = None  # the first signal that asked to stop
        self.stop_began: float | None = None  # when (time.monotonic()) the first signal came

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle_exit)

    def began_stopping(self) -> float:
        """When the stop began: the first signal, else now (a client's ``TERMINATE``, a failure)."""
        if self.stop_began is None:
            self.stop_began = time.monotonic()
        return self.stop_began

    def _handle_exit(self, signum: int, frame: Any) -> None:
        if self.should_exit.is_set() and signum == signal.SIGINT:
            self.force_exit = True
        if self.stop_signal is None:
            self.stop_signal = signum
        if self.stop_began is None:
            self.stop_began = time.monotonic()
        self.should_exit.set()
