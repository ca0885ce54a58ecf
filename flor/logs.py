"""Log records: written as JSON lines by a run, read back and merged by the readers.

A record line holds ``name, value, epoch, step, block, t``. Where it came from is the file:
``logs/record.jsonl`` for the recording, ``logs/replay-<replay-id>-<worker>.jsonl`` for each
replay worker, so parallel workers never write the same file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterable

__all__ = ["LogWriter", "FIELDS", "NOT_SCALAR", "merge_newest", "occurrence_keys", "read_run_logs", "to_scalar"]

#: the columns of a log record as the readers return it
FIELDS = ["run", "source", "replay", "worker", "epoch", "step", "name", "value", "block"]

NOT_SCALAR = object()


def to_scalar(value: Any) -> Any:
    """The JSON scalar flor stores for ``value``, or ``NOT_SCALAR`` when it is not a scalar."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    item = getattr(value, "item", None)
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    if callable(item):
        try:
            if callable(numel) and numel() != 1:
                return NOT_SCALAR
            if isinstance(numel, int) and numel != 1:
                return NOT_SCALAR
            out = item()
        except (ValueError, RuntimeError, TypeError):
            return NOT_SCALAR
        if isinstance(out, (bool, int, float, str)):
            return out
    return NOT_SCALAR


class LogWriter:
    """Buffer records in memory; append them to one JSONL file on ``flush``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._buffer: list[tuple] = []

    def add(self, name: str, value: Any, epoch: int | None, step: Any, block: str | None,
            loop: str | None = None) -> None:
        self._buffer.append((name, value, epoch, step, block, loop, time.time()))
        if len(self._buffer) >= 50_000:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        lines = []
        for name, value, epoch, step, block, loop, t in self._buffer:
            rec = {"name": name, "value": value, "epoch": epoch, "step": step, "block": block, "t": t}
            if loop is not None:  # outside flor.it: "before" or "after" the loop
                rec["loop"] = loop
            lines.append(json.dumps(rec))
        self._buffer.clear()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")


def _read_jsonl(path: Path) -> Iterable[dict]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except ValueError:
                continue  # a line torn by a crash: the records before it stand


def read_run_logs(run_dir: Path, run: str) -> list[dict]:
    """Every log record of one run: the recording's, then each replay worker's."""
    out: list[dict] = []
    logs = run_dir / "logs"
    record = logs / "record.jsonl"
    if record.is_file():
        for rec in _read_jsonl(record):
            out.append({**rec, "run": run, "source": "record", "replay": None, "worker": None})
    for path in sorted(logs.glob("replay-*.jsonl")):
        replay, _, worker = path.stem.removeprefix("replay-").rpartition("-")
        for rec in _read_jsonl(path):
            out.append({**rec, "run": run, "source": "replay", "replay": replay,
                        "worker": int(worker) if worker.isdigit() else worker})
    return occurrence_keys(out)


def occurrence_keys(records: list[dict]) -> list[dict]:
    """Number repeats of (name, epoch, step) within each source file as ``k``, in order."""
    counts: dict[tuple, int] = {}
    for rec in records:
        key = (rec.get("run"), rec.get("source"), rec.get("replay"), rec.get("worker"),
               rec["name"], rec.get("epoch"), rec.get("loop"), _hashable(rec.get("step")))
        rec["k"] = counts.get(key, 0)
        counts[key] = rec["k"] + 1
    return records


def _hashable(x: Any) -> Any:
    return json.dumps(x) if isinstance(x, (list, dict)) else x


def merge_newest(records: list[dict]) -> list[dict]:
    """One record per (run, name, epoch, step, k): a replay's value over the recording's,
    a newer replay's over an older one's. Order: the first appearance of each key."""
    best: dict[tuple, dict] = {}
    order: list[tuple] = []
    for rec in records:
        key = (rec["run"], rec["name"], rec.get("epoch"), rec.get("loop"), _hashable(rec.get("step")), rec.get("k", 0))
        old = best.get(key)
        if old is None:
            order.append(key)
            best[key] = rec
        elif (rec["source"] == "replay", rec.get("t", 0)) >= (old["source"] == "replay", old.get("t", 0)):
            best[key] = rec
    return [best[k] for k in order]
