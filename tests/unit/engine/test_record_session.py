"""flor.engine.record: a RecordSession in the test's process writes a run a replay can use."""

from __future__ import annotations

import json
from pathlib import Path

from sessions import record

from flor.store.runlogs import read_run_logs


def test_a_recording_keeps_a_checkpoint_an_epoch_and_its_logged_values(tmp_path: Path) -> None:
    session = record(tmp_path, __file__)
    meta = json.loads((session.run_dir / "run.json").read_text())
    assert meta["status"] == "finished" and meta["epochs_done"] == 4 and meta["loop_ended"] == "completed"
    manifests = sorted(session.run_dir.glob("checkpoints/*/*.json"))
    assert len(manifests) == 4, manifests
    logged = [r for r in read_run_logs(session.run_dir, session.run) if r["source"] == "record"]
    assert [(r["name"], r["epoch"]) for r in logged] == [("loss", e) for e in range(4)]
    assert (session.run_dir / "source").exists()  # the script's copy: a replay compares the edit with it
