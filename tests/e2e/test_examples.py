"""The shipped examples work as the README says: record, replay with a hindsight log (outer
loop and probed), each value equal to a full run of the edited script."""

from __future__ import annotations

import shutil

from helpers import ROOT, Runner, values


def test_cnn_example_hindsight_and_probed(runner: Runner):
    r = runner
    for name in ("cnn.py", "cnn_hindsight.py", "cnn_probed.py"):
        shutil.copy(ROOT / "examples" / name, r.cwd / name)
    args = ["--epochs", "3"]
    r.run(r.cwd / "cnn.py", *args, "--flor", "cnn-demo")
    r.run(r.cwd / "cnn_probed.py", *args, "--flor", "full")  # a full run of the edited script
    outer = r.run(r.cwd / "cnn_hindsight.py", *args, "--flor", "cnn-demo", "--replay_flor",
                  env=r.env(FLOR_REPLAY_ID="outer"))
    assert "replay verified exact" in outer.stderr
    probed = r.run(r.cwd / "cnn_probed.py", *args, "--flor", "cnn-demo", "--replay_flor", "1/2",
                   env=r.env(FLOR_REPLAY_ID="probed"))
    assert "replay verified exact" in probed.stderr and "matched" in probed.stderr
    logs = r.logs("cnn-demo")
    weight = [x for x in logs if x["replay"] == "outer" and x["name"] == "weight_norm"]
    assert [x["epoch"] for x in weight] == [0, 1, 2]
    full = values(r.logs("full"))
    got = values([x for x in logs if x["replay"] == "probed"])
    assert got and all(full[k] == v for k, v in got.items())
    assert {k[0] for k in got} == {"grad_norm", "val_loss", "val_acc"}
