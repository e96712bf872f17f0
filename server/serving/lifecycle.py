"""What the two supervising processes share: the head's :class:`.supervisor.BertServer` and
a worker machine's :class:`.remote.WorkerHost`.

Signal handlers only set flags (``should_exit``; a second Ctrl-C sets ``force_exit``), which
the main loop polls. A child that keeps failing is restarted after a delay that doubles with
each failure in a row; one that stayed up :data:`STABLE_SECONDS` has its failures forgiven.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

DRAIN_SECONDS = 10.0  # what is in flight gets this long to finish at shutdown
JOIN_SECONDS = 10.0  # children get this long to exit before they are killed
STABLE_SECONDS = 60.0  # a process up this long has its failures forgiven
_FIRST_BACKOFF = 0.5  # seconds before the first restart; doubled for each failure in a row
_MAX_BACKOFF = 30.0


def restart_delay(failures: int) -> float:
    """Seconds to wait before restarting a process that failed ``failures`` times in a row."""
    return min(_MAX_BACKOFF, _FIRST_BACKOFF * 2 ** (failures - 1))


class ExitFlags:
    """``should_exit`` and ``force_exit``, set by SIGINT and SIGTERM once installed."""

    def __init__(self) -> None:
        self.should_exit = threading.Event()
        self.force_exit = False

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle_exit)

    def _handle_exit(self, signum: int, frame: Any) -> None:
        if self.should_exit.is_set() and signum == signal.SIGINT:
            self.force_exit = True
        self.should_exit.set()
