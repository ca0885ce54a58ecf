"""Log records: written as JSON lines by a run, read back and merged by the readers.

A record line holds ``name, value, epoch, step, block, t``. Where it came from is the file:
``logs/record.jsonl`` for the recording, ``logs/replay-<replay-id>-<worker>.jsonl`` for each
replay worker, so parallel workers never write the same file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable

__all__ = [
    "LogWriter", "FIELDS", "NOT_SCALAR", "merge_newest", "occurrence_keys", "read_run_logs", "retire_worker_files",
    "to_scalar", "worker_files",
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


def _worker_order(path: Path) -> tuple:
    replay, _, worker = path.stem.removeprefix("replay-").rpartition("-")
    return (replay, int(worker) if worker.isdigit() else -1, worker)


def read_run_logs(run_dir: Path, run: str, *, ranks: bool = False) -> list[dict]:
    """Every log record of one run: the recording's, then each replay's, worker by worker (so
    in epoch order: workers replay contiguous segments).

    With ``ranks``, a distributed recording's other ranks too (``logs/record-rank<R>.jsonl``),
    each record tagged with its ``rank`` (rank 0's are ``record.jsonl``'s).
    """
    out: list[dict] = []
    logs = run_dir / "logs"
    record = logs / "record.jsonl"
    if record.is_file():
        for rec in _read_jsonl(record):
            out.append({**rec, "run": run, "source": "record", "replay": None, "worker": None,
                        **({"rank": 0} if ranks else {})})
    if ranks:
        for path in sorted(logs.glob("record-rank*.jsonl"), key=lambda p: int(p.stem[11:] or 0)):
            for rec in _read_jsonl(path):
                out.append({**rec, "run": run, "source": "record", "replay": None, "worker": None,
                            "rank": int(path.stem[11:] or 0)})
    for path in sorted(logs.glob("replay-*.jsonl"), key=_worker_order):
        replay, _, worker = path.stem.removeprefix("replay-").rpartition("-")
        for rec in _read_jsonl(path):
            out.append({**rec, "run": run, "source": "replay", "replay": replay,
                        "worker": int(worker) if worker.isdigit() else worker})
    return occurrence_keys(out)


def occurrence_keys(records: list[dict]) -> list[dict]:
    """Number repeats of (name, epoch, step) within each source file as ``k``, in order."""
    counts: dict[tuple, int] = {}
    for rec in records:
        key = (rec.get("run"), rec.get("source"), rec.get("replay"), rec.get("worker"), rec.get("rank"),
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


def worker_files(run_dir: Path, replay: str, worker: int) -> list[Path]:
    """The files one replay worker writes: its log records, summary, output and output marks."""
    stem = f"replay-{replay}-{worker}"
    return [run_dir / "logs" / f"{stem}.jsonl", run_dir / "logs" / f"{stem}.summary.json",
            run_dir / f"{stem}.log", run_dir / f"{stem}.marks.jsonl"]


def retire_worker_files(run_dir: Path, replay: str, worker: int) -> Path | None:
    """Move an earlier attempt of worker ``worker`` of ``replay`` out of the readers' way.

    A worker that runs again under the same replay id (``flor replay`` resuming after a
    failure, a requeued Slurm task, a restarted torchrun worker) starts clean: its earlier
    files go to ``runs/<run>/attempts/<replay>-<worker>-<n>/`` (kept for reading, never
    merged) and its TensorBoard file, derived from them, is deleted. Returns that folder,
    or None when there was nothing to move.
    """
    found = [p for p in worker_files(run_dir, replay, worker) if p.exists()]
    tb = run_dir / "tb" / f"replay-{replay}"
    events = sorted(tb.glob(f"events.out.tfevents.*.{worker}")) if tb.is_dir() else []
    for e in events:
        e.unlink(missing_ok=True)
    if not found:
        return None
    n = 0
    while (run_dir / "attempts" / f"{replay}-{worker}-{n}").exists():
        n += 1
    dest = run_dir / "attempts" / f"{replay}-{worker}-{n}"
    dest.mkdir(parents=True)
    for p in found:
        p.replace(dest / p.name)
    return dest
