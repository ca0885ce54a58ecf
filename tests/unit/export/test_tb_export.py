"""flor.export.tensorboard: a new event file in the script's logdir, read back with TensorBoard's own
reader; a (tag, step) the folder holds already (the script's SummaryWriter) is not written again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers import fake_run, note_trackers
from flor.errors import ConfigError
from flor.export import export_run
from flor.logs.tensorboard import EventFileWriter


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: sorted((e.step, e.value) for e in acc.Scalars(tag)) for tag in acc.Tags()["scalars"]}


def test_only_what_the_logdir_lacks_is_written_once(tmp_path: Path) -> None:
    store = fake_run(tmp_path / "home", [{"name": "acc", "value": 0.5, "epoch": 0}, {"name": "acc", "value": 0.75, "epoch": 1}],
                     [{"name": "wnorm", "value": 3.5, "epoch": 0}, {"name": "wnorm", "value": 3.25, "epoch": 1}])
    logdir = tmp_path / "tb-logs"
    script = EventFileWriter(logdir)  # what the script's SummaryWriter wrote while recording
    script.add_scalars([("acc", 0.5, 0, 1.0), ("acc", 0.75, 1, 2.0)])
    script.close()
    mine = tmp_path / "config"
    note_trackers(store, {"tensorboard": {"logdirs": [str(logdir)]}}, mine)  # as recorded: signed
    first, second = (export_run(store, "r1", "tensorboard", config_dir=mine),
                     export_run(store, "r1", "tensorboard", config_dir=mine))
    assert (len(first.written), first.present, len(second.written), second.present) == (2, 2, 0, 4)
    assert scalars(logdir) == {"acc": [(0, 0.5), (1, 0.75)], "wnorm": [(0, 3.5), (1, 3.25)]}
    assert len(list(logdir.glob("*.flor"))) == 1


def test_without_a_recorded_logdir_the_error_asks_for_one(tmp_path: Path) -> None:
    store = fake_run(tmp_path, [{"name": "acc", "value": 0.5, "epoch": 0}], [])
    with pytest.raises(ConfigError, match="--logdir"):
        export_run(store, "r1", "tensorboard")
    assert len(export_run(store, "r1", "tensorboard", options={"logdir": tmp_path / "tb"}).written) == 1


def test_a_planted_logdir_gets_no_file(tmp_path: Path) -> None:
    """run.json changed to name a folder outside the user's logs: no event file is written there
    unless the user names the folder (--logdir) or trusts the run after looking (--trust)."""
    store = fake_run(tmp_path / "home", [{"name": "acc", "value": 0.5, "epoch": 0}], [])
    target = tmp_path / "somebody-elses"
    target.mkdir()
    note_trackers(store, {"tensorboard": {"logdirs": [str(target)]}})  # unsigned
    with pytest.raises(ConfigError, match="not signed.*--logdir DIR"):
        export_run(store, "r1", "tensorboard", config_dir=tmp_path / "config")
    assert list(target.iterdir()) == []
    assert len(export_run(store, "r1", "tensorboard", config_dir=tmp_path / "config",
                          options={"logdir": tmp_path / "mine"}).written) == 1
    assert list(target.iterdir()) == []
