"""flor.export.points: the values a tracker gets from a run, one per (key, step), hindsight marked
(a hand-made store)."""

from __future__ import annotations

from pathlib import Path

from helpers import fake_run
from flor.export.points import points_of


def test_step_is_the_values_own_else_its_epoch_and_hindsight_is_marked(tmp_path: Path) -> None:
    store = fake_run(tmp_path, [{"name": "acc", "value": 0.5, "epoch": 0}, {"name": "acc", "value": 0.6, "epoch": 1},
                                {"name": "final", "value": 1, "epoch": None, "loop": "after"}],
                     [{"name": "acc", "value": 0.5, "epoch": 0}, {"name": "loss", "value": 2.5, "epoch": 1, "step": 40},
                      {"name": "note", "value": "text", "epoch": 1}, {"name": "ok", "value": True, "epoch": 2}])
    points, collapsed = points_of(store, "r1")
    got = {(p.key, p.step): (p.value, p.hindsight) for p in points}
    assert got == {("acc", 0): (0.5, False), ("acc", 1): (0.6, False), ("final", 3): (1.0, False),
                   ("loss", 40): (2.5, True), ("ok", 2): (1.0, True)}  # strings are no metric
    assert collapsed == 0


def test_values_sharing_a_key_and_step_are_collapsed_and_counted(tmp_path: Path) -> None:
    store = fake_run(tmp_path, [{"name": "acc", "value": 0.1, "epoch": 0}, {"name": "acc", "value": 0.2, "epoch": 0}],
                     [])
    points, collapsed = points_of(store, "r1", prefix="flor/")
    assert [(p.key, p.step, p.value) for p in points] == [("flor/acc", 0, 0.1)] and collapsed == 1
