"""What the two supervising processes share: the head's :class:`.supervisor.BertServer` and
a worker machine's :class:`..remote.host.WorkerHost`.

Signal handlers only set flags (``should_exit``; a second Ctrl-C sets ``force_exit``), which
the main loop polls. Shutdown gives what is in flight :data:`DRAIN_SECONDS` to finish, and the
children :data:`JOIN_SECONDS` to exit before they are killed; after a second Ctrl-C they get
:data:`FORCED_STOP_SECONDS`. Their restarts follow :mod:`.restarts`.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

DRAIN_SECONDS = 10.0  # what is in flight gets this long to finish at shutdown
JOIN_SECONDS = 10.0  # children get this long to exit before they are killed
FORCED_STOP_SECONDS = 1.0  # ... and this long once the user asked to stop now (a second Ctrl-C)


class ExitFlags:
    """``should_exit`` and ``force_exit``, set by SIGINT and SIGTERM once installed."""

    def __init__(self) -> None:
        self.should_exit = threading.Event()
        self.force_exit = False
        self.stop_signal: int | None = None  # the first signal that asked to stop

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle_exit)

    def _handle_exit(self, signum: int, frame: Any) -> None:
        if self.should_exit.is_set() and signum == signal.SIGINT:
            self.force_exit = True
        if self.stop_signal is None:
            self.stop_signal = signum
        self.should_exit.set()
