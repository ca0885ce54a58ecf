"""State in ``collections`` containers and NumPy arrays (``scripts/collections_state.py``): a
``Counter`` and a ``defaultdict(list)`` the block counts and appends in, a NumPy array it sums
into in place, a ``deque`` of recent losses and an ``OrderedDict`` the epoch loop keeps.

They went unnoted: the outer-loop state and a block's noted variables took builtin lists,
tuples and dicts only, so a worker that starts mid-run left the deque empty (a mean of recent
losses over one epoch where a full run averages three), and a replay that restored the block
left the Counter, the array and the defaultdict as they were before it (a batch count of 0,
where a full run has 4, 8, ...), with "verified exact". Small ones of plain data are now noted
and set as recorded, as a list is; what still cannot be (a defaultdict of a lambda) is named.
"""

from __future__ import annotations


import pytest

from helpers import Runner, record_and_full_run, said

HINDSIGHT = {"    # HINDSIGHT": '    flor.log("batches", seen["batches"])\n'
                                '    flor.log("acc_loss", float(acc[0]))\n'
                                '    flor.log("acc_b", float(acc[2]))\n'
                                '    flor.log("n_losses", len(per_batch["loss"]))\n'
                                '    flor.log("best", f"{best[\'epoch\']} {best[\'loss\']:.6f}")'}
NAMES = {"recent", "batches", "acc_loss", "acc_b", "n_losses", "best"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A recording with a checkpoint every 2nd epoch, and the full run of the edited script."""
    r = Runner(tmp_path_factory.mktemp("collections_state"))
    edited, full = record_and_full_run(r, "collections_state.py", HINDSIGHT, NAMES)
    assert [full[("batches", e, None)] for e in range(6)] == [4, 8, 12, 16, 20, 24]
    assert len(full) == 6 * len(NAMES)
    return r, edited, full


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_collections_and_arrays_the_loop_keeps_replay_as_a_full_run(recorded, workers):
    r, edited, full = recorded
    got = r.replay_workers(edited, "r", workers, NAMES)
    assert got == full


def test_the_recording_names_none_of_them(recorded):
    r, _, _ = recorded
    proc = r.run(r.script("collections_state.py"), "--flor", "again")
    assert not said(proc.stderr, "FL201", "FL202", "FL203") and "FL322" not in proc.stderr, proc.stderr


def test_a_defaultdict_of_a_lambda_is_still_named(tmp_path):
    r = Runner(tmp_path)
    script = r.script("collections_state.py", {"per_batch = collections.defaultdict(list)":
                                               "per_batch = collections.defaultdict(lambda: [])"})
    proc = r.run(script, "--flor", "c")
    assert "per_batch" in proc.stderr, proc.stderr
    proc = r.run(script, "--flor", "c", "--replay_flor", "1/2", check=False)
    assert "cannot restore: per_batch" in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 3 and last.startswith("flor: replay NOT EXACT") and "; not restored: per_batch" in last
