"""Variables a block changes outside the objects given to ``end()`` are set as recorded where a
replay restores the block (``flor.watch.variables.BlockVars``, ``scripts/block_vars.py``).

A step counter, a loss sum, a history, a dict of running metrics, a best value and the last
batch's loss, read after the block: a replay that restored it left them as they were before
it, so hindsight values read from them were wrong (``step`` 0, 4, 8 where a full run has 4, 8,
12), and silently so where the recording had not logged them. The same in a function's locals,
and in a module global a function's block declares ``global`` (``global_step += 1``).
"""

from __future__ import annotations


import pytest

from helpers import Runner, reseal_manifest, said, values

HINDSIGHT = {
    "    # HINDSIGHT\n": '    flor.log("step", step)\n'
                         '    flor.log("n_hist", len(hist))\n'
                         '    flor.log("hist_last", hist[-1])\n'
                         '    flor.log("mean", stats["sum"] / stats["n"])\n'
                         '    flor.log("best", best)\n'
                         '    flor.log("last_loss", loss.item())\n'
                         '    flor.log("seen", seen)\n'
                         '    flor.log("tag", tag)\n',
    "    # HINDSIGHT-FN\n": '    flor.log("batches", batches)\n'
                            '    flor.log("correct", correct)\n'
                            '    flor.log("evals", evals)\n',
    'step, hist, stats, best = 0, [], {"n": 0, "sum": 0.0}, float("inf")':
        'step, hist, stats, best = 0, [], {"n": 0, "sum": 0.0}, float("inf")\ntag = "edited"',
}
NAMES = {"step", "n_hist", "hist_last", "mean", "best", "last_loss", "seen", "tag", "batches", "correct", "evals"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One recording with a checkpoint every 2nd epoch, and the full run of the edited script."""
    r = Runner(tmp_path_factory.mktemp("bv"))
    env = r.env(FLOR_EVERY="2")
    r.run(r.script("block_vars.py", {"step, hist, stats": 'tag = "base"\nstep, hist, stats'}),
          "--flor", "b", env=env)
    edited = r.script("block_vars.py", HINDSIGHT, dest="hindsight.py")
    r.run(edited, "--flor", "full", env=env)
    full = {k: v for k, v in values(r.logs("full"), "record").items() if k[0] in NAMES}
    assert len(full) == 6 * len(NAMES)
    assert [full[("step", e, None)] for e in range(3)] == [4, 8, 12]
    assert [full[("evals", e, None)] for e in range(3)] == [2, 4, 6]
    return r, edited, full


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_hindsight_values_of_variables_a_restored_block_changed_equal_a_full_run(recorded, workers):
    r, edited, full = recorded
    got = r.replay_workers(edited, "b", workers, NAMES)
    assert got == full
    assert {got[("tag", e, None)] for e in range(6)} == {"edited"}  # not changed by the block: the edit stands


def test_the_replay_names_what_it_set(recorded):
    r, edited, _ = recorded
    proc = r.run(edited, "--flor", "b", "--replay_flor")
    assert "variables block 'train' changes outside end() are set as recorded where it is restored: best, hist, " \
           "i, loss, stats, step" in proc.stderr, proc.stderr
    assert "variables block 'eval' changes outside end() are set as recorded where it is restored: batches, " \
           "correct, evals, i, seen" in proc.stderr, proc.stderr  # evals: a global the function declares


def test_a_hostile_block_state_file_sets_only_plain_values_under_plain_names(tmp_path):
    """logs/block-state.jsonl is read from a store: it may name dunders or the script's modules
    and functions, hold lines of another shape or values that are not encoded plain data."""
    r = Runner(tmp_path)
    r.run(r.script("block_vars.py"), "--flor", "b", "--epochs", "2")
    def plant_vars(manifest):
        manifest["watch"]["vars"].update({"__builtins__": 1, "torch": 2, "evaluate": 3, "flor": {"t": "list", "v": [1]},
                                          "1bad": 4, "net": 5, "step": {"py": "os.system"}})

    def plant_globals(manifest):  # in a function: its globals
        manifest["watch"]["globals"] = {"torch": 1, "net": 2, "evaluate": 3, "X": 4, "evals": {"py": "os.system"}}

    run = next((r.home / "b" / "runs").glob("*"))
    reseal_manifest(run / "checkpoints" / "train" / "0.json", plant_vars)
    reseal_manifest(run / "checkpoints" / "eval" / "0.json", plant_globals)
    edited = r.script("block_vars.py", {"    # HINDSIGHT\n": '    flor.log("step", step)\n'
                                                          '    flor.log("mods", type(torch).__name__ + type(net).__name__)\n'},
                      dest="hindsight.py")
    proc = r.run(edited, "--flor", "b", "--replay_flor", "--epochs", "2", check=False)
    # what a planted manifest names cannot be set: not exact, with the code, exit 3
    assert proc.returncode == 3 and proc.stderr.strip().splitlines()[-1].startswith("flor: replay NOT EXACT"), \
        proc.stderr
    assert "FL337 variables block 'train' changes outside end() that could not be set where it is restored: step" \
        in proc.stderr, proc.stderr
    # only a global the function itself assigns is ever set, and only to what decodes as plain data
    assert "variables block 'eval' changes outside end() that could not be set where it is restored: X, evals, " \
           "evaluate, net, torch" in proc.stderr, proc.stderr
    got = values(r.logs("b"), "replay")
    assert got[("mods", 0, None)] == got[("mods", 1, None)] == "moduleLinear"  # names of modules and objects left alone
    assert got[("step", 1, None)] == 8  # epoch 1's line is intact


def test_a_history_grown_past_the_limit_is_named_once(tmp_path):
    """Past ``LIMITS.block_items`` a history is no longer noted: the recording says so, once."""
    r = Runner(tmp_path)
    proc = r.run(r.script("block_vars.py", {"hist.append(loss.item())": "hist.extend([loss.item()] * 300)"}),
                 "--flor", "b")
    assert proc.stderr.count("`hist`, which SkipBlock 'train' changes outside end(), is no longer plain data of at "
                             "most 4096 items at epoch 3: a replay") == 1, proc.stderr
    assert not said(proc.stderr, "FL201", "FL202", "FL203")  # the first end's warning: hist was noted then


def test_a_history_the_replay_grew_past_256_values_is_still_set(tmp_path):
    """A restore replaced only a value it could encode at the outer state's limit (256): once a
    whole replay had restored a history past it, the next restores left it as it was (480
    values recorded, 320 replayed), silently."""
    r = Runner(tmp_path)
    edit = {"hist.append(loss.item())": "hist.extend([loss.item()] * 20)"}
    r.run(r.script("block_vars.py", edit), "--flor", "b")
    proc = r.run(r.script("block_vars.py", {**edit, "    # HINDSIGHT\n": '    flor.log("n_hist", len(hist))\n'},
                          dest="hindsight.py"), "--flor", "b", "--replay_flor")
    assert "12 blocks restored" in proc.stderr, proc.stderr
    got = values(r.logs("b"), "replay")
    assert [got[("n_hist", e, None)] for e in range(6)] == [80, 160, 240, 320, 400, 480]


def test_a_copy_of_the_best_weights_kept_outside_end_is_named_once(tmp_path):
    """State that is not plain data, bound by the block in place of a None (or of an earlier
    copy), is not noted: the recording names it, once, and nothing else the block binds. (Read
    after the block: a name nothing outside the block reads is not state, test_carried_values.py.)"""
    r = Runner(tmp_path)
    edits = {"    # HINDSIGHT\n": "    print(len(best_state or ()), len(peek))\n","                best = loss.item()\n":
             "                best = loss.item()\n"
             "                best_state = {k: v.clone() for k, v in net.state_dict().items()}\n",
             "seen = 0\n": "seen, best_state, peek = 0, None, (X[:2], Y[:2])\n",
             "            step += 1\n": "            step += 1\n            peek = (X[i:i + 2], Y[i:i + 2])\n"}
    proc = r.run(r.script("block_vars.py", edits), "--flor", "b")
    assert proc.stderr.count("SkipBlock 'train' bound `best_state` outside end() at epoch 0 to state that is not "
                             "plain data: a replay that restores 'train' leaves `best_state` as it was") == 1, proc.stderr
    assert proc.stderr.count("SkipBlock 'train' bound `peek` outside end() at epoch 0") == 1, proc.stderr
    assert proc.stderr.count("outside end() at epoch") == 2, proc.stderr
    given = {**edits, "net, opt = flor.SkipBlock.end(net, opt)":
             "net, opt, best_state, peek = flor.SkipBlock.end(net, opt, best_state, peek)"}
    proc = r.run(r.script("block_vars.py", given, dest="given.py"), "--flor", "b")
    assert "FL207" not in proc.stderr, proc.stderr
