"""flor.store.runlogs: a run's logs read in epoch order across many replay workers."""

from __future__ import annotations

import json

from flor.store.runlogs import read_run_logs


def test_many_workers_merge_in_epoch_order(tmp_path):
    """Worker 10's records come after worker 9's, not after worker 1's: one ordered view."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for w in range(12):
        (logs / f"replay-r-{w}.jsonl").write_text(json.dumps({"name": "x", "value": w, "epoch": w, "step": None}) + "\n")
    assert [x["epoch"] for x in read_run_logs(tmp_path, "run")] == list(range(12))
