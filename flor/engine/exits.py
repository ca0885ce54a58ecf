"""How a recording's process ends when it ends through ``SystemExit``: the status and exit code
that ``run.json`` gets for ``sys.exit(3)``, ``raise SystemExit(1)``, ``exit()`` or ``quit()``.

Python hands an uncaught ``SystemExit`` to no hook: ``sys.excepthook`` never sees it, and by
the time the ``atexit`` hooks run (where the session writes its final status) the exception
and its code are gone. So the code is noted while the exception is on its way, at no cost
per step:

- ``sys.exit``, ``exit`` and ``quit`` are wrapped from ``import flor`` on in a recording
  process (``watch_exits``) until the session closes: the wrapper notes the status it was
  given (in the main thread of the process that recorded) and calls the original, so the
  exception, its code and the process's exit status are Python's own. From the import, not
  the session's start: ``sys.exit(main())`` looks ``sys.exit`` up before ``main()`` records;
- a ``raise SystemExit(n)`` inside the epoch loop closes ``flor.it``'s generator on its way
  out; at that moment (once, and only when the loop is left by an exception) the exception
  object still exists, and is found among the objects the garbage collector tracks.

A noted code counts only if the exception did end the script: at exit, the ``__main__``
module's frame (kept when the session started) tells whether the script ran to its end, in
which case the ``SystemExit`` was caught (``try: parser.parse_args() except SystemExit:``)
and the run finished. A ``raise SystemExit(n)`` outside the loop, or a ``sys.exit`` bound
before the session started (``from sys import exit`` above ``import flor``), passes no place
flor sees: such a run is recorded ``finished``, as before. ``os._exit`` and SIGKILL run no
exit hook at all: such a run stays ``running``, and ``flor ls`` says ``running (process gone)``.

>>> classify(None), classify(0), classify(3), classify("loss is NaN")
(('finished', 0, None), ('finished', 0, None), ('crashed', 3, None), ('crashed', 1, 'loss is NaN'))
"""

from __future__ import annotations

import builtins
import dis
import gc
import os
import sys
import threading
from types import FrameType
from typing import Any, Callable

__all__ = ["ExitWatch", "classify", "watch_exits"]

_UNSEEN = object()
_WATCH: ExitWatch | None = None


def watch_exits(frame: FrameType | None) -> ExitWatch:
    """The process's ``ExitWatch``, made and installed on the first call. ``import flor`` calls
    it when the process records, before the script's own lines after the import run: the
    common ``sys.exit(main())`` looks ``sys.exit`` up *before* ``main()`` starts the
    recording, so wrapping it when the session starts would be too late."""
    global _WATCH
    if _WATCH is None or not _WATCH.wrapped or _WATCH.pid != os.getpid():
        _WATCH = ExitWatch(frame)
        _WATCH.install()
    elif _WATCH.main_frame is None:
        _WATCH.main_frame = _main_frame(frame)
    return _WATCH


def classify(code: Any) -> tuple[str, int, str | None]:
    """``(status, exit code, message)`` of a ``SystemExit`` with ``code``, as the interpreter
    turns it into the process's exit status: None is 0, an int is itself, anything else is
    printed and exits 1."""
    if code is None:
        return "finished", 0, None
    if isinstance(code, int):
        return ("finished" if code == 0 else "crashed"), int(code), None
    return "crashed", 1, " ".join(str(code).split())[:300]


class ExitWatch:
    """Notes the code of a ``SystemExit`` that ends the script (see the module docstring)."""

    def __init__(self, frame: FrameType | None) -> None:
        self.main_frame = _main_frame(frame)
        self.code: Any = _UNSEEN
        self.pid = os.getpid()
        self.wrapped: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original, wrapper)

    def install(self) -> None:
        """Wrap ``sys.exit`` and the ``exit``/``quit`` builtins (absent under ``python -S``)."""
        self._wrap(sys, "exit", lambda original: _Exit(original, self.keep))
        for name in ("exit", "quit"):
            if callable(getattr(builtins, name, None)):
                self._wrap(builtins, name, lambda original: _Exit(original, self.keep))

    def _wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        wrapper = make(original)
        setattr(owner, name, wrapper)
        self.wrapped.append((owner, name, original, wrapper))

    def uninstall(self) -> None:
        """Put the originals back, where nothing replaced the wrappers since; the next
        ``watch_exits`` makes a new watch."""
        for owner, name, original, wrapper in reversed(self.wrapped):
            if getattr(owner, name, None) is wrapper:
                setattr(owner, name, original)
        self.wrapped = []

    def keep(self, code: Any) -> None:
        if os.getpid() == self.pid and threading.current_thread() is threading.main_thread():
            self.code = code  # a SystemExit elsewhere ends a thread or a forked child, not this run

    def loop_left_by_exception(self) -> None:
        """The epoch loop is being left by an exception: if it is a ``SystemExit``, note its code."""
        try:
            found = _in_flight()
        except Exception:  # noqa: BLE001 - only a status to note; the exit goes on
            return
        if found is not None:
            self.keep(found.code)

    def outcome(self) -> tuple[str, int, str | None] | None:
        """``classify`` of the ``SystemExit`` that ended the script; None when it was not one
        (the script ran to its end) or its code was not seen."""
        if self.main_frame is not None and _ran_to_end(self.main_frame):
            return None  # any SystemExit noted on the way was caught
        if self.code is _UNSEEN:
            return None
        return classify(self.code)


class _Exit:
    """``sys.exit``, ``exit`` or ``quit``, noting the status before it calls the original."""

    def __init__(self, original: Any, note: Callable[[Any], None]) -> None:
        self._original = original
        self._note = note

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            self._note(args[0] if args else kwargs.get("code"))
        except Exception:  # noqa: BLE001 - the exit itself must happen exactly as without flor
            pass
        return self._original(*args, **kwargs)

    def __repr__(self) -> str:  # `exit` typed at a prompt says how to leave, as before
        return repr(self._original)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


def _main_frame(frame: FrameType | None) -> FrameType | None:
    """The frame running the ``__main__`` module's own code (a script, ``-m`` or ``-c``), if
    ``frame`` is called from it."""
    main = sys.modules.get("__main__")
    scope = getattr(main, "__dict__", None)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is scope:
            return frame
        frame = frame.f_back
    return None


def _ran_to_end(frame: FrameType) -> bool:
    """Whether a module's finished frame returned (its code ran to the end) rather than was
    left by an exception, which leaves it at the instruction that raised."""
    try:
        for ins in dis.get_instructions(frame.f_code):
            if ins.offset == frame.f_lasti:
                return ins.opname.startswith("RETURN_")
    except (TypeError, ValueError):
        pass
    return False


def _in_flight() -> SystemExit | None:
    """The ``SystemExit`` being raised now, among the objects the garbage collector tracks
    (the youngest generations first: it was just made). One not yet caught anywhere has no
    ``__traceback__`` yet; None when there is none, or no single one."""
    for generation in (0, 1, 2):
        # type(): no __class__ of a lazy module
        found = [o for o in gc.get_objects(generation) if issubclass(type(o), SystemExit)]
        if len(found) == 1:
            return found[0]
        fresh = [o for o in found if o.__traceback__ is None]
        if len(fresh) == 1:
            return fresh[0]
        if found:
            return None
    return None
