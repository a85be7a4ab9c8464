"""Log lines limited per kind: at most one a second of each kind, the next one saying how many
were left out meanwhile (the C runtime's ctl_log_limit, runtime/src/log.c). A burst of one kind
(a client retrying a refused handshake, a loop sending oversize requests) cannot flood the log or
hide another kind. Used by the unit (its refusals) and the clients (size limits)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict

EVERY = 1.0  # seconds between two lines of one kind (the C runtime's CTL_LOG_LIMIT_MS)


class LogLimiter:
    """Lines to `logger`, limited per kind; safe from any thread."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._lock = threading.Lock()
        self._last: Dict[str, float] = {}
        self._skipped: Dict[str, int] = {}

    def log(self, kind: str, level: int, fmt: str, *args: Any) -> None:
        """Log `fmt % args` at `level`, unless a line of `kind` went out in the last EVERY
        seconds (then it is only counted)."""
        if not self._log.isEnabledFor(level):
            return
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -EVERY) < EVERY:
                self._skipped[kind] = self._skipped.get(kind, 0) + 1
                return
            self._last[kind] = now
            skipped = self._skipped.pop(kind, 0)
        if skipped:
            fmt += " (%d more like this since the last such line)"
            args = args + (skipped,)
        self._log.log(level, fmt, *args)
