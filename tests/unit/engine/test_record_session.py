"""flor.engine.record: a RecordSession in the test's process writes a run a replay can use."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

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


def test_a_look_ahead_that_said_no_is_asked_again_after_a_while_or_for_other_blocks(tmp_path: Path) -> None:
    """A loop of short epochs at the default budget: after the look-ahead (whether the next epoch may be
    checkpointed) said no, the next epochs that run the same blocks are not asked within
    LOOKAHEAD_EVERY_S; one that runs another block is, and so is the first after that time."""
    import time

    from sessions import isolated, script_copy, settings

    from flor.engine.record import LOOKAHEAD_EVERY_S, RecordSession

    asked: list[int] = []

    def no(blocks, epoch, **kw) -> bool:
        asked.append(epoch)
        return False

    with isolated(script_copy(tmp_path, __file__)) as made:
        session = RecordSession(settings(tmp_path, "record"))
        made.append(session)
        session.checkpoints.policy.may_be_due = no  # type: ignore[method-assign]
        session.loop_frame, session.loop_wrapper = sys._getframe(), None
        net = torch.nn.Linear(2, 2)
        for epoch in session.iterate(range(40)):
            for name in ("train", "eval") if epoch == 20 else ("train",):
                session.step_into(name, False)
                session.end((net,))
            if epoch == 30:
                time.sleep(LOOKAHEAD_EVERY_S * 1.5)
        session.close()
    # epoch 0 is checkpointed (its end asks for epoch 1); 21 ran "eval" too; 31 came after the pause
    assert asked[0] == 1 and 21 in asked and 22 in asked and 31 in asked
    assert len(asked) <= 8, asked


def test_the_loops_variables_wait_for_an_epoch_the_budget_allows_after_the_first_checkpoint(tmp_path: Path) -> None:
    """The default budget, epochs far shorter than a checkpoint: the first checkpoint is taken whatever
    it costs, and does not count as a measurement; the look-ahead still asks the budget for the next
    one (as ``due`` will), so the loop's variables are not noted after every epoch until a second
    checkpoint (they were: 0.14 s of noting over 0.66 s of training in a block-per-iteration loop)."""
    from sessions import isolated, script_copy, settings

    from flor.engine.record import RecordSession

    with isolated(script_copy(tmp_path, __file__)) as made:
        session = RecordSession(settings(tmp_path, "record"))
        made.append(session)
        session.loop_frame, session.loop_wrapper = sys._getframe(), None
        net, step = torch.nn.Linear(2, 2), 0
        for _ in session.iterate(range(200)):
            session.step_into("train", False)
            step += 1
            session.end((net,))
        session.close()
    state = session.run_dir / "logs" / "state.jsonl"
    noted = [json.loads(line)["epoch"] for line in state.read_text().splitlines()] if state.exists() else []
    assert session.checkpoints.policy.checkpointed[0] == 0
    assert len(noted) <= len(session.checkpoints.policy.checkpointed) + 2, noted


def test_a_block_per_iteration_whose_checks_alone_exceed_the_budget_says_so(tmp_path: Path, capsys) -> None:
    """A 60,000-iteration loop of a tiny model, a block per iteration, at the default budget took +20%
    over plain while its exit line said 3.2% charged against a 1% budget, and nothing told the user why:
    the checks every block run pays are never thinned. Past PER_RUN_MIN runs the exit says FL122 with
    the fix; a loop of a few epochs does not."""
    from sessions import isolated, script_copy, settings

    from flor.engine.record import RecordSession
    from helpers import said
    from flor.policy import PER_RUN_MIN

    def loop(epochs: int) -> str:
        with isolated(script_copy(tmp_path, __file__)) as made:
            session = RecordSession(settings(tmp_path, "record"))
            made.append(session)
            session.loop_frame, session.loop_wrapper = sys._getframe(), None
            net = torch.nn.Linear(2, 2)
            for _ in session.iterate(range(epochs)):
                session.step_into("train", False)
                session.end((net,))  # nothing between: the checks are most of each run
            session.close()
        return capsys.readouterr().err

    assert said(loop(PER_RUN_MIN + 200), "FL122", "docs/loops.md#iteration-loops-nanogpt")
    assert not said(loop(40), "FL122")
