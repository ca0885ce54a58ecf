"""flor.export.tensorboard: a new event file in the script's logdir, read back with TensorBoard's own
reader; a (tag, step) the folder holds already (the script's SummaryWriter) is not written again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers import fake_run
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
    run_json = store.run_path("r1", "run.json")
    run_json.write_text(json.dumps({**json.loads(run_json.read_text()),
                                    "trackers": {"tensorboard": {"logdirs": [str(logdir)]}}}))
    first, second = export_run(store, "r1", "tensorboard"), export_run(store, "r1", "tensorboard")
    assert (len(first.written), first.present, len(second.written), second.present) == (2, 2, 0, 4)
    assert scalars(logdir) == {"acc": [(0, 0.5), (1, 0.75)], "wnorm": [(0, 3.5), (1, 3.25)]}
    assert len(list(logdir.glob("*.flor"))) == 1


def test_without_a_recorded_logdir_the_error_asks_for_one(tmp_path: Path) -> None:
    store = fake_run(tmp_path, [{"name": "acc", "value": 0.5, "epoch": 0}], [])
    with pytest.raises(ConfigError, match="--logdir"):
        export_run(store, "r1", "tensorboard")
    assert len(export_run(store, "r1", "tensorboard", options={"logdir": tmp_path / "tb"}).written) == 1
