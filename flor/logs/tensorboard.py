"""TensorBoard event files for logged values, encoded here by hand, not with TensorBoard's writer.

A recording writes ``runs/<run>/tb/record/`` as its epochs end; each replay writes
``runs/<run>/tb/replay-<replay-id>/`` (one file per worker) when it finishes, leaving out
values it re-logged identically, so ``tensorboard --logdir ~/.flor/NAME`` shows the
baseline and the hindsight values side by side without duplicates.

The x-axis (TensorBoard's global step) is aligned with the training loop:

* a value logged with ``step=N`` (a whole number: batches, optimizer steps) is at ``N``;
* a value logged without a step (or with one that is not a whole number) is at its epoch;
* a value logged before ``flor.it``'s loop is at 0, after it at the number of epochs.

Why by hand: importing TensorBoard's writer (and protobuf) on the first value logged cost
~0.4 s of CPU holding the GIL on the background writer, which stalled training by ~0.25 s
early in every run that logged (issue #13). The files are the ones ``torch.utils.tensorboard``
writes: TFRecord frames (length, masked CRC-32C of it, an ``Event`` protocol buffer, masked
CRC-32C of it), the first holding ``file_version: "brain.Event:2"``, each other one
``wall_time``, ``step`` and one ``summary.value {tag, simple_value}``; only those few fields
are encoded. TensorBoard itself reads them back (tested); tensorboard stays a dependency to
view them.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import socket
import struct
import time
from pathlib import Path
from typing import IO, Any, Callable, Iterable

from .._files import open_append
from . import record_key, same_value

__all__ = ["EventFileWriter", "RecordEvents", "global_step", "scalar_value", "write_replay_events"]


class EventFileWriter:
    """Append scalar events to one ``events.out.tfevents.*<suffix>`` file in ``logdir``.

    The file is created on the first write, so a writer that writes nothing leaves nothing
    behind. Each ``add_scalars`` is in the file when it returns (written, not fsynced).
    ``close()`` is safe to call twice.

    >>> import tempfile
    >>> w = EventFileWriter(Path(tempfile.mkdtemp()) / "tb")
    >>> w.add_scalars([("val_acc", 0.93, 4, 0.0)])
    1
    >>> w.close(); w.close()
    """

    def __init__(self, logdir: Path, suffix: str = "") -> None:
        self.logdir = Path(logdir)
        self.suffix = suffix
        self._file: IO[bytes] | None = None

    def _open(self) -> IO[bytes]:
        if self._file is None:  # named as TensorBoard's own writer names its files
            self.logdir.mkdir(parents=True, exist_ok=True)
            name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
                    f"{next(_UID)}{self.suffix}")
            self._file = os.fdopen(open_append(self.logdir / name), "ab")  # never through a planted link
            self._file.write(_records([_event(time.time(), 0, b"\x1a\x0dbrain.Event:2")]))
        return self._file

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        self.add_scalars([(tag, float(value), int(step), wall_time or time.time())])

    def add_scalars(self, items: Iterable[tuple[str, float, int, float]]) -> int:
        """Write ``(tag, value, step, wall_time)`` items; return how many were written."""
        events = [_scalar_event(tag, value, step, t) for tag, value, step, t in items]
        if not events:
            return 0
        out = self._open()
        out.write(_records(events))
        out.flush()  # readable (and kept by a crash of this process) once the call returns
        return len(events)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


_UID = itertools.count()


def _varint(n: int) -> bytes:
    """A protocol buffer varint; a negative int64 as its 64-bit two's complement."""
    if 0 <= n < 128:
        return _SMALL[n]
    n &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes([n]) for n in range(128)]


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2) numbered ``tag``."""
    return _varint(tag << 3 | 2) + _varint(len(payload)) + payload


def _summary_head(tag: str) -> bytes:
    """``Event.summary`` (field 5) holding ``Summary.Value{tag (1), simple_value (2, float)}``, up to the
    value's 4 bytes: the same for every value of ``tag`` (a float32 is always 4 bytes long)."""
    head = _HEADS.get(tag)
    if head is None:
        head = _field(5, _field(1, _field(1, tag.encode("utf-8")) + b"\x15" + bytes(4)))[:-4]
        if len(_HEADS) < 4096:
            _HEADS[tag] = head
    return head


