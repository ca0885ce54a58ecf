"""A replay says so when code outside the blocks changes the model in place where the recorded
script did not (``scripts/outside_changes.py``, ``flor.watch.outside.OutsideChanges``).

A hindsight line that computes a loss on a model left in training mode moves BatchNorm's
running statistics (a parametrized spectral_norm's vectors, the weights if it steps an
optimizer). A full run of the edited script trains on from the changed model; a replay restores
the recording's state at the next block, so its values are the recording's training, not a full
run's, and it said "verified exact" with nothing else. The recording now notes, per block run,
which tensors of the modules given to ``end()`` the code between blocks changed and how often;
a replay that finds others names them in a note and in the verdict.
"""

from __future__ import annotations

import json

import pytest

from helpers import Runner, copy_of

PROBE = {"    # HINDSIGHT": '    with torch.no_grad():\n'
                            '        flor.log("probe", ((net(X) - Y) ** 2).mean().item())'}
SAID = "changed outside the blocks, unlike the recording: end() object 0: 1.num_batches_tracked"


@pytest.fixture(scope="module")
def forward_recorded(tmp_path_factory) -> Runner:
    """outside_changes.py recorded with its own forward outside the blocks (--outer-forward)."""
    r = Runner(tmp_path_factory.mktemp("outer_forward"))
    r.run(r.script("outside_changes.py"), "--outer-forward", "--flor", "o")
    return r


def _verdict(proc) -> str:
    return proc.stderr.strip().splitlines()[-1]


def test_a_hindsight_forward_in_training_mode_is_named(tmp_path):
    r = Runner(tmp_path)
    r.run(r.script("outside_changes.py"), "--flor", "o")
    proc = r.run(r.script("outside_changes.py", PROBE, dest="hindsight.py"), "--flor", "o", "--replay_flor",
                 check=False)
    assert SAID in _verdict(proc) and "FL328" in _verdict(proc) and proc.returncode == 3, proc.stderr
    assert _verdict(proc).startswith("flor: replay NOT EXACT")
    assert "code outside the blocks changed end() object 0: 1.num_batches_tracked" in proc.stderr
    summary = next(r.home.glob("o/runs/*/logs/replay-*.summary.json"))
    assert "end() object 0: 1.num_batches_tracked" in json.loads(summary.read_text())["outside"]


def test_the_scripts_own_forward_is_not_named_but_a_second_one_is(forward_recorded, tmp_path):
    r = copy_of(forward_recorded, tmp_path)
    state = [json.loads(line) for line in next(r.home.glob("o/runs/*/logs/state.jsonl")).read_text().splitlines()]
    assert [s["epoch"] for s in state if "outside" in s] == [1, 2, 3]  # what epochs 0-2's code did after end()
    plain = r.run(r.script("outside_changes.py", {"    # HINDSIGHT": '    flor.log("n", 1)'}, dest="plain.py"),
                  "--outer-forward", "--flor", "o", "--replay_flor")
    assert "FL328" not in plain.stderr and _verdict(plain).startswith("flor: replay verified exact:")
    probed = r.run(r.script("outside_changes.py", PROBE, dest="hindsight.py"), "--outer-forward", "--flor", "o",
                   "--replay_flor", check=False)
    assert SAID in _verdict(probed) and probed.returncode == 3, probed.stderr  # the script's and a hindsight forward
