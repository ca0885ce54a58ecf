"""flor.engine.replay: a ReplaySession in the test's process restores every epoch of a recording."""

from __future__ import annotations

import json
from pathlib import Path

from sessions import record, replay


def test_a_whole_replay_restores_every_block_and_gives_the_recorded_values(tmp_path: Path) -> None:
    recorded = record(tmp_path, __file__)
    session, losses = replay(tmp_path, __file__)
    summary = json.loads(session.summary_path.read_text())
    assert summary["verdict"] == "verified exact", summary
    assert summary["counts"]["restored"] == 4 and summary["shared_logs"] == 4 and not summary["log_mismatches"]
    assert summary["findings"] == ["FL326"]  # `loss`, bound in the block and read after it: set as recorded
    logged = [json.loads(line) for line in recorded.layout.record_log.read_text().splitlines()]
    assert losses == [r["value"] for r in logged]  # evaluated after each restored block: the recorded model


def test_a_worker_that_starts_mid_run_restores_the_state_before_its_segment(tmp_path: Path) -> None:
    record(tmp_path, __file__)
    whole, full = replay(tmp_path, __file__)
    second, half = replay(tmp_path, __file__, pid=1, ngpus=2)
    # `losses`, the loop's own list, is set as recorded at the end of epoch 1 (FL320), then grows
    assert half == full and second.plan is not None and second.plan.segment.start == 2
    summary = json.loads(second.summary_path.read_text())
    assert summary["verdict"] == "verified exact" and summary["counts"]["restored"] == 2, summary
    assert "FL320" in summary["findings"], summary
