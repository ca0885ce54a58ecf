"""flor.logs.tensorboard: the event files flor writes itself, framed and checksummed as
TensorBoard's own reader expects; replay events leave out identical values, one file per worker.
"""

from __future__ import annotations

import math
import struct

import pytest

from flor.logs.tensorboard import EventFileWriter, global_step, write_replay_events
from flor.store.runlogs import retire_worker_files

# -- TensorBoard ----------------------------------------------------------------------------------

@pytest.mark.parametrize("rec, x", [
    ({"epoch": 3, "step": None}, 3),
    ({"epoch": 3, "step": 1200}, 1200),
    ({"epoch": 3, "step": 7.0}, 7),
    ({"epoch": 3, "step": "val"}, 3),
    ({"epoch": 3, "step": True}, 3),
    ({"epoch": None, "loop": "before"}, 0),
    ({"epoch": None, "loop": "after"}, 10),
])
def test_global_step(rec, x):
    assert global_step(rec, epochs=10) == x


def test_replay_events_leave_out_identical_values(tmp_path):
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    rec = [{"name": "acc", "value": 0.5, "epoch": e, "step": None, "k": 0, "t": 1.0} for e in range(3)]
    mine = [dict(r, value=(0.5 if r["epoch"] < 2 else 0.75)) for r in rec]
    mine += [{"name": "gn", "value": v, "epoch": e, "step": None, "k": 0, "t": 2.0} for e, v in enumerate([1, True])]
    mine += [{"name": "tag", "value": "text", "epoch": 0, "step": None, "k": 0, "t": 2.0}]
    assert write_replay_events(tmp_path / "tb" / "replay-r1", 0, mine, rec, epochs=3) == 3
    ea = ea_mod.EventAccumulator(str(tmp_path / "tb" / "replay-r1"))
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("acc")] == [(2, 0.75)]  # only the value that differs
    assert [(e.step, e.value) for e in ea.Scalars("gn")] == [(0, 1.0), (1, 1.0)]
    assert "tag" not in ea.Tags()["scalars"]


def test_event_writer_appends_and_closes_twice(tmp_path):
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    w = EventFileWriter(tmp_path)
    w.add_scalar("loss", 2.5, step=-1, wall_time=5.0)
    w.add_scalars([("loss", 1e-30, 2**40, 6.0)])
    w.close()
    w.close()
    ea = ea_mod.EventAccumulator(str(tmp_path))
    ea.Reload()
    assert [(e.step, e.value, e.wall_time) for e in ea.Scalars("loss")] == \
        [(-1, 2.5, 5.0), (2**40, pytest.approx(1e-30), 6.0)]


def test_event_files_are_framed_as_tensorboard_frames_them(tmp_path):
    """flor writes TensorBoard's event files itself (importing TensorBoard's writer on the first
    value stalled training, issue #13): every frame's checksums are TensorBoard's own, and
    values past float32, NaN, non-ASCII tags and negative steps read back."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    w = EventFileWriter(tmp_path, suffix=".7")
    assert w.add_scalars([("lössé/τ", 1e300, -5, 1.5), ("nan", float("nan"), 0, 2.0), ("x", -2.25, 2**62, 3.0)]) == 3
    w.close()
    (path,) = tmp_path.iterdir()
    assert path.name.startswith("events.out.tfevents.") and path.name.endswith(".7")
    data, frames = path.read_bytes(), 0
    while data:
        (n,) = struct.unpack("<Q", data[:8])
        assert struct.unpack("<I", data[8:12])[0] == masked_crc32c(data[:8])
        assert struct.unpack("<I", data[12 + n:16 + n])[0] == masked_crc32c(data[12:12 + n])
        data, frames = data[16 + n:], frames + 1
    assert frames == 4  # the file version, then one per value
    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    assert [(e.step, e.value, e.wall_time) for e in ea.Scalars("lössé/τ")] == [(-5, math.inf, 1.5)]
    assert math.isnan(ea.Scalars("nan")[0].value)
    assert [(e.step, e.value) for e in ea.Scalars("x")] == [(2**62, -2.25)]


def test_a_large_batch_is_framed_as_tensorboard_frames_it(tmp_path):
    """Many values in one write take the batched CRC (frames of one size checksummed together):
    each frame's checksums are still TensorBoard's own and every value reads back in order."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    from flor.logs.tensorboard import BATCH_CRC_MIN

    tags = ["loss", "lössé/τ", "a" * 300]  # a tag whose length takes a two-byte varint
    items = [(tags[i % 3], i * 0.37 - 50.0, i * 997 - 3000, 1000.0 + i) for i in range(40 * BATCH_CRC_MIN)]
    w = EventFileWriter(tmp_path)
    assert w.add_scalars(items) == len(items)
    w.close()
    (path,) = tmp_path.iterdir()
    data, frames = path.read_bytes(), 0
    while data:
        (n,) = struct.unpack("<Q", data[:8])
        assert struct.unpack("<I", data[8:12])[0] == masked_crc32c(data[:8])
        assert struct.unpack("<I", data[12 + n:16 + n])[0] == masked_crc32c(data[12:12 + n]), frames
        data, frames = data[16 + n:], frames + 1
    assert frames == 1 + len(items)
    ea = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    ea.Reload()
    for tag in tags:
        want = [(step, pytest.approx(value, rel=1e-6), t) for name, value, step, t in items if name == tag]
        assert [(e.step, e.value, e.wall_time) for e in ea.Scalars(tag)] == want


def test_event_writer_that_writes_nothing_leaves_no_file(tmp_path):
    w = EventFileWriter(tmp_path / "tb", suffix=".3")
    assert w.add_scalars([]) == 0
    w.close()
    assert not (tmp_path / "tb").exists()


def test_replay_events_are_one_file_per_worker_and_retired_with_it(tmp_path):
    rec = [{"name": "acc", "value": 0.5, "epoch": 0, "step": None, "k": 0, "t": 1.0}]
    for worker in (0, 1):
        assert write_replay_events(tmp_path / "tb" / "replay-r1", worker, [dict(rec[0], value=0.6)], rec, epochs=1) == 1
    files = sorted(p.name for p in (tmp_path / "tb" / "replay-r1").iterdir())
    assert len(files) == 2 and [f.rsplit(".", 1)[1] for f in files] == ["0", "1"]
    retire_worker_files(tmp_path, "r1", 1)
    assert [p.name for p in (tmp_path / "tb" / "replay-r1").iterdir()] == [files[0]]
