"""flor.it wrapped in another iterator (``scripts/wrapped.py``): ``enumerate(flor.it(...))``,
``zip(flor.it(range(E)), schedule)``, ``itertools.islice(flor.it(...), n)``.

A replay worker that starts mid-run skips the epochs before its own inside flor.it, where the
wrapper does not see it: enumerate counted from 0 at the worker's first epoch and zip paired it
with the schedule's first learning rate, and the worker said "verified exact" on a hindsight
``i`` of 2 where a full run logs 4 (or diverged in its blocks, blaming an object not given to
end()). islice stops pulling from flor.it after its last item, so the recording never counted
its last epoch and every replay silently left it out. The recording now names the wrapper and
the fix (``flor.it(enumerate(...))``), and a worker that starts mid-run behind enumerate or zip
ends DIVERGED, saying why (``flor.source.blocks.loop_wrapper``).
"""

from __future__ import annotations

import pytest

from helpers import Runner, values

LOOP = "for i, epoch in enumerate(flor.it(range(args.epochs))):  # LOOP"
HINDSIGHT = {"    # HINDSIGHT": '    flor.log("i", i)\n    flor.log("lr", lr)'}
INSIDE = {LOOP: "for i, epoch in flor.it(enumerate(range(args.epochs))):"}


def test_a_worker_that_starts_mid_run_behind_enumerate_says_it_diverged(tmp_path):
    r = Runner(tmp_path)
    proc = r.run(r.script("wrapped.py"), "--flor", "w")
    assert "flor.it(...) is wrapped in enumerate(): a replay worker that starts mid-run" in proc.stderr, proc.stderr
    assert "put the wrapper inside instead: `for ... in flor.it(enumerate(...))`" in proc.stderr
    edited = r.script("wrapped.py", HINDSIGHT, dest="hindsight.py")
    proc = r.run(edited, "--flor", "w", "--replay_flor", "1/2", check=False)
    assert proc.returncode == 3, proc.stderr
    assert "DIVERGED loop: flor.it(...) is wrapped in enumerate()" in proc.stderr, proc.stderr
    assert "or replay with --flor_strong" in proc.stderr
    proc = r.run(edited, "--flor", "w", "--replay_flor", "1/2", "--flor_strong")
    assert "replay verified exact" in proc.stderr, proc.stderr  # every epoch from 0: enumerate counts them all


def test_the_wrapper_put_inside_flor_it_replays_exactly_from_mid_run(tmp_path):
    r = Runner(tmp_path)
    proc = r.run(r.script("wrapped.py", INSIDE), "--flor", "w")
    assert "FL209" not in proc.stderr, proc.stderr
    edited = r.script("wrapped.py", {**INSIDE, **HINDSIGHT}, dest="hindsight.py")
    r.run(edited, "--flor", "full")
    full = values(r.logs("full"), "record")
    assert [full[("i", e, None)] for e in range(4)] == [0, 1, 2, 3]
    assert r.replay_workers(edited, "w", 2) == full


@pytest.mark.parametrize("loop, wrapper", [
    ("for epoch, i in zip(flor.it(range(args.epochs)), range(9)):", "zip"),
    ("import itertools\nfor i in itertools.islice(flor.it(range(9)), args.epochs):", "islice"),
])
def test_the_recording_names_zip_and_islice(tmp_path, loop, wrapper):
    r = Runner(tmp_path)
    proc = r.run(r.script("wrapped.py", {LOOP: loop}), "--flor", "w")
    assert f"flor.it(...) is wrapped in {wrapper}()" in proc.stderr, proc.stderr
