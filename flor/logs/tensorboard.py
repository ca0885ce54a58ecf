"""TensorBoard event files for logged values, written with TensorBoard's own event writer.

A recording writes ``runs/<run>/tb/record/`` as its epochs end; each replay writes
``runs/<run>/tb/replay-<replay-id>/`` (one file per worker) when it finishes, leaving out
values it re-logged identically, so ``tensorboard --logdir ~/.flor/NAME`` shows the
baseline and the hindsight values side by side without duplicates.

The x-axis (TensorBoard's global step) is aligned with the training loop:

* a value logged with ``step=N`` (a whole number: batches, optimizer steps) is at ``N``;
* a value logged without a step (or with one that is not a whole number) is at its epoch;
* a value logged before ``flor.it``'s loop is at 0, after it at the number of epochs.

Files are written by ``tensorboard.summary.writer.event_file_writer.EventFileWriter`` from
``Event`` protocol buffers (``tensorboard.compat.proto``): the writer TensorBoard and
``torch.utils.tensorboard`` use, without TensorFlow and without importing torch's wrapper
(about 0.9 s). TensorBoard is imported on the first value written, so a run that logs
nothing, and every import of flor, pays nothing for it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from . import record_key, same_value

__all__ = ["EventFileWriter", "RecordEvents", "global_step", "write_replay_events"]


class EventFileWriter:
    """Append scalar events to one ``events.out.tfevents.*<suffix>`` file in ``logdir``.

    The file (and TensorBoard's writer thread) is created on the first write, so a writer
    that writes nothing leaves nothing behind. Each ``add_scalars`` is on disk when it
    returns. ``close()`` is safe to call twice.

    >>> import tempfile
    >>> w = EventFileWriter(Path(tempfile.mkdtemp()) / "tb")
    >>> w.add_scalars([("val_acc", 0.93, 4, 0.0)])
    1
    >>> w.close(); w.close()
    """

    def __init__(self, logdir: Path, suffix: str = "") -> None:
        self.logdir = Path(logdir)
        self.suffix = suffix
        self._writer: Any = None

    def _open(self) -> Any:
        if self._writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter as _TBWriter

            self._writer = _TBWriter(str(self.logdir), filename_suffix=self.suffix)
        return self._writer

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        self.add_scalars([(tag, float(value), int(step), wall_time or time.time())])

    def add_scalars(self, items: Iterable[tuple[str, float, int, float]]) -> int:
        """Write ``(tag, value, step, wall_time)`` items; return how many were written."""
        items = list(items)
        if not items:
            return 0
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        writer = self._open()
        for tag, value, step, t in items:
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
            writer.add_event(Event(wall_time=t, step=step, summary=summary))
        writer.flush()  # the events are readable (and survive a crash) once the call returns
        return len(items)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


# -- from log records to scalars ---------------------------------------------------------

def global_step(rec: dict, epochs: int) -> int | None:
    """The x of a log record in TensorBoard (see the module docstring); None: not plottable."""
    step = rec.get("step")
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if isinstance(step, int) and not isinstance(step, bool):
        return step
    if rec.get("epoch") is not None:
        return int(rec["epoch"])
    return {"before": 0, "after": epochs}.get(rec.get("loop") or "")


def _scalar(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            return math.copysign(math.inf, value)
    return None  # strings are not plotted


def scalars_of(records: Iterable[dict], epochs: int) -> list[tuple[str, float, int, float]]:
    out = []
    for rec in records:
        value, x = _scalar(rec.get("value")), global_step(rec, epochs)
        if value is not None and x is not None:
            out.append((str(rec["name"]), value, x, float(rec.get("t") or time.time())))
    return out


class RecordEvents:
    """The recording's events: called with each batch of flushed log records.

    ``epochs`` gives the number of epochs done so far, for values logged after the loop.
    """

    def __init__(self, folder: Path, epochs: Callable[[], int]) -> None:
        self.writer = EventFileWriter(Path(folder))
        self.epochs = epochs

    def __call__(self, records: list[dict]) -> None:
        self.writer.add_scalars(scalars_of(records, self.epochs()))

    def close(self) -> None:
        self.writer.close()


def write_replay_events(folder: Path, worker: int, mine: list[dict],
                        recorded: list[dict], epochs: int) -> int:
    """Write one replay worker's values that the recording lacks or that differ from it.

    ``folder`` is the replay's ``tb/replay-<id>/`` (``RunLayout.tb_replay``). ``mine`` and ``recorded`` are records as ``flor.logs.read_run_logs`` returns them (with
    their occurrence number ``k``). Returns the number of scalars written.
    """
    baseline = {record_key(r): r.get("value") for r in recorded}
    # a value the recording has, of the same type, is already in tb/record/
    new = [r for r in mine if record_key(r) not in baseline
           or not same_value(baseline[record_key(r)], r.get("value"), exact_type=True)]
    writer = EventFileWriter(Path(folder), suffix=f".{worker}")
    try:
        return writer.add_scalars(scalars_of(new, epochs))
    finally:
        writer.close()
