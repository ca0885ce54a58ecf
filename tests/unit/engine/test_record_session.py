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


def test_the_loops_variables_are_noted_only_before_an_epoch_a_worker_may_start_at(tmp_path: Path) -> None:
    """A worker starts at epoch 0 or at a checkpointed one: with every=2 (epochs 0, 2 of 4) the loop's
    variables are noted after epoch 1 only; a block the policy would checkpoint at an epoch they were
    not noted before is not (its worker could not set them), and the exit line counts it skipped."""
    from sessions import isolated, script_copy, settings, train

    from flor.engine.record import RecordSession

    def checkpointed(session: RecordSession) -> list[int]:
        return sorted(int(p.stem) for p in session.run_dir.glob("checkpoints/train/*.json"))

    with isolated(script_copy(tmp_path, __file__)) as made:
        session = RecordSession(settings(tmp_path, "record", every=2))
        made.append(session)
        train(session)
        session.close()
    state = [json.loads(line) for line in (session.run_dir / "logs" / "state.jsonl").read_text().splitlines()]
    assert [line["epoch"] for line in state if "vars" in line] == [1]
    assert checkpointed(session) == [0, 2]

    with isolated(script_copy(tmp_path, __file__)) as made:
        session = RecordSession(settings(tmp_path, "record", overhead=1.0))  # the budget allows every epoch ...
        made.append(session)
        session.checkpoints.policy.may_be_due = lambda *args, **kw: False  # type: ignore[method-assign]
        train(session)  # ... but no epoch after 0 was noted before
        session.close()
    assert not (session.run_dir / "logs" / "state.jsonl").exists() or \
        "vars" not in (session.run_dir / "logs" / "state.jsonl").read_text()
    assert checkpointed(session) == [0] and session.checkpoints.policy.skipped == [1, 2, 3]