_HEADS: dict[str, bytes] = {}
_F32 = struct.Struct("<f").pack
_F64 = struct.Struct("<d").pack


def _float32(value: float) -> bytes:
    try:
        return _F32(value)
    except OverflowError:  # beyond float32: what a protocol buffer float field would hold
        return _F32(math.copysign(math.inf, value))


def _event(wall_time: float, step: int, rest: bytes) -> bytes:
    """An ``Event``: ``wall_time`` (1, double), ``step`` (2, int64) and ``rest`` (encoded fields)."""
    return b"\x09" + _F64(wall_time) + b"\x10" + _varint(step) + rest


def _scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """An ``Event`` of one scalar, ``tag``'s encoding cached."""
    return _event(wall_time, step, _summary_head(tag) + _float32(value))


def _frame_head(size: int) -> bytes:
    """A TFRecord frame's first 12 bytes: ``size`` and the masked CRC of it (cached: events of
    one tag mostly have one size)."""
    head = _FRAME_HEADS.get(size)
    if head is None:
        head = struct.pack("<Q", size)
        head += struct.pack("<I", _masked_crc(head))
        if len(_FRAME_HEADS) < 4096:
            _FRAME_HEADS[size] = head
    return head


_FRAME_HEADS: dict[int, bytes] = {}


def _records(events: list[bytes]) -> bytes:
    """The TFRecord frames of ``events``, one after the other. Their CRCs, a loop over every
    byte, computed for many frames of one size at once with NumPy (~20x fewer Python steps:
    a recording that logs at every batch paid ~8 us of GIL-holding CPU per value for them)."""
    crcs = _masked_crcs(events)
    return b"".join(_frame_head(len(data)) + data + _U32(crc) for data, crc in zip(events, crcs))


_U32 = struct.Struct("<I").pack


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord frames use.

    >>> hex(crc32c(b"123456789"))
    '0xe3069283'
    """
    crc = 0xFFFFFFFF
    table = _CRC
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return ((crc >> 15 | crc << 17) + 0xA282EAD8) & 0xFFFFFFFF


#: frames of one size from which their CRCs are computed together (below: one at a time)
BATCH_CRC_MIN = 32


def _masked_crcs(datas: list[bytes]) -> list[int]:
    """``[_masked_crc(d) for d in datas]``: byte by byte across all frames of one length at once.

    >>> datas = [b"", b"a", b"123456789"] + [bytes([i, 7, i * 3 % 256]) for i in range(100)]
    >>> _masked_crcs(datas) == [_masked_crc(d) for d in datas]
    True
    """
    out = [0] * len(datas)
    sizes: dict[int, list[int]] = {}
    for i, data in enumerate(datas):
        sizes.setdefault(len(data), []).append(i)
    for size, at in sizes.items():
        if len(at) < BATCH_CRC_MIN or size == 0:
            for i in at:
                out[i] = _masked_crc(datas[i])
            continue
        import numpy as np

        table = _np_table()
        rows = np.frombuffer(b"".join([datas[i] for i in at]), dtype=np.uint8).reshape(len(at), size)
        crc = np.full(len(at), 0xFFFFFFFF, dtype=np.uint32)
        for j in range(size):
            crc = table[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> 8)
        crc ^= np.uint32(0xFFFFFFFF)
        masked = ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)  # uint32: wraps as the & 0xFFFFFFFF does
        for i, value in zip(at, masked.tolist()):
            out[i] = value
    return out


@functools.cache
def _np_table() -> Any:
    import numpy as np

    return np.array(_CRC, dtype=np.uint32)


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


def scalar_value(value: Any) -> float | None:
    """A logged value as the float a chart plots (a bool as 0 or 1); None for a string."""
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
        value, x = scalar_value(rec.get("value")), global_step(rec, epochs)
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

    ``folder`` is the replay's ``tb/replay-<id>/`` (``RunLayout.tb_replay``). ``mine`` and ``recorded`` are
    records as ``flor.logs.read_run_logs`` returns them (with their occurrence number ``k``). Returns the
    number of scalars written.
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
