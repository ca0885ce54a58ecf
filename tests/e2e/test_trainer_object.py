"""A ``Trainer`` object given whole to ``SkipBlock.end`` replays exactly, its DataLoader included
(``scripts/trainer_object.py``).

Restoring an object in place set every attribute again, even one restored in place: a
DataLoader raises ``ValueError: dataset attribute should not be set after DataLoader is
initialized`` on that, so every replay of such a recording failed (exit 2) although the
recording had gone through. And a loader with persistent workers keeps its live iterator
(``_iterator``, holding a generator object) between epochs: capturing it failed every
checkpoint of the recording, so a replay re-executed every epoch.
"""

from __future__ import annotations

import pytest

from helpers import Runner, values

HINDSIGHT = {"            # HINDSIGHT": '            flor.log("wnorm", self.model[0].weight.norm().item())\n'
                                      '            flor.log("step", self.step)\n'
                                      '            flor.log("lr", self.sched.get_last_lr()[0])\n'
                                      '            flor.log("last_loss", self.losses[-1])'}
NAMES = {"wnorm", "step", "lr", "last_loss"}


@pytest.mark.parametrize("workers,loader_workers", [(1, 0), (2, 0), (2, 2)])
def test_a_trainer_object_with_a_dataloader_replays_exactly(tmp_path, workers, loader_workers):
    r = Runner(tmp_path)
    args = ["--loader_workers", str(loader_workers)]
    base = r.script("trainer_object.py")
    proc = r.run(base, *args, "--flor", "t")
    assert "checkpointed 4 of 4 epochs" in proc.stderr, proc.stderr
    edited = r.script("trainer_object.py", HINDSIGHT, dest="hindsight.py")
    r.run(edited, *args, "--flor", "full")  # the full re-execution of the edited script
    full = {k: v for k, v in values(r.logs("full"), "record").items() if k[0] in NAMES}
    assert len(full) == 4 * len(NAMES)
    for pid in range(workers):
        proc = r.run(edited, *args, "--flor", "t", f"--replay_flor={pid}/{workers}")
        assert "replay verified exact" in proc.stderr, proc.stderr
        assert ", 0 re-executed without a checkpoint" in proc.stderr, proc.stderr
    got = {k: v for k, v in values(r.logs("t"), "replay").items() if k[0] in NAMES}
    assert got == full
