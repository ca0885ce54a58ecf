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
import time
from pathlib import Path
from typing import Any, Callable, Iterable

__all__ = [
    "LogWriter", "FIELDS", "NOT_SCALAR", "merge_newest", "occurrence_keys", "read_jsonl", "record_key",
    "same_value", "step_key", "to_scalar",
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


class LogWriter:
    """Buffer records in memory; append them to one JSONL file on ``flush``.

    ``sink``, if given, is called with the records of each flush as dicts (after they are
    written): the recording's TensorBoard events and metric summary follow the logs this way.
    """

    def __init__(self, path: Path, sink: Callable[[list[dict]], None] | None = None) -> None:
        self.path = path
        self.sink = sink
        self._buffer: list[tuple] = []

    def add(self, name: str, value: Any, epoch: int | None, step: Any, block: str | None,
            loop: str | None = None) -> None:
        self._buffer.append((name, value, epoch, step, block, loop, time.time()))
        if len(self._buffer) >= 50_000:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        lines, recs = [], []
        for name, value, epoch, step, block, loop, t in self._buffer:
            if hasattr(value, "item"):  # a deferred device scalar: synchronize once, here
                value = value.item()
            rec = {"name": name, "value": value, "epoch": epoch, "step": step, "block": block, "t": t}
            if loop is not None:  # outside flor.it: "before" or "after" the loop
                rec["loop"] = loop
            lines.append(json.dumps(rec))
            recs.append(rec)
        self._buffer.clear()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        if self.sink is not None:
            self.sink(recs)


def read_jsonl(path: Path) -> Iterable[dict]:
    """The records of one log file; a line torn by a crash (or damaged) is skipped."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except ValueError:
                continue  # a line torn by a crash: the records before it stand


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
