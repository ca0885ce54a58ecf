"""A background worker for checkpoint materialization, with a memory budget and back-pressure."""

from __future__ import annotations

import os
import queue
import threading
import warnings
from typing import Callable

__all__ = ["BackgroundWriter"]


class BackgroundWriter:
    """Run jobs in order on one daemon thread.

    ``submit`` blocks only while the bytes of queued jobs exceed ``budget``. A job that
    raises does not stop the worker: its ``on_error`` is called and a warning printed.
    """

    def __init__(self, budget: int = 1 << 30) -> None:
        self.budget = budget
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="flor-writer", daemon=True)
        self._thread.start()
        self._closed = False

    def submit(self, job: Callable[[], None], nbytes: int, on_error: Callable[[BaseException], None]) -> None:
        with self._cond:
            while self._pending > 0 and self._pending + nbytes > self.budget:
                self._cond.wait()
            self._pending += nbytes
        self._queue.put((job, nbytes, on_error))

    def _run(self) -> None:
        # Hashing and writing yield to training: with every core busy training (a CPU-only
        # machine), this thread runs only when a core would otherwise be idle.
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread, on Linux
        except (AttributeError, OSError):
            pass
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            job, nbytes, on_error = item
            try:
                job()
            except BaseException as exc:  # a failed write must never reach the training thread
                try:
                    on_error(exc)
                except Exception as inner:  # noqa: BLE001 - keep the worker alive whatever happens
                    warnings.warn(f"flor: background error handler failed: {inner}", stacklevel=1)
            finally:
                with self._cond:
                    self._pending -= nbytes
                    self._cond.notify_all()
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every submitted job has run."""
        if self._thread.is_alive():
            self._queue.join()

    def close(self) -> None:
        """Flush and stop the worker; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.flush()
        self._queue.put(None)
        self._thread.join(timeout=60)
