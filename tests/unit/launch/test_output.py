"""flor.launch.output: what ``flor replay`` shows of its workers' output: progress-bar redraws
are not lines, a note is shown once, a worker's own summary not at all.
"""

from __future__ import annotations

import pytest

from flor.launch.output import WorkerOutput, clean

# -- flor replay output -----------------------------------------------------------------------

@pytest.mark.parametrize("line, shown", [
    ("epoch 3 acc 0.5\n", "epoch 3 acc 0.5"),
    ("\repochs:   0%|          | 0/8 [00:00<?, ?it/s]\repochs:  12%|#2        | 1/8 [00:00<00:01, 6.1it/s]\n", None),
    ("\repochs: 3it [00:00, 82.43it/s, loss=0.3]epoch 3 acc 0.5\n", "epoch 3 acc 0.5"),
    ("\repoch 4:   6%|6         | 1/16 [00:00<00:00, 532.75it/s]\x1b[A\n", None),
    ("\n", None),
    ("loading 100%\n", "loading 100%"),
], ids=["plain", "redraws", "bar-then-print", "nested-bar", "blank", "percent-not-a-bar"])
def test_progress_bar_redraws_are_not_lines(line, shown):
    assert clean(line) == shown


def test_notes_once_and_no_worker_summary():
    said: set[str] = set()
    w0, w1 = WorkerOutput("R1", said), WorkerOutput("R1", said)
    assert w0.show("flor: the script changed\n") == "flor: the script changed"
    assert w1.show("flor: the script changed\n") is None
    assert w1.show("flor: replay R1 of toy run X, worker 1/2: epochs 3-5\n") is None
    assert w1.show("  logs: 3 values\n") is None
    assert w1.show("flor: replay verified exact: 3 blocks restored\n") is None
    assert w1.show("after the summary\n") == "after the summary"
    assert w0.notes() == {"the script changed"}
