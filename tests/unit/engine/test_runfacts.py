"""flor.engine.runfacts: what a recording notes of its run besides its epochs, into run.json."""

from __future__ import annotations

import json
from pathlib import Path

from sessions import record

from flor.store.trust import verify_run


def test_the_scripts_copy_is_signed_and_late_hyperparameters_reach_run_json_until_the_session_closed(
        tmp_path: Path) -> None:
    session = record(tmp_path, __file__)
    facts, run_json = session.facts, session.run_dir / "run.json"
    meta = json.loads(run_json.read_text())
    copy = session.run_dir / "source" / Path(__file__).name
    assert copy.read_text() == Path(__file__).read_text()  # the copy a replay compares the edit with
    assert facts.source_sha and meta["signature"]  # signed with this home's key, over argv and the copy
    assert verify_run(meta["signature"], meta["argv"], facts.source_sha, session.settings.config_dir) is None

    facts._closed = lambda: False  # as while the run trains: a late hyperparameter is written at once
    facts.hyperparameters({"lr": 0.5})
    assert json.loads(run_json.read_text())["hyperparameters"] == {"lr": 0.5}
    facts._closed = lambda: True  # after the session's own final write, nothing writes run.json again
    facts.hyperparameters({"lr": 0.25})
    assert json.loads(run_json.read_text())["hyperparameters"] == {"lr": 0.5}
