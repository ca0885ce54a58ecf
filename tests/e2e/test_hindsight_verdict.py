"""The verdict is the sum of what makes a value differ from a full run of the edited script, end
to end: a hindsight log in a function the block calls runs without ``probed=True``; hindsight code
that samples from torch's global generator, or a log that never runs, is named with its code and
the replay exits 3; a generator the script never draws from is not reported."""

from __future__ import annotations

import json
import sys

import pytest

from helpers import Runner, values

IN_TRAIN = {"        # IN-TRAIN": '        flor.log("loss", loss.item(), step=i)'}
SAMPLES = {"    # OUTER": '    flor.log("val", estimate_loss())'}
NEVER = {"        # IN-TRAIN": '        if epoch > 99:\n            flor.log("late", loss.item())'}
FIRST = {"        # IN-TRAIN": '        if epoch == 0:\n            flor.log("first", loss.item())'}  # worker 0's segment


@pytest.fixture(scope="module")
def called(tmp_path_factory) -> Runner:
    r = Runner(tmp_path_factory.mktemp("called"))
    r.run(r.script("called.py"), "--flor", "c", env=r.env(FLOR_EVERY="3"))  # sparse: epochs 0 and 3 checkpointed
    return r


def _full(r: Runner, edits: dict, name: str) -> dict:
    r.run(r.script("called.py", edits, dest=f"{name}.py"), "--flor", name)
    return values(r.logs(name), "record")


def _replay(r: Runner, script: str, *flags: str):
    proc = r.run(r.cwd / script, "--flor", "c", "--replay_flor", *flags, check=False)
    replay = proc.stderr.split("flor: replay ")[1].split()[0]
    summary = next((r.home / "c" / "runs").glob(f"*/logs/replay-{replay}-0.summary.json"))
    return proc, values([x for x in r.logs("c") if x["replay"] == replay]), json.loads(summary.read_text())


def test_a_log_in_a_function_the_block_calls_needs_no_flag(called):
    full = _full(called, IN_TRAIN, "in_train")
    proc, got, summary = _replay(called, "in_train.py")
    assert proc.returncode == 0 and got == full and len(full) == 16, proc.stderr
    assert "FL339 block 'train' is re-executed" in proc.stderr and "line 33, in train()" in proc.stderr
    assert "FL324" not in proc.stderr, proc.stderr  # NumPy's and Python's generators: never drawn from
    assert summary["verdict"] == "verified exact" and summary["conditions"] == []


def test_hindsight_code_that_samples_is_not_verified_exact(called):
    full = _full(called, SAMPLES, "samples")
    proc, got, summary = _replay(called, "samples.py")
    assert got != full  # restoring epoch 3 puts back the recording's training: the values are not a full run's
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 3 and last.startswith("flor: replay NOT EXACT") and "FL325" in last, proc.stderr
    assert last.endswith("exit status 3 (--flor_lenient keeps 0)")
    assert summary["verdict"] == "not exact" and [c["code"] for c in summary["conditions"]] == ["FL325"]


def test_a_hindsight_log_that_never_ran_is_named_where_it_sits(called):
    called.script("called.py", NEVER, dest="never.py")
    proc, got, summary = _replay(called, "never.py")
    assert got == {} and proc.returncode == 3, proc.stderr
    assert "FL338 the hindsight flor.log('late', ...) at line 34, in train() never ran" in proc.stderr
    assert [c["code"] for c in summary["conditions"]] == ["FL338"]


def test_a_launch_names_a_new_log_none_of_its_workers_ran_and_not_one_that_ran_in_one(called):
    """A segment cannot tell a log that never runs from one another segment runs; the launch's merged
    summary can: ``late`` ran in neither worker (FL338, exit 3); ``first`` only in worker 0's (no FL338)."""
    called.script("called.py", NEVER, dest="never.py")
    called.script("called.py", FIRST, dest="first.py")
    never = called.flor("replay", "c", "--workers", "2", "--", sys.executable, "never.py", check=False)
    out = never.stdout + never.stderr
    assert never.returncode == 3 and "FL338 the hindsight flor.log('late', ...) at line 34, in train() never ran in " \
        "any worker of this replay" in out, out
    first = called.flor("replay", "c", "--workers", "2", "--", sys.executable, "first.py", check=False)
    out = first.stdout + first.stderr
    assert first.returncode == 0 and "FL338" not in out and "verified exact" in out, out
