"""A replay says so when ``SkipBlock.end`` leaves out the LR scheduler of the optimizer it
restores (``scripts/plateau.py``).

The recording warns about such a scheduler; the replay said nothing: a worker that starts
mid-run has a fresh scheduler, so a hindsight learning rate differs from the full re-execution
while the replay ended "verified exact". It now notes the scheduler it cannot restore.
"""

from __future__ import annotations

import sys

import pytest

from helpers import Runner, copy_of, said, values

HINDSIGHT = {"    # HINDSIGHT": '    flor.log("lr", opt.param_groups[0]["lr"])'}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """plateau.py recorded as "p" (its scheduler left out of end()), and what the recording said."""
    r = Runner(tmp_path_factory.mktemp("plateau"))
    return r, r.run(r.script("plateau.py"), "--flor", "p")


def test_a_replay_names_the_scheduler_end_was_not_given(recorded, tmp_path):
    r, proc = copy_of(recorded[0], tmp_path), recorded[1]
    assert "was not given `sched`" in proc.stderr
    edited = r.script("plateau.py", HINDSIGHT, dest="hindsight.py")
    r.run(edited, "--flor", "full")
    full = values(r.logs("full"), "record")
    proc = r.run(edited, "--flor", "p", "--replay_flor=2/3", check=False)
    got = values(r.logs("p"), "replay")
    assert got[("lr", 5, None)] != full[("lr", 5, None)]  # the fresh scheduler saw no plateau
    assert "SkipBlock.end('train') is not given `sched`" in proc.stderr, proc.stderr
    assert "this replay cannot restore its state" in proc.stderr
    verdict = proc.stderr.strip().splitlines()[-1]  # not exact: it names what it did not set, with the code
    assert verdict.startswith("flor: replay NOT EXACT:") and "FL201" in verdict and "; not restored: sched" in verdict
    assert proc.returncode == 3 and verdict.endswith("exit status 3 (--flor_lenient keeps 0)")


def test_a_launched_replay_names_it_in_its_merged_verdict(recorded, tmp_path):
    r = copy_of(recorded[0], tmp_path)
    edited = r.script("plateau.py", HINDSIGHT, dest="hindsight.py")
    proc = r.flor("replay", "p", "--workers", "3", "--", sys.executable, str(edited), check=False)
    verdict = (proc.stdout + proc.stderr).strip().splitlines()[-1]
    assert verdict.startswith("flor: replay NOT EXACT:") and "; not restored: sched" in verdict and "FL201" in verdict, \
        proc.stdout + proc.stderr
    assert proc.returncode == 3


def test_no_note_when_the_scheduler_is_given(tmp_path):
    r = Runner(tmp_path)
    given = {"net, opt = flor.SkipBlock.end(net, opt)": "net, opt, sched = flor.SkipBlock.end(net, opt, sched)"}
    r.run(r.script("plateau.py", given), "--flor", "p")
    edited = r.script("plateau.py", {**given, **HINDSIGHT}, dest="hindsight.py")
    r.run(edited, "--flor", "full")
    proc = r.run(edited, "--flor", "p", "--replay_flor=2/3")
    assert not said(proc.stderr, "FL201", "FL204") and "not restored" not in proc.stderr
    assert values(r.logs("p"), "replay")[("lr", 5, None)] == values(r.logs("full"), "record")[("lr", 5, None)]
