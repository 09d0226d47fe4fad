"""Ending a long-running command on SIGINT, SIGTERM or SIGHUP without an asynchronous exception.

Python's default SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be.
Landing in a weakref callback or a `__del__`, it is reported as "unraisable" and dropped, and the
program carries on: Dagster's SQLite storage makes a SQLAlchemy engine per query, whose event
registry runs such a callback when the engine is collected, so `rocm-assets watch` sometimes
ignored Ctrl-C for good (1 in 300 with the test suite running beside it). Landing in
SQLAlchemy's transaction cleanup, it became an AssertionError instead.

`StopSignals` records the signal and wakes a waiting thread through a pipe (`set_wakeup_fd`),
so nothing between the signal and the wait can lose it.
"""

import os
import select
import signal
import threading
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """While entered (in the main thread), a stop signal sets `received`; `wait` returns on it."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._read = self._write = -1
        self._saved: dict[int, Any] = {}
        self._saved_fd = -1

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("StopSignals must be entered in the main thread")
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        # Set explicitly: a SIGINT ignored by whoever started us (a background job) stops it too.
        for sig in STOP_SIGNALS:
            self._saved[sig] = signal.signal(sig, self._note)
        self._saved_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        signal.set_wakeup_fd(self._saved_fd)
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        os.close(self._read)
        os.close(self._write)

    def _note(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum

    def wake(self) -> None:
        """Wake `wait` from another thread."""
        try:
            os.write(self._write, b"\0")
        except (BlockingIOError, OSError):
            pass  # a full pipe wakes the waiter anyway; a closed one has no waiter left

    def wait(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s`, or until a signal or `wake`; True once a stop signal came."""
        if self.received is None:
            ready, _, _ = select.select([self._read], [], [], max(0.0, timeout_s))
            if ready:
                try:
                    data = os.read(self._read, 512)
                except BlockingIOError:
                    data = b""
                # The C-level handler writes the signal's number before the Python handler runs:
                # read it here, so a signal another thread received counts at once.
                stop = next((b for b in data if b in STOP_SIGNALS), None)
                if stop is not None and self.received is None:
                    self.received = stop
        return self.received is not None
