"""flor.analysis.compare: runs grouped by hyperparameters, a metric's final, best or epoch value,
and the statistics computed by hand, on hand-made stores.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flor.analysis import compare
from flor.analysis.compare import Group, render
from flor.store.runmeta import FORMAT as RUN_FORMAT


def fake_run(home: Path, name: str, run: str, hp: dict, values: dict[str, list], *, status: str = "finished",
             replay: dict[str, list] | None = None) -> Path:
    """A run folder as a recording leaves it: run.json and logs (one value per epoch)."""
    d = home / name / "runs" / run
    (d / "logs").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"name": name, "run": run, "status": status, "hyperparameters": hp,
                                            "format": RUN_FORMAT}))

    def lines(vals: dict[str, list], t0: float) -> str:
        return "".join(json.dumps({"name": n, "value": v, "epoch": e, "step": None, "block": None, "t": t0 + e}) + "\n"
                       for n, vs in vals.items() for e, v in enumerate(vs))

    (d / "logs" / "record.jsonl").write_text(lines(values, 0))
    if replay:
        (d / "logs" / "replay-r1-0.jsonl").write_text(lines(replay, 100))
    return d


# -- statistics -----------------------------------------------------------------------------------

def test_group_statistics_by_hand():
    g = Group(("x",), [])
    g.runs = [type("R", (), {"value": v})() for v in (1.0, 2.0, 4.0)]
    assert g.n == 3 and g.mean == pytest.approx(7 / 3)
    # sample std: sqrt(((1-7/3)^2 + (2-7/3)^2 + (4-7/3)^2) / (3-1)) = sqrt(7/3)
    assert g.std == pytest.approx(math.sqrt(7 / 3)) and (g.min, g.max) == (1.0, 4.0)
    g.runs = g.runs[:1]
    assert g.std is None  # one run has no sample std


@pytest.fixture
def store(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    fake_run(home, "sw", "r1", {"lr": 0.1, "seed": 0}, {"loss": [3.0, 2.0, 1.0]})
    fake_run(home, "sw", "r2", {"lr": 0.1, "seed": 1}, {"loss": [3.0, 1.5, 2.0]})
    fake_run(home, "sw", "r3", {"lr": 0.5, "seed": 0}, {"loss": [4.0, 0.5, 0.7]},
             replay={"loss": [4.0, 0.5, 0.6], "gnorm": [9.0, 8.0, 7.0]})
    fake_run(home, "sw", "r4", {"lr": 0.5, "seed": 1}, {"loss": [4.0, 0.9]}, status="crashed")
    return home


def test_compare_final_best_and_epoch(store):
    c = compare(["sw"], by=["lr"], metric="loss", home=store)
    assert c.goal == "min" and [g.key for g in c.groups] == [(0.5,), (0.1,)]  # lower loss ranks first
    best, worst = c.groups
    assert best.values == [0.6]  # r3's replay replaced the recorded 0.7; crashed r4 is left out
    assert worst.values == [1.0, 2.0] and worst.mean == 1.5 and worst.std == pytest.approx(math.sqrt(0.5))
    assert c.excluded == [("r4", "status crashed")]
    assert compare(["sw"], by=["lr"], metric="loss", at="best", home=store).groups[1].values == [1.0, 1.5]
    assert compare(["sw"], by=["lr"], metric="loss", at=0, home=store).groups[0].values == [3.0, 3.0]
    with_crashed = compare(["sw"], by=["lr"], metric="loss", home=store, unfinished=True)
    assert sorted(with_crashed.groups[0].values) == [0.6, 0.9]
    assert compare(["sw"], by=["lr"], metric="loss", goal="max", home=store).groups[0].key == (0.1,)
    text = render(c).splitlines()
    assert text[0] == "loss: final value of each run, grouped by lr (lower is better); 3 runs"
    assert text[2].split() == ["1", "0.5", "1", "0.6", "±", "-", "0.6", "0.6"]
    assert text[3].split() == ["2", "0.1", "2", "1.5", "±", "0.70711", "1", "2"]


def test_compare_by_two_hyperparameters(store):
    c = compare(["sw"], by=["lr", "seed"], metric="loss", home=store)
    assert sorted(g.key for g in c.groups) == [(0.1, 0), (0.1, 1), (0.5, 0)]
