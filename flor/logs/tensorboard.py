"""TensorBoard event files for logged values, written without TensorBoard installed.

A recording writes ``runs/<run>/tb/record/`` as its epochs end; each replay writes
``runs/<run>/tb/replay-<replay-id>/`` (one file per worker) when it finishes, leaving out
values it re-logged identically, so ``tensorboard --logdir ~/.flor/NAME`` shows the
baseline and the hindsight values side by side without duplicates.

The x-axis (TensorBoard's global step) is aligned with the training loop:

* a value logged with ``step=N`` (a whole number: batches, optimizer steps) is at ``N``;
* a value logged without a step (or with one that is not a whole number) is at its epoch;
* a value logged before ``flor.it``'s loop is at 0, after it at the number of epochs.

Event files are TFRecord files of ``Event`` protocol buffers. The few fields flor needs are
encoded here by hand (about 60 lines), so recording depends on neither TensorBoard nor
protobuf; the tests read the files back with TensorBoard's own ``EventAccumulator``. Viewing
them needs ``pip install 'flor[tensorboard]'``.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any, Callable, Iterable

__all__ = ["EventFileWriter", "RecordEvents", "global_step", "write_replay_events"]


# -- CRC32C (Castagnoli), as TFRecord framing requires ----------------------------------

def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# -- protocol buffer encoding of the Event fields flor writes ---------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negative numbers
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int | None = None, *, file_version: str | None = None,
           scalars: Iterable[tuple[str, float]] = ()) -> bytes:
    out = b"\x09" + struct.pack("<d", wall_time)  # field 1: wall_time (double)
    if step is not None:
        out += b"\x10" + _varint(step)  # field 2: step (int64)
    if file_version is not None:
        out += _field_bytes(3, file_version.encode())
    values = b"".join(
        # Summary.Value: field 1 tag (string), field 2 simple_value (float)
        _field_bytes(1, _field_bytes(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
        for tag, value in scalars
    )
    if values:
        out += _field_bytes(5, values)  # field 5: summary
    return out


def _frame(record: bytes) -> bytes:
    header = struct.pack("<Q", len(record))
    return header + struct.pack("<I", _masked_crc(header)) + record + struct.pack("<I", _masked_crc(record))


class EventFileWriter:
    """Append scalar events to one ``events.out.tfevents.*`` file in ``logdir``.

    The file is created on the first write. ``close()`` is safe to call twice.

    >>> w = EventFileWriter(Path("/tmp/tb-demo"))  # doctest: +SKIP
    >>> w.add_scalar("val_acc", 0.93, step=4); w.close()  # doctest: +SKIP
    """

    def __init__(self, logdir: Path, suffix: str = "") -> None:
        self.logdir = Path(logdir)
        self.suffix = suffix
        self.path: Path | None = None
        self._fh: Any = None

    def _open(self) -> Any:
        if self._fh is None:
            self.logdir.mkdir(parents=True, exist_ok=True)
            name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}{self.suffix}"
            self.path = self.logdir / name
            self._fh = open(self.path, "ab")
            self._fh.write(_frame(_event(time.time(), file_version="brain.Event:2")))
        return self._fh

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        self.add_scalars([(tag, float(value), int(step), wall_time or time.time())])

    def add_scalars(self, items: Iterable[tuple[str, float, int, float]]) -> int:
        """Write ``(tag, value, step, wall_time)`` items; return how many were written."""
        frames = [_frame(_event(t, step, scalars=[(tag, value)])) for tag, value, step, t in items]
        if frames:
            fh = self._open()
            fh.write(b"".join(frames))
            fh.flush()
        return len(frames)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


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

    def __init__(self, run_dir: Path, epochs: Callable[[], int]) -> None:
        self.writer = EventFileWriter(Path(run_dir) / "tb" / "record")
        self.epochs = epochs

    def __call__(self, records: list[dict]) -> None:
        self.writer.add_scalars(scalars_of(records, self.epochs()))

    def close(self) -> None:
        self.writer.close()


def _key(rec: dict) -> tuple:
    step = rec.get("step")
    return (rec["name"], rec.get("epoch"), rec.get("loop"),
            repr(step) if isinstance(step, (list, dict)) else step, rec.get("k", 0))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b)


def write_replay_events(run_dir: Path, replay_id: str, worker: int, mine: list[dict],
                        recorded: list[dict], epochs: int) -> int:
    """Write one replay worker's values that the recording lacks or that differ from it.

    ``mine`` and ``recorded`` are records as ``flor.logs.read_run_logs`` returns them (with
    their occurrence number ``k``). Returns the number of scalars written.
    """
    baseline = {_key(r): r.get("value") for r in recorded}
    new = [r for r in mine if _key(r) not in baseline or not _same(baseline[_key(r)], r.get("value"))]
    writer = EventFileWriter(Path(run_dir) / "tb" / f"replay-{replay_id}", suffix=f".{worker}")
    try:
        return writer.add_scalars(scalars_of(new, epochs))
    finally:
        writer.close()
