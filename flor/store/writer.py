"""A background worker for checkpoint materialization: bounded memory, never blocks training.

The worker runs one job after another on a daemon thread. Three promises (DESIGN.md §4):

- **It always progresses.** The thread runs at normal scheduling, a few nice levels below
  training (``NICE_OFFSET``): the kernel's fair scheduler gives it a smaller share while
  training or other work keeps every core busy, never none. (``SCHED_IDLE``, used before,
  starved it: with other work on every core a recording took 4.8x as long, issue #11.)
- **It never blocks the training thread.** ``try_submit`` refuses a job, instead of waiting,
  while the bytes already queued plus the new ones exceed the memory budget; the recorder
  then skips that checkpoint and says why in run.json.
- **It gives the GIL back often.** Its Python work (packing, the manifest, a template's text)
  holds the GIL a training thread needs between its torch calls; every ``TURN_S`` of it the
  writer sleeps a moment (``give_turn``), so a waiting training thread takes the GIL then, not
  at the interpreter's 5 ms switch interval. On the digits CNN, what training waited per
  checkpoint went from 0.61 to 0.37-0.45 ms (median of 8 runs; the first checkpoint's from
  1.4-1.9 to 1.0-1.3 ms).
- **The exit waits a bounded time.** ``close(timeout)`` waits at most ``timeout`` seconds,
  then abandons what is left whole: queued jobs never start, and a running job is told by
  ``may_commit()`` not to write its commit marker (the manifest), so no manifest ever names a
  blob that was not written.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import warnings
from typing import Any, Callable, Hashable

__all__ = ["BackgroundWriter", "NICE_OFFSET", "default_budget", "give_turn"]

#: nice levels the writer thread runs below the training thread (a share, never starvation)
NICE_OFFSET = 5
#: the writer's work between two of the turns it gives a waiting training thread (``give_turn``)
TURN_S = 0.1e-3
#: the writer's sleep at a turn (asked for: the kernel's timer slack adds ~50 us)
PAUSE_S = 20e-6

_pace = threading.local()  # .due: on the writer thread, when its next turn is due


def give_turn() -> None:
    """On the writer thread, where ``TURN_S`` passed since its last turn: sleep ``PAUSE_S``, so
    a thread waiting for the GIL (training) takes it now. Called between the steps of a job and
    in its loops; elsewhere (the training thread) nothing.

    >>> give_turn()  # not the writer: returns at once
    """
    due = getattr(_pace, "due", None)
    if due is None or time.perf_counter() < due:
        return
    time.sleep(PAUSE_S)
    _pace.due = time.perf_counter() + TURN_S


def default_budget() -> int:
    """Bytes of queued snapshots allowed: min(1 GiB, 10% of physical memory)."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 1 << 30
    return max(1 << 20, min(1 << 30, ram // 10)) if ram > 0 else 1 << 30


def _lower_priority() -> None:
    """Raise this thread's nice value by NICE_OFFSET (Linux: per thread); best effort."""
    if not sys.platform.startswith("linux"):
        return  # elsewhere setpriority's id is a process, not a thread: leave the process alone
    try:
        tid = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + NICE_OFFSET))
    except (AttributeError, OSError):
        pass


class BackgroundWriter:
    """Run jobs in order on one daemon thread, within a memory budget.

    >>> w = BackgroundWriter(budget=100)
    >>> out = []
    >>> w.try_submit(lambda: out.append(1), 10, print, label=("train", 0))
    True
    >>> w.close(timeout=10), out
    ([], [1])
    """

    def __init__(self, budget: int | None = None) -> None:
        self.budget = default_budget() if budget is None else budget
        self._cond = threading.Condition()  # an RLock: a signal handler on the submitting thread may flush
        self._jobs: collections.deque = collections.deque()
        self._pending = 0  # bytes of queued and running jobs
        self._unfinished = 0
        self._running: Any = None  # label of the running job
        self._committing = False  # the running job passed may_commit()
        self._abandoned = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="flor-writer", daemon=True)
        self._thread.start()

    # -- the training thread's side ----------------------------------------------------

    def has_room(self, nbytes: int) -> bool:
        """Whether a job of ``nbytes`` would be accepted now (nothing queued: always)."""
        with self._cond:
            return not self._abandoned and (self._pending == 0 or self._pending + nbytes <= self.budget)

    def try_submit(self, job: Callable[[], object], nbytes: int, on_error: Callable[[BaseException], object],
                   *, label: Hashable = None) -> bool:
        """Queue ``job`` unless the budget is full; never waits. False: refused (not queued).

        A job that raises does not stop the worker: ``on_error`` is called with the exception.
        What either returns is ignored.
        """
        with self._cond:
            if self._abandoned or self._closed:
                return False
            if nbytes and self._pending > 0 and self._pending + nbytes > self.budget:
                return False
            self._pending += nbytes
            self._unfinished += 1
            self._jobs.append((job, nbytes, on_error, label))
            self._cond.notify_all()
        return True

    def submit(self, job: Callable[[], object], nbytes: int, on_error: Callable[[BaseException], object],
               *, label: Hashable = None) -> None:
        """Queue a small job (logs, events, housekeeping) whatever the budget; never waits.

        Only ignored once the writer is closed or abandoned. Snapshots go through ``try_submit``.
        """
        with self._cond:
            if self._abandoned or self._closed:
                return
            self._pending += nbytes
            self._unfinished += 1
            self._jobs.append((job, nbytes, on_error, label))
            self._cond.notify_all()

    def may_commit(self) -> bool:
        """Called by a job right before it writes its commit marker: False once abandoned.

        After it returned True the job's label is no longer reported as abandoned.
        """
        with self._cond:
            if self._abandoned:
                return False
            self._committing = True
            return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted job has run, at most ``timeout`` seconds; True if all did."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._cond:
            while self._unfinished and self._thread.is_alive():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left if left is None else min(left, 1.0))
            return self._unfinished == 0

    def abandon(self) -> list:
        """Drop every job that has not committed; return their labels (oldest first).

        Queued jobs never start; the running one finds ``may_commit()`` False.
        """
        with self._cond:
            self._abandoned = True
            labels = [] if self._running is None or self._committing else [self._running]
            labels += [item[3] for item in self._jobs]
            self._unfinished -= len(self._jobs)
            self._pending -= sum(item[1] for item in self._jobs)
            self._jobs.clear()
            self._cond.notify_all()
        return [x for x in labels if x is not None]

    def close(self, timeout: float | None = None) -> list:
        """Flush within ``timeout`` seconds, abandon the rest and stop the worker; return the
        labels of the abandoned jobs. Safe to call twice (the second returns [])."""
        if self._closed:
            return []
        done = self.flush(timeout)
        left = [] if done else self.abandon()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if done:
            self._thread.join(timeout=5)
        return left

    @property
    def pending_bytes(self) -> int:
        with self._cond:
            return self._pending

    # -- the worker thread -------------------------------------------------------------

    def _run(self) -> None:
        _lower_priority()
        _pace.due = 0.0  # this thread gives turns (``give_turn``)
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return  # closed and drained (or abandoned)
                job, nbytes, on_error, label = self._jobs.popleft()
                self._running, self._committing = label, False
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - a failed write must never reach the training thread
                try:
                    on_error(exc)
                except Exception as inner:  # noqa: BLE001 - keep the worker alive whatever happens
                    warnings.warn(f"flor: FL414 background error handler failed: {inner}", stacklevel=1)
            finally:
                with self._cond:
                    self._running, self._committing = None, False
                    self._pending -= nbytes
                    self._unfinished -= 1
                    self._cond.notify_all()
