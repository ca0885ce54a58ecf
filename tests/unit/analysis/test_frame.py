"""flor.analysis.frame: a run's records, the newest replay's value winning and hindsight values
marked (a hand-made store).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flor.analysis import records
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


@pytest.fixture
def store(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    fake_run(home, "sw", "r1", {"lr": 0.1, "seed": 0}, {"loss": [3.0, 2.0, 1.0]})
    fake_run(home, "sw", "r2", {"lr": 0.1, "seed": 1}, {"loss": [3.0, 1.5, 2.0]})
    fake_run(home, "sw", "r3", {"lr": 0.5, "seed": 0}, {"loss": [4.0, 0.5, 0.7]},
             replay={"loss": [4.0, 0.5, 0.6], "gnorm": [9.0, 8.0, 7.0]})
    fake_run(home, "sw", "r4", {"lr": 0.5, "seed": 1}, {"loss": [4.0, 0.9]}, status="crashed")
    return home


def test_newest_replay_wins_and_hindsight_is_marked(store):
    recs = {(r["name"], r["epoch"]): r for r in records("sw", run="r3", home=store, newest=True)}
    assert recs[("loss", 2)]["value"] == 0.6 and recs[("loss", 2)]["source"] == "replay"
    assert not recs[("loss", 2)]["hindsight"]  # the recording had a loss at epoch 2 too
    assert recs[("gnorm", 0)]["hindsight"] and not recs[("loss", 0)]["hindsight"]
