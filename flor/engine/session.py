"""The active run: its mode, run directory and the stores it owns.

A session starts at the first flor call of a process run with ``--flor NAME`` (never at
import) and ends at exit, where it flushes what is pending and writes its final status.
``RecordSession`` and ``ReplaySession`` share the bookkeeping of epochs and blocks here.
"""

from __future__ import annotations

import atexit
import json
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, FlorError, warn
from ..logs import NOT_SCALAR, to_scalar
from ..settings import Settings
from ..store import ExperimentStore

__all__ = ["Session", "as_result", "copy_source", "marks_path", "new_run_id"]

def new_run_id() -> str:
    """Sortable by start time, unique across machines: ``20261130T050012.123456-1a2b3c``."""
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}"
    return f"{stamp}-{uuid.uuid4().hex[:6]}"


class Tee:
    """Write to the real stream and to a log file; everything else goes to the real stream."""

    def __init__(self, stream: Any, log: Any) -> None:
        self._stream = stream
        self._log = log

    def write(self, text: str) -> int:
        try:
            self._log.write(text)
        except (OSError, ValueError):
            pass
        return self._stream.write(text)

    def flush(self) -> None:
        try:
            self._log.flush()
        except (OSError, ValueError):
            pass
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Session:
    """Bookkeeping common to record and replay: where in the loop we are, the open block."""

    mode = "session"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        assert settings.name is not None
        self.store = ExperimentStore(settings.home, settings.name)
        self.epoch: int | None = None
        self.loop = "before"  # before | in | after: where the process is relative to flor.it
        self.occurrences: dict[tuple[str, int | None], int] = {}
        self.open: tuple[str, int | None, int] | None = None
        self.block_started = 0.0
        self.started = time.time()
        self.exit_error: str | None = None
        self._tee_file: Any = None
        self._marks_file: Any = None
        self._streams: tuple[Any, Any] | None = None
        self._closed = False  # subclasses call _install_hooks() once fully set up


    # -- process hooks -----------------------------------------------------------------

    def _install_hooks(self) -> None:
        previous = sys.excepthook

        def hook(exc_type: type, exc: BaseException, tb: Any) -> None:
            self.exit_error = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else exc_type.__name__
            previous(exc_type, exc, tb)

        sys.excepthook = hook
        atexit.register(self.close)

    def tee_output(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._tee_file = open(path, "a", encoding="utf-8", buffering=1)
        self._marks_file = open(marks_path(path), "a", encoding="utf-8")
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = Tee(sys.stdout, self._tee_file)
        sys.stderr = Tee(sys.stderr, self._tee_file)
        self.mark("start")

    def mark(self, kind: str, epoch: int | None = None, **extra: Any) -> None:
        """Note the byte offset in the output log where ``kind`` (start, epoch, after, end)
        begins, in a side file, so printed lines can be read by epoch (``flor metrics``)
        while the log itself stays exactly what the script printed."""
        if self._tee_file is None or self._marks_file is None:
            return
        try:
            self._tee_file.flush()
            rec = {"mark": kind, "at": self._tee_file.tell(), "t": time.time(), **extra}
            if epoch is not None:
                rec["epoch"] = epoch
            self._marks_file.write(json.dumps(rec) + "\n")
            self._marks_file.flush()
        except (OSError, ValueError):
            pass  # marks help the readers; they must never fail training

    def untee_output(self) -> None:
        if self._streams is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = self._streams
            self._streams = None
        if self._tee_file is not None:
            self._tee_file.close()
            self._tee_file = None
        if self._marks_file is not None:
            self._marks_file.close()
            self._marks_file = None

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
        self.store.check_block_name(name)
        if self.open is not None:
            raise CheckpointError(
                f"SkipBlock {name!r} was entered inside SkipBlock {self.open[0]!r}: blocks cannot "
                "nest; call SkipBlock.end for the outer block first, or merge them into one block"
            )
        occ = self.occurrences.get((name, self.epoch), 0)
        self.occurrences[(name, self.epoch)] = occ + 1
        self.open = (name, self.epoch, occ)
        self.block_started = time.perf_counter()
        return self.open

    def close_block(self) -> tuple[str, int | None, int]:
        if self.open is None:
            raise CheckpointError(
                "SkipBlock.end was called without SkipBlock.step_into: write "
                "`if flor.SkipBlock.step_into(NAME): ...` before it"
            )
        key, self.open = self.open, None
        return key

    def where(self) -> str | None:
        """``before``/``after`` for values logged outside the loop, None inside it."""
        return None if self.loop == "in" else self.loop

    # -- API hooks, overridden ---------------------------------------------------------

    def iterate(self, iterable: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def step_into(self, name: str, probed: bool) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def end(self, objs: tuple) -> tuple:  # pragma: no cover - abstract
        raise NotImplementedError

    def log(self, name: str, value: Any, step: Any) -> None:
        scalar = to_scalar(value)
        if scalar is NOT_SCALAR:
            warn(f"flor.log({name!r}, ...) got a {type(value).__name__}, not a scalar; log numbers, "
                 "bools, strings or one-element tensors (value not recorded)")
            return
        self.write_log(name, scalar, step)

    def write_log(self, name: str, value: Any, step: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def marks_path(log: Path) -> Path:
    """The side file of epoch marks of an output log: ``stdout.log`` -> ``stdout.marks.jsonl``."""
    return log.with_name(log.stem + ".marks.jsonl")


def copy_source(script: str | None, dest: Path) -> None:
    if script and Path(script).is_file():
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(script, dest / Path(script).name)


def as_result(objs: tuple) -> Any:
    return objs[0] if len(objs) == 1 else objs
