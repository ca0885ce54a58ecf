"""Log records: written as JSON lines by a run, read back and merged by the readers.

A record line holds ``name, value, epoch, step, block, t``. Where it came from is the file:
``logs/record.jsonl`` for the recording, ``logs/replay-<replay-id>-<worker>.jsonl`` for each
replay worker, so parallel workers never write the same file.

Two rules every reader shares are defined here once: ``record_key`` (which records are "the
same value", logged again) and ``same_value`` (whether two logged values are equal).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable

from .._files import StoreFileError, lines, open_append, read_lines
from ..errors import warn

__all__ = [
    "AS_IS", "LogWriter", "FIELDS", "NOT_SCALAR", "merge_newest", "occurrence_keys", "parse_record", "read_jsonl",
    "record_key", "same_value", "step_key", "to_scalar", "to_step",
]

#: the columns of a log record as the readers return it
FIELDS = ["run", "source", "replay", "worker", "epoch", "step", "name", "value", "block"]

NOT_SCALAR = object()


def to_scalar(value: Any) -> Any:
    """The JSON scalar flor stores for ``value``, or ``NOT_SCALAR`` when it is not a scalar.

    A one-element CUDA tensor is kept as it is (detached) and converted when the buffer is
    flushed, so ``flor.log`` never synchronizes the device on the hot path.
    """
    if type(value) in _PLAIN or value is None:
        return value
    if getattr(value, "is_cuda", False):
        try:
            if value.numel() == 1:
                return value.detach()
        except (AttributeError, RuntimeError, TypeError):
            return NOT_SCALAR
    item = getattr(value, "item", None)
    if callable(item):
        try:
            out = item()  # raises for tensors and arrays of more than one element
        except (ValueError, RuntimeError, TypeError):
            return NOT_SCALAR
        if isinstance(out, (bool, int, float, str)):
            return out
    for plain in _PLAIN:  # subclasses of the plain types (an IntEnum, a float subclass)
        if isinstance(value, plain):
            return plain(value)
    return NOT_SCALAR


_PLAIN = (float, int, bool, str)


def to_step(step: Any) -> Any:
    """The step flor stores for ``step``: None or a whole number; ``NOT_SCALAR`` otherwise.

    Steps index values, so they are whole numbers: a NumPy integer or a one-element integer
    tensor becomes an ``int``, and so does a float that is whole (``3.0`` -> ``3``, from a
    float counter or a float tensor); a fractional or non-finite float, a bool, a string or
    any other object is not a step. A one-element CUDA tensor is kept and converted at flush,
    like a value.

    >>> [to_step(s) for s in (None, 3, 3.0)], to_step(2.5) is NOT_SCALAR, to_step(True) is NOT_SCALAR
    ([None, 3, 3], True, True)
    """
    if step is None or type(step) is int:
        return step
    scalar = to_scalar(step)
    if getattr(scalar, "is_cuda", False):
        return scalar
    return _whole(scalar)


def _whole(scalar: Any) -> Any:
    if isinstance(scalar, bool) or scalar is None:
        return NOT_SCALAR
    if isinstance(scalar, int):
        return int(scalar)
    if isinstance(scalar, float) and math.isfinite(scalar) and scalar == int(scalar):
        return int(scalar)
    return NOT_SCALAR


def _text(value: Any) -> str:
    """``json.dumps(value)`` for the values a log record holds, without its per-call set-up
    (~3 us a record on the training thread, at every epoch's end)."""
    kind = type(value)
    if kind is float:
        return float.__repr__(value) if math.isfinite(value) else json.dumps(value)  # NaN, Infinity: as json
    if kind is int:
        return int.__repr__(value)
    if kind is str:
        text = _STRINGS.get(value)
        if text is None:
            text = json.dumps(value)
            if len(_STRINGS) < 4096:  # names and blocks repeat; string values mostly do not
                _STRINGS[value] = text
        return text
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    return json.dumps(value)


_STRINGS: dict[str, str] = {}


def json_line(name: str, value: Any, epoch: int | None, step: int | None, block: str | None, t: float,
              loop: str | None = None) -> str:
    """``json.dumps`` of a log record ``{name, value, epoch, step, block, t[, loop]}`` (plain
    scalars), ~40% faster: at every epoch's end, on the training thread.

    >>> rec = {"name": "loss", "value": float("nan"), "epoch": 0, "step": None, "block": "t\u00e9", "t": 1.5}
    >>> (json_line(*rec.values()) == json.dumps(rec),
    ...  json_line(*rec.values(), "after") == json.dumps({**rec, "loop": "after"}))
    (True, True)
    """
    line = (f'{{"name": {_text(name)}, "value": {_text(value)}, "epoch": {_text(epoch)}, "step": {_text(step)}, '
            f'"block": {_text(block)}, "t": {_text(t)}')
    return line + (f', "loop": {_text(loop)}}}' if loop is not None else "}")


#: the types of values (and steps) that are stored as they are: to_scalar and to_step keep them
AS_IS = frozenset({float, int, bool, str, type(None)})


class LogWriter:
    """Buffer records in memory; append them to one JSONL file on ``flush``.

    Thread-safe: any thread may ``add`` while another flushes; each record is written exactly
    once. ``flush`` never raises: a record whose deferred device value cannot be read is
    dropped, and a failed write (a full disk, a read-only store) is reported to
    ``on_error(exc, count)``, so the training thread never sees it. The lines of a failed
    write are cut back off the file (it keeps whole lines) and kept in memory, up to
    ``KEEP_UNWRITTEN`` records, to be written first by the next flush: a disk that fills up
    and frees again loses no values. ``unwritten`` holds those still not on disk, and
    ``lost`` counts the ones given up beyond that bound.

    ``sink``, if given, is called with the records of each flush as dicts (after they are
    written): the recording's TensorBoard events and metric summary follow the logs this way.
    """

    KEEP_UNWRITTEN = 1_000_000

    def __init__(self, path: Path, sink: Callable[[list[dict]], None] | None = None,
                 on_error: Callable[[BaseException, int], None] | None = None) -> None:
        self.path = path
        self.sink = sink
        self.on_error = on_error
        # appended to by any thread, taken from by flush: deque.append and popleft are atomic, so
        # no lock on flor.log's path (a signal handler's flush may run between any two bytecodes)
        self._buffer: deque[tuple] = deque()
        self._write_lock = threading.RLock()  # one flush writes at a time, in order
        self._failed = False
        self._unwritten: list[tuple[str, dict]] = []  # (line, record) of failed writes, oldest first
        self.lost = 0

    @property
    def unwritten(self) -> list[dict]:
        """The records a failed write left in memory (written by a later flush if the disk allows)."""
        with self._write_lock:
            return [rec for _, rec in self._unwritten]

    def add(self, name: str, value: Any, epoch: int | None, step: Any, block: str | None,
            loop: str | None = None) -> None:
        buffer = self._buffer
        buffer.append((name, value, epoch, step, block, loop, time.time()))
        if len(buffer) >= 50_000:
            self.flush()

    def flush(self) -> None:
        if not self._buffer and not self._unwritten:  # nothing logged (most epochs of a loop of short ones)
            return
        with self._write_lock:
            buffer: list[tuple] = []
            take = self._buffer.popleft
            try:
                for _ in range(len(self._buffer)):  # what is there now; values added meanwhile wait for the next
                    buffer.append(take())
            except IndexError:
                pass  # a signal handler's flush, run in between, took the rest
            if not buffer and not self._unwritten:
                return
            lines, recs = [line for line, _ in self._unwritten], [rec for _, rec in self._unwritten]
            for name, value, epoch, step, block, loop, t in buffer:
                try:
                    if type(value) not in AS_IS and getattr(value, "is_cuda", False):
                        value = value.item()  # a deferred device scalar: synchronize once, here
                    if type(step) not in AS_IS and getattr(step, "is_cuda", False):
                        step = _whole(step.item())
                        if step is NOT_SCALAR:
                            continue
                    line = json_line(name, value, epoch, step, block, t, loop)
                    rec = {"name": name, "value": value, "epoch": epoch, "step": step, "block": block, "t": t}
                    if loop is not None:  # outside flor.it: "before" or "after" the loop
                        rec["loop"] = loop
                    lines.append(line)
                except (TypeError, ValueError, RuntimeError, OverflowError):
                    continue  # a value flor.log let through cannot be read now: drop it alone
                recs.append(rec)
            if not lines:
                return
            try:
                _append_whole(self.path, ("\n".join(lines) + "\n").encode("utf-8"))
            except OSError as exc:
                fresh = len(lines) - len(self._unwritten)
                kept = list(zip(lines, recs))
                if len(kept) > self.KEEP_UNWRITTEN:
                    self.lost += len(kept) - self.KEEP_UNWRITTEN
                    kept = kept[-self.KEEP_UNWRITTEN:]
                self._unwritten = kept
                if self.on_error is not None:
                    self.on_error(exc, fresh)
                elif not self._failed:
                    warn("FL113", f"writing the logs to {self.path} failed ({exc}); the run goes on, and the values "
                         "are written when the disk allows")
                self._failed = True
                return
            self._unwritten = []
        if self.sink is not None:
            self.sink(recs)


def _append_whole(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path``, or leave the file as it was: a write that fails part way (a
    full disk) is cut back off, so the file never ends in half a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_append(path)  # never through a link planted at the log of an existing run
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass  # the reader skips a torn last line (parse_record)
            raise
    finally:
        os.close(fd)


def parse_record(line: bytes | str) -> dict | None:
    """The log record one line holds, or None when the line is not one (torn, damaged, or a
    JSON value of the wrong shape): readers skip it rather than fail on it later.

    >>> parse_record(b'{"name": "loss", "value": 0.5, "epoch": 1, "step": null}')["value"]
    0.5
    >>> parse_record(b'[1, 2]') is None, parse_record(b'{"name": 3}') is None
    (True, True)
    """
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("name"), str):
        return None
    epoch = rec.get("epoch")
    if epoch is not None and (type(epoch) is not int or epoch < 0):
        return None
    if not isinstance(rec.get("value"), (type(None), bool, int, float, str)):
        return None
    for key in ("block", "loop"):
        if not isinstance(rec.get(key), (type(None), str)):
            return None
    if not isinstance(rec.get("t", 0), (int, float)) or isinstance(rec.get("t"), bool):
        return None
    return rec


def read_jsonl(path: Path) -> Iterable[dict]:
    """The records of one log file. A line torn by a crash is skipped; other damaged lines
    are skipped with one warning naming the file, and so is a file that is not a regular
    file (a folder, a FIFO or a device put in its place: opening one could block or never end)
    or cannot be read."""
    damaged = 0
    torn = False
    try:
        fh = read_lines(path)  # a regular file, no link followed: never a FIFO that blocks
    except StoreFileError as exc:
        warnings.warn(f"flor: FL413 skipped {exc.strerror}", RuntimeWarning, stacklevel=2)
        return
    except OSError as exc:
        warnings.warn(f"flor: FL413 skipped {path}: {exc.strerror or exc}; move it out of the run's logs/ folder",
                      RuntimeWarning, stacklevel=2)
        return
    with fh:
        for raw in lines(fh):  # a line past MAX_LINE (a file without newlines) is one damaged line
            line = raw.strip()
            if not line:
                continue
            rec = parse_record(line)
            if rec is None:
                damaged += 1
                torn = not raw.endswith(b"\n")  # true only for the last line: one torn by a crash
                continue
            yield rec
    if damaged - (1 if torn else 0) > 0:
        warnings.warn(f"flor: FL413 skipped {damaged - (1 if torn else 0)} damaged line(s) of {path}",
                      RuntimeWarning, stacklevel=2)


def step_key(step: Any) -> str:
    """The step as a key: its JSON text, as the log line holds it.

    So ``3`` and ``3.0`` are different steps (a replay that logs ``step=3.0`` where the
    recording logged ``step=3`` logs a new value, as the verification has always counted it),
    ``True`` is not ``1``, a string ``"3"`` is not ``3``, and list or dict steps are keys too.

    >>> [step_key(s) for s in (3, 3.0, None, "3", [1, 2])]
    ['3', '3.0', 'null', '"3"', '[1, 2]']
    """
    return json.dumps(step, sort_keys=True, default=str)


def _slot(rec: dict) -> tuple:
    return (rec.get("run"), rec["name"], rec.get("epoch"), rec.get("loop"), step_key(rec.get("step")))


def record_key(rec: dict) -> tuple:
    """What identifies a logged value across the recording and its replays:
    ``(run, name, epoch, loop, step, k)``.

    ``loop`` tells values logged before and after ``flor.it``'s loop apart; ``k`` numbers
    repeats of the same (name, epoch, step) within one file (see ``occurrence_keys``); the
    step compares by its JSON text (see ``step_key``). A replay's record with the key of a
    recorded one logged that value again; one with a new key is a hindsight value.

    >>> record_key({"run": "r1", "name": "loss", "epoch": 2, "step": 10, "k": 0})
    ('r1', 'loss', 2, None, '10', 0)
    """
    return (*_slot(rec), rec.get("k", 0))


def same_value(a: Any, b: Any, *, exact_type: bool = False) -> bool:
    """Whether two logged values are equal: NaN equals NaN; an int equals the float of the
    same value (``1 == 1.0``) unless ``exact_type``; a bool equals only a bool.

    >>> same_value(float("nan"), float("nan")), same_value(1, 1.0), same_value(1, True)
    (True, True, False)
    >>> same_value(1, 1.0, exact_type=True)
    False
    """
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is type(b):
        return a == b
    numbers = (int, float)
    return (not exact_type and isinstance(a, numbers) and isinstance(b, numbers)
            and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def occurrence_keys(records: list[dict]) -> list[dict]:
    """Number repeats of (name, epoch, step) within each source file as ``k``, in order."""
    counts: dict[tuple, int] = {}
    for rec in records:
        key = (rec.get("source"), rec.get("replay"), rec.get("worker"), rec.get("rank"), *_slot(rec))
        rec["k"] = counts.get(key, 0)
        counts[key] = rec["k"] + 1
    return records


def merge_newest(records: list[dict]) -> list[dict]:
    """One record per ``record_key``: a replay's value over the recording's, a newer
    replay's over an older one's. Order: the first appearance of each key."""
    best: dict[tuple, dict] = {}
    order: list[tuple] = []
    for rec in records:
        key = record_key(rec)
        old = best.get(key)
        if old is None:
            order.append(key)
            best[key] = rec
        elif (rec["source"] == "replay", rec.get("t", 0)) >= (old["source"] == "replay", old.get("t", 0)):
            best[key] = rec
    return [best[k] for k in order]
