"""SIGTERM and SIGHUP end a run the way SIGINT does: pending work settled, status written.

Slurm, Kubernetes and most schedulers stop a job with SIGTERM and follow with SIGKILL after a
grace period (30 s by default on both); a closed terminal sends SIGHUP. Python's default
action for both kills the process at once: queued checkpoints are lost and run.json stays
``running``. While a session runs, flor handles both signals:

1. the run's status becomes ``terminated`` (``error``: the signal's name);
2. the session flushes what is queued within ``FLOR_FLUSH_TIMEOUT`` seconds (a checkpoint
   that cannot finish in time is abandoned whole: its manifest, the commit marker, is never
   written) and writes run.json;
3. it hands over: to the handler the script installed before flor started, called like the
   signal itself would have called it (the session stays open, in case that handler lets
   the script go on), or else to the default action, re-raised with ``SIG_DFL`` so the
   process ends as the scheduler expects (exit status 143 for SIGTERM, 129 for SIGHUP).

Handlers are installed only from the main thread (the only one Python allows), and never
over a signal the script ignores (``SIG_IGN``) or that C code handles. A second signal
while the first is being handled hands over at once. A signal that arrives while the
session is already closing (the exit flush, itself bounded) is handed over after it.
A signal that lands while the main thread is inside flor's own code (a lock held, a
snapshot half taken) is sent again a few milliseconds later, once that call has returned.
A script that installs its own handler after flor started replaces flor's: its exit then
runs through ``atexit``, where the session still closes with the same bounded flush.

SIGINT (Ctrl-C) keeps Python's meaning, a KeyboardInterrupt in the main thread, and the
exit's bounded flush; flor only moves where it lands: one that arrives inside flor's own
code is sent again once that call has returned, like the others, so an epoch's bookkeeping
or a checkpoint is never left half done. During the exit flush it is handed over at once
(it stops the wait for the writer).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import traceback
from typing import Any, Callable

__all__ = ["HANDLED", "install"]

#: the signals flor handles besides SIGINT (which Python turns into KeyboardInterrupt)
HANDLED = ("SIGTERM", "SIGHUP")
#: a signal that lands inside flor's code is sent again this much later, at most RETRIES times
RETRY_S, RETRIES = 0.02, 250
#: flor's engine and everything it calls while the training thread is inside a flor call;
#: the command line and launcher (which may run a script in-process) are not "inside"
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_OUTSIDE = tuple(_PACKAGE + part for part in ("__main__.py", "cli" + os.sep, "launch" + os.sep))


def install(session: Any) -> None:
    """Handle SIGTERM and SIGHUP for ``session`` (see the module docstring); best effort.

    ``session`` provides ``exit_error``, ``_closed``, ``close()`` and ``settle()`` (make
    pending work durable without ending the session).
    """
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal works only there; the atexit flush still bounds the exit
    handlers = []
    for name in HANDLED:
        sig = getattr(signal, name, None)
        if sig is None:  # Windows has no SIGHUP
            continue
        try:
            previous = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if previous is None or previous == signal.SIG_IGN:
            continue  # installed from C, or ignored on purpose: not ours to change
        handler = _Handler(session, sig, previous)
        try:
            signal.signal(sig, handler)
        except (OSError, ValueError):
            continue
        handlers.append(handler)
    interrupt = getattr(signal, "SIGINT", None)
    try:
        previous = signal.getsignal(interrupt) if interrupt is not None else None
    except (OSError, ValueError):
        previous = None
    if interrupt is not None and callable(previous):  # Python's KeyboardInterrupt, or the script's own handler
        try:
            signal.signal(interrupt, _Interrupt(session, interrupt, previous))
        except (OSError, ValueError):
            pass
    if handlers:
        # registered before the session's own close, so it runs after it (atexit is LIFO):
        # a signal that came during the exit flush is handed over once the flush is done
        def after_close() -> None:
            for h in handlers:
                h.after_close()

        atexit.register(after_close)


class _Handler:
    def __init__(self, session: Any, sig: int, previous: Any) -> None:
        self.session = session
        self.sig = sig
        self.previous = previous  # SIG_DFL or the script's callable
        self.busy = False
        self.deferred: Any = None  # the frame of a signal that came while the session closed
        self.close_over = False  # the atexit hook after the session's close has run
        self.retries = 0
        self.pid = os.getpid()  # a forked child's signals are its own: handed over at once

    def __call__(self, signum: int, frame: Any) -> None:
        s = self.session
        if os.getpid() != self.pid:
            self.hand_over(signum, frame)
            return
        if self.busy:  # a second signal while the first is handled: the user insists
            self.hand_over(signum, frame)
            return
        if getattr(s, "_closed", False):  # closing (bounded) or closed: hand over after the close
            s.exit_error = s.exit_error or "terminated"
            self.deferred = frame
            if self.close_over:
                self.after_close()
            return
        if _later(self, signum, frame):
            return
        self.busy = True
        try:
            s.exit_error = "terminated"
            s.terminated_by = signal.Signals(signum).name
            if callable(self.previous):
                s.settle()  # the script's handler may let it go on: keep the session open
            else:
                s.close()
        except Exception:  # noqa: BLE001 - whatever failed, the signal must still take effect
            traceback.print_exc()
        finally:
            self.busy = False
        self.hand_over(signum, frame)

    def after_close(self) -> None:
        self.close_over = True
        if self.deferred is not None:
            frame, self.deferred = self.deferred, None
            self.hand_over(self.sig, frame)

    def hand_over(self, signum: int, frame: Any) -> None:
        if callable(self.previous):
            self.previous(signum, frame)
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # the default action: the process ends, killed by the signal
        os._exit(128 + signum)  # pragma: no cover - only if the signal is blocked in this thread


class _Interrupt:
    """SIGINT: the script's handler (Python's raises KeyboardInterrupt), but never inside
    flor's code while the session is open: there it is sent again once the call returned."""

    def __init__(self, session: Any, sig: int, previous: Callable) -> None:
        self.session = session
        self.sig = sig
        self.previous = previous
        self.retries = 0
        self.pid = os.getpid()

    def __call__(self, signum: int, frame: Any) -> None:
        if os.getpid() == self.pid and not getattr(self.session, "_closed", False) and _later(self, signum, frame):
            return
        self.previous(signum, frame)


def _later(handler: Any, signum: int, frame: Any) -> bool:
    """Whether the signal landed inside flor's code, and was sent again for a few ms later:
    flor's state is mid-update there (and its locks may be held by this very thread), so the
    call returns first. At most RETRIES times in a row; ``handler.retries`` counts them."""
    if handler.retries < RETRIES and _inside_flor(frame):
        handler.retries += 1
        timer = threading.Timer(RETRY_S, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return True
    handler.retries = 0
    return False


def _inside_flor(frame: Any) -> bool:
    """Whether the interrupted frame, or a caller of it, is flor's own code."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_PACKAGE) and not name.startswith(_OUTSIDE):
            return True
        frame = frame.f_back
    return False
