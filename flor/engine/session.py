"""The active run: its mode, run directory and the stores it owns.

A session starts at the first flor call of a process run with ``--flor NAME`` (never at
import) and ends at exit, where it flushes what is pending and writes its final status.
``RecordSession`` and ``ReplaySession`` share the bookkeeping of epochs and blocks here.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from .._files import open_append
from ..errors import CheckpointError, FlorError, warn
from ..logs import AS_IS, NOT_SCALAR, to_scalar, to_step
from ..settings import Settings
from ..store import ExperimentStore

__all__ = ["MARKS_EVERY_S", "Session", "as_result", "copy_source", "marks_path", "new_run_id", "source_sha"]

#: the longest an epoch's mark in stdout.marks.jsonl waits in its buffer (a loop of short epochs: docs/loops.md)
MARKS_EVERY_S = 0.5

def new_run_id() -> str:
    """Sortable by start time, unique across machines: ``20261130T050012.123456-1a2b3c``."""
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}"
    return f"{stamp}-{uuid.uuid4().hex[:6]}"


class Tee:
    """Write to the real stream and to a log file; everything else goes to the real stream."""

    def __init__(self, stream: Any, log: Any, on_error: Any = None, written: list[bool] | None = None) -> None:
        self._stream = stream
        self._log = log
        self._on_error = on_error  # a failed copy to the log is counted there, never raised
        self._written = written if written is not None else [False]  # shared: something was written since

    def write(self, text: str) -> int:
        self._written[0] = True
        try:
            self._log.write(text)
        except (OSError, ValueError) as exc:
            self._failed(exc)
        return self._stream.write(text)

    def flush(self) -> None:
        try:
            self._log.flush()
        except (OSError, ValueError) as exc:
            self._failed(exc)
        self._stream.flush()

    def _failed(self, exc: BaseException) -> None:
        if self._on_error is not None and not isinstance(exc, ValueError):  # ValueError: the log is closed
            self._on_error(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Session:
    """Bookkeeping common to record and replay: where in the loop we are, the open block."""

    mode = "session"
    #: the frame that called ``flor.it`` (set by the API): its variables are the outer-loop state
    loop_frame: Any = None
    loop_wrapper: str | None = None  # what wraps flor.it in the script (flor.source.blocks.loop_wrapper)

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        assert settings.name is not None
        self.store = ExperimentStore(settings.home, settings.name)
        self.epoch: int | None = None
        self.loop = "before"  # before | in | after: where the process is relative to flor.it
        self.occurrences: dict[str, int] = {}  # block -> its runs outside the loop (before it and after it)
        self._this_epoch: dict[str, int] = {}  # ... and in the epoch ``_occurrences_of``
        self._occurrences_of: int | None = None
        self._block_names: set[str] = set()  # names check_block_name accepted
        self.open: tuple[str, int | None, int] | None = None
        # (open block, its epoch, the block whose step_into closed it): a later end() with no
        # open block in the same epoch is then a nested SkipBlock, and the error says so
        self.superseded: tuple[str, int | None, str] | None = None
        self.block_started = 0.0
        self.started = time.time()
        self._owner_pid = os.getpid()  # a forked child inherits the session but must not close it
        self.exit_error: str | None = None
        self.exit_detail = ""
        self._tee_file: Any = None
        self._marks_file: Any = None
        self._written = [True]  # the Tees wrote since the last mark: the log's offset must be read again
        self._mark_at = 0  # the log's offset at the last mark
        self._marks_flushed = 0.0  # time.time() of the marks file's last flush
        self._epoch_marks: list[tuple[int, float, int]] = []  # (offset, time, epoch) not written yet
        self._streams: tuple[Any, Any] | None = None
        self._closed = False  # subclasses call _install_hooks() once fully set up
        self._warned: set = set()
        self._warned_lock = threading.RLock()
        self.write_failures: dict[str, int] = {}


    # -- process hooks -----------------------------------------------------------------

    def _install_hooks(self) -> None:
        previous = sys.excepthook
        parent = os.getppid()

        def hook(exc_type: type, exc: BaseException, tb: Any) -> None:
            self.exit_error = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else exc_type.__name__
            self.exit_detail = " ".join(str(exc).split())[:300]  # the replay summary's last line names it
            if issubclass(exc_type, BrokenPipeError) and os.getppid() != parent:
                # the process reading its output died (a launcher killed): the kernel closes the
                # pipe before it sends the worker its SIGTERM (PR_SET_PDEATHSIG), so a print may
                # fail first; the worker was stopped with its launcher, as the signal would say
                self.exit_error = "terminated"
                self.exit_detail = "its parent process (a launcher) died and closed its output pipe"
            previous(exc_type, exc, tb)

        sys.excepthook = hook
        from .signals import install as handle_signals

        handle_signals(self)  # SIGTERM/SIGHUP: settle, status "terminated", then the default action
        atexit.register(self._close_at_exit)

    def _close_at_exit(self) -> None:
        """Close at the interpreter's exit, in the process that made the session only: a child
        made by ``os.fork`` that exits through ``sys.exit`` runs the parent's atexit hooks, and
        closing there would end the parent's live run (status, open block, writer)."""
        if os.getpid() == self._owner_pid:
            self.close()

    def tee_output(self, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # never through a link planted at the output of an existing run (a replay writes into one)
            self._tee_file = os.fdopen(open_append(path), "a", encoding="utf-8", buffering=1)
            self._marks_file = os.fdopen(open_append(marks_path(path)), "a", encoding="utf-8")
        except OSError as exc:  # no copy of the output; the script's own output is untouched
            self.write_failed("stdout", exc)
            return
        self._streams = (sys.stdout, sys.stderr)
        on_error = lambda exc: self.write_failed("stdout", exc)  # noqa: E731
        sys.stdout = Tee(sys.stdout, self._tee_file, on_error, self._written)
        sys.stderr = Tee(sys.stderr, self._tee_file, on_error, self._written)
        self.mark("start")

    def write_failed(self, kind: str, exc: BaseException) -> None:
        """Count a failed write of ``kind`` (``run.json``, ``logs``, ``stdout``, ...) and warn the
        first time: the run goes on without it; run.json lists the counts."""
        with self._warned_lock:
            self.write_failures[kind] = self.write_failures.get(kind, 0) + 1
        self.warn_once("FL104", kind, f"writing {kind} failed ({exc}); training goes on, and run.json "
                                        "counts the failed writes (write_failures)")

    def mark(self, kind: str, epoch: int | None = None, **extra: Any) -> None:
        """Note the byte offset in the output log where ``kind`` (start, epoch, after, end)
        begins, in a side file, so printed lines can be read by epoch (``flor metrics``)
        while the log itself stays exactly what the script printed."""
        if self._tee_file is None or self._marks_file is None:
            return
        try:
            if self._written[0]:  # else the offset is the last mark's: a loop of short epochs prints rarely
                self._written[0] = False
                self._tee_file.flush()
                self._mark_at = self._tee_file.tell()
            now = time.time()
            if kind == "epoch" and epoch is not None and not extra:
                # an epoch's mark reaches the file within MARKS_EVERY_S (a kill -9 loses at most that), kept
                # as numbers until then (a loop of short epochs does not format and write a line each)
                self._epoch_marks.append((self._mark_at, now, epoch))
                if now - self._marks_flushed >= MARKS_EVERY_S:
                    self._write_marks(now)
                return
            if extra:
                rec = {"mark": kind, "at": self._mark_at, "t": now, **extra}
                if epoch is not None:
                    rec["epoch"] = epoch
                line = json.dumps(rec)
            else:  # json.dumps' text for these (``kind`` is flor's own word)
                line = f'{{"mark": "{kind}", "at": {self._mark_at}, "t": {now!r}' + (
                    "}" if epoch is None else f', "epoch": {int(epoch)}}}')
            self._write_marks(now, line + "\n")  # the others at once, after the epochs' before them
        except OSError as exc:  # marks help the readers; they must never fail training
            self.write_failed("stdout marks", exc)
        except ValueError:
            pass  # closed

    def _write_marks(self, now: float, line: str = "") -> None:
        """The epochs' marks kept so far, then ``line``, into the marks file, flushed."""
        pending, self._epoch_marks = self._epoch_marks, []
        if self._marks_file is None:
            return
        self._marks_file.write("".join(f'{{"mark": "epoch", "at": {at}, "t": {t!r}, "epoch": {int(epoch)}}}\n'
                                       for at, t, epoch in pending) + line)
        self._marks_file.flush()
        self._marks_flushed = now

    def flush_marks(self) -> None:
        """The marks noted so far into their file (a signal: the process may end without ``close``)."""
        try:
            self._write_marks(time.time())
        except OSError as exc:
            self.write_failed("stdout marks", exc)
        except ValueError:
            pass  # closed

    def untee_output(self) -> None:
        if self._streams is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = self._streams
            self._streams = None
        self.flush_marks()
        for attr in ("_tee_file", "_marks_file"):
            fh = getattr(self, attr)
            setattr(self, attr, None)
            if fh is not None:
                try:
                    fh.close()
                except OSError as exc:  # the last buffered lines could not be written
                    self.write_failed("stdout", exc)

    # -- loop and blocks ---------------------------------------------------------------

    def begin_loop(self) -> None:
        if self.loop != "before":
            raise FlorError(
                "flor.it wraps one loop per run, and this run already had one: wrap only the "
                "outer epoch loop (iterate inner loops directly)"
            )
        self.loop = "in"

    def end_loop(self) -> None:
        self.loop = "after"
        self.epoch = None

    def open_block(self, name: str) -> tuple[str, int | None, int]:
        if name not in self._block_names:  # checked once a name (a block per iteration: every run)
            self._block_names.add(self.store.check_block_name(name))
        if self.open is not None:
            self.superseded = (self.open[0], self.open[1], name)
            self.close_left_open(f"when SkipBlock {name!r} was entered")
        epoch = self.epoch
        if epoch is None:  # before and after the loop: one count, kept
            occurrences = self.occurrences
        elif epoch == self._occurrences_of:
            occurrences = self._this_epoch
        else:  # the epoch's own counts, dropped at the next one (600k epochs: not 600k keys)
            occurrences, self._occurrences_of = self._this_epoch, epoch
            occurrences.clear()
        occ = occurrences.get(name, 0)
        occurrences[name] = occ + 1
        self.open = (name, epoch, occ)
        self.block_started = time.perf_counter()
        return self.open

    def close_block(self) -> tuple[str, int | None, int]:
        if self.open is None:
            if self.superseded is not None and self.superseded[1] == self.epoch:
                outer, _, inner = self.superseded
                raise CheckpointError(
                    f"SkipBlocks cannot be nested: SkipBlock {outer!r} was still open when SkipBlock "
                    f"{inner!r} was entered, and this SkipBlock.end has no block left to end. Keep one "
                    f"SkipBlock around the expensive part (drop {inner!r}, or end {outer!r} before "
                    f"step_into({inner!r}))"
                )
            raise CheckpointError(
                "SkipBlock.end was called without SkipBlock.step_into: write "
                "`if flor.SkipBlock.step_into(NAME): ...` before it"
            )
        key, self.open = self.open, None
        return key

    def close_left_open(self, when: str) -> None:
        """Close a block whose ``SkipBlock.end`` was never reached (an exception caught around
        it, ``continue`` past it, or a nested ``step_into``), with one warning per block name.

        Called at the next ``step_into`` and at the end of each epoch, in record and replay
        alike: the block has no checkpoint for that epoch, so a replay re-executes it.
        """
        if self.open is None:
            return
        key = self.open
        self.open = None
        name, epoch, _ = key
        at = "outside the loop" if epoch is None else f"at epoch {epoch}"
        self.warn_once("FL106", name, (
            f"SkipBlock {name!r} {at} was still open {when}: an exception (or `continue`) skipped its "
            "SkipBlock.end, or blocks were nested (they cannot be). flor closed it without a checkpoint; "
            "a replay re-executes that epoch"))
        self.left_open(key)

    def left_open(self, key: tuple[str, int | None, int]) -> None:
        """What a mode does with a block closed by ``close_left_open``."""

    def where(self) -> str | None:
        """``before``/``after`` for values logged outside the loop, None inside it."""
        return None if self.loop == "in" else self.loop

    # -- API hooks, overridden ---------------------------------------------------------

    def iterate(self, iterable: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def loop_length(self, iterable: Any) -> int:
        """How many items ``iterate(iterable)`` will yield (``len()`` of ``flor.it``); TypeError
        when that is not known (a generator while recording)."""
        return len(iterable)

    def step_into(self, name: str, probed: bool) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def end(self, objs: tuple) -> tuple:  # pragma: no cover - abstract
        raise NotImplementedError

    def log(self, name: Any, value: Any, step: Any) -> None:
        """Coerce and buffer one value; never raises (an odd name, value or step drops the
        value with one warning per log name and kind)."""
        try:
            if type(name) is str and type(value) in AS_IS and (step is None or type(step) is int):
                self.write_log(name, value, step)  # what to_scalar and to_step would keep as it is
                return
            if type(name) is not str:
                self.warn_once("FL107", type(name).__name__,
                               f"flor.log got a {type(name).__name__} as its name ({name!r:.40}); names are "
                               "strings (value not recorded)")
                return
            scalar = to_scalar(value)
            if scalar is NOT_SCALAR:
                self.warn_once("FL108", (name, type(value).__name__),
                               f"flor.log({name!r}, ...) got a {type(value).__name__}, not a scalar; log numbers, "
                               "bools, strings or one-element tensors (value not recorded)")
                return
            whole = to_step(step)
            if whole is NOT_SCALAR:
                self.warn_once("FL109", (name, type(step).__name__),
                               f"flor.log({name!r}, ..., step=...) got the step {step!r:.40} ({type(step).__name__}); "
                               "a step is a whole number (int, NumPy or one-element tensor integer, or a whole "
                               "float) or None (value not recorded)")
                return
            self.write_log(name, scalar, whole)
        except Exception as exc:  # noqa: BLE001 - flor.log never raises on the training thread
            self.warn_once("FL110", name if isinstance(name, str) else None,
                           f"flor.log({name!r:.40}, ...) failed ({exc!r}); value not recorded")

    def warn_once(self, code: str, subject: Any, message: str) -> bool:
        """Warn with finding ``code`` about ``subject`` the first time only; True if this call warned."""
        with self._warned_lock:
            if (code, subject) in self._warned:
                return False
            self._warned.add((code, subject))
        warn(code, message)
        return True

    def write_log(self, name: str, value: Any, step: Any) -> None:
        """Buffer a coerced value with where it was logged (epoch, open block, before/after the
        loop); sessions that report only some values filter before calling this."""
        logs = getattr(self, "logs", None)
        if logs is not None:
            logs.add(name, value, self.epoch, step, self.open[0] if self.open else None, self.where())

    def close(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def settle(self) -> None:
        """Make pending work durable without ending the session, within the flush timeout:
        a signal is about to go to the script's own handler, which may let the script go on."""


def marks_path(log: Path) -> Path:
    """The side file of epoch marks of an output log: ``stdout.log`` -> ``stdout.marks.jsonl``."""
    return log.with_name(log.stem + ".marks.jsonl")


def copy_source(script: str | None, dest: Path) -> None:
    """Keep a copy of the recorded script in ``dest``, whole or not at all: a write that fails
    (a full disk) leaves no truncated copy for a replay to compare with."""
    if script and Path(script).is_file():
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / Path(script).name
        tmp = dest / f".tmp-{target.name}-{os.getpid()}"
        try:
            shutil.copy2(script, tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)


def source_sha(dest: Path, script: str | None) -> str | None:
    """SHA-256 of the source copy ``copy_source`` kept in ``dest`` (what a run's signature covers);
    None when none was kept."""
    if not script:
        return None
    try:
        return hashlib.sha256((dest / Path(script).name).read_bytes()).hexdigest()
    except OSError:
        return None


def as_result(objs: tuple) -> Any:
    return objs[0] if len(objs) == 1 else objs
