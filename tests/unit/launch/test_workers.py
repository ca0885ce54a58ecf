"""flor.launch.workers: a worker's progress, read from its epoch marks (a torn last line too)."""

from __future__ import annotations

import json

from flor.launch.workers import WorkerState
from flor.plan import make_plan


def test_progress_is_read_from_epoch_marks(tmp_path):
    marks = tmp_path / "m.jsonl"
    s = WorkerState(1, make_plan(10, 1, 2, {4}))  # initialization epoch 4, segment 5-9
    lines = [{"mark": "start", "t": 1.0}, {"mark": "epoch", "epoch": 4, "init": True, "t": 2.0},
             {"mark": "epoch", "epoch": 5, "init": False, "t": 3.0}, {"mark": "epoch", "epoch": 6, "init": False, "t": 4.0}]
    marks.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"mark": "ep')  # a torn last line
    s.read_marks(marks)
    assert (s.done_epochs, s.completed, s.first_epoch) == (1, 2, 2.0)
    with open(marks, "a") as fh:
        fh.write('och", "epoch": 7, "init": false, "t": 5.0}\n{"mark": "after", "t": 6.0}\n')
    s.read_marks(marks)
    assert (s.done_epochs, s.completed) == (3, 4)
