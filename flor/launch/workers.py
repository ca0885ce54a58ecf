"""A replay worker as the launcher sees it: its handle (a process or a Ray task), its progress
read from the epoch marks it writes (``replay-<id>-<N>.marks.jsonl``, never the script's
output), and the report of its failure."""

from __future__ import annotations

import json
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from .._files import MAX_METADATA, read_lines
from .._fmt import span
from ..plan import ReplayPlan
from .executor import Worker

__all__ = ["WorkerState", "failure"]

_TAIL = 15  # lines of a failed worker's output shown


def signal_name(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


@dataclass
class WorkerState:
    """One worker, as its executor started it, and what the launcher has read of its progress."""

    index: int
    plan: ReplayPlan
    handle: Worker | None = None  # set when the executor starts it
    tail: deque = field(default_factory=lambda: deque(maxlen=_TAIL))
    spawned: float = 0.0
    first_epoch: float | None = None
    last_mark: float | None = None
    done_epochs: int = 0  # segment epochs finished
    completed: int = 0  # epochs finished, initialization included
    open_epoch: tuple[int, bool] | None = None
    marks_at: int = 0
    loop_end: float | None = None  # the "after" mark: the loop is done
    exited: float | None = None
    rc: int | None = None
    skipped: bool = False  # done by an earlier attempt of this replay

    def fixed_s(self) -> float | None:
        """What the worker spent outside its epochs: start-up (interpreter, imports, the script up
        to its loop) and wind-down (summary, exit); the ``startup_s`` of ``flor replay --plan``."""
        if self.first_epoch is None or self.loop_end is None or self.exited is None or not self.spawned:
            return None
        return (self.exited - self.spawned) - (self.loop_end - self.first_epoch)

    def read_marks(self, path: Path) -> None:
        """Count the segment epochs finished so far from the worker's epoch marks."""
        try:
            with read_lines(path) as fh:  # a regular file, no link followed: never a FIFO
                fh.seek(self.marks_at)
                data = fh.read(MAX_METADATA)
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # a partly written last line waits for the next read
        self.marks_at += end
        for line in data[:end].decode("utf-8", errors="replace").splitlines():
            try:
                m = json.loads(line)
            except ValueError:
                continue
            if self.open_epoch is not None:
                self.completed += 1
                self.done_epochs += 0 if self.open_epoch[1] else 1
            self.open_epoch = None
            if m.get("mark") == "after":
                self.loop_end = float(m["t"])
            if m.get("mark") == "epoch":
                self.open_epoch = (int(m.get("epoch", -1)), bool(m.get("init")))
                if self.first_epoch is None:
                    self.first_epoch = float(m["t"])
            self.last_mark = float(m.get("t", time.time()))


def failure(s: WorkerState) -> str:
    why = ("not started" if s.handle is None else signal_name(s.rc) if s.rc not in (None, 0)
           else "no summary was written")
    lines = "\n".join(f"      {line}" for line in s.tail) or "      (no output)"
    return (f"worker {s.index} (epochs {span(s.plan.segment)}) failed: {why}; its last lines:\n{lines}")
