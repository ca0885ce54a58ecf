"""A list the block grows but ``end()`` is not given (``scripts/history.py``).

Nothing said so: the recording went through, and a replay with a hindsight ``len(losses)``
ended "verified exact" while logging 0 where a full re-execution logs 1, 2, 3. A list of
numbers is now set again where a replay restores the block (``flor.watch.variables.BlockVars``,
``e2e/test_block_vars.py``); one that holds tensors is not plain data, and the recording names
it.
"""

from __future__ import annotations

from helpers import Runner, values

HINDSIGHT = {"    # HINDSIGHT": '    flor.log("n", len(losses))'}
WARNING = "SkipBlock.end('train') was not given `losses` (a list the block changed from 0 to 1 items)"


def test_the_recording_names_a_list_of_tensors_the_block_grew_but_end_was_not_given(tmp_path):
    r = Runner(tmp_path)
    proc = r.run(r.script("history.py"), "--tensors", "--flor", "h")
    assert WARNING in proc.stderr, proc.stderr
    assert proc.stderr.count("was not given `losses`") == 1  # once a block
    edited = r.script("history.py", HINDSIGHT, dest="hindsight.py")
    r.run(edited, "--tensors", "--flor", "full")
    r.run(edited, "--tensors", "--flor", "h", "--replay_flor")
    full, got = values(r.logs("full"), "record"), values(r.logs("h"), "replay")
    assert [full[("n", e, None)] for e in range(3)] == [1, 2, 3]
    assert [got[("n", e, None)] for e in range(3)] == [0, 0, 0]  # why the warning matters


def test_a_list_of_numbers_is_restored_without_a_warning(tmp_path):
    r = Runner(tmp_path)
    proc = r.run(r.script("history.py"), "--flor", "h")
    assert "FL203" not in proc.stderr, proc.stderr
    edited = r.script("history.py", HINDSIGHT, dest="hindsight.py")
    proc = r.run(edited, "--flor", "h", "--replay_flor")
    assert "set as recorded where it is restored: loss, losses" in proc.stderr, proc.stderr
    assert [values(r.logs("h"), "replay")[("n", e, None)] for e in range(3)] == [1, 2, 3]


def test_no_warning_when_the_list_is_given(tmp_path):
    r = Runner(tmp_path)
    given = {"net, opt = flor.SkipBlock.end(net, opt)": "net, opt, losses = flor.SkipBlock.end(net, opt, losses)"}
    proc = r.run(r.script("history.py", {**given}), "--tensors", "--flor", "h")
    assert "FL203" not in proc.stderr, proc.stderr
    edited = r.script("history.py", {**given, **HINDSIGHT}, dest="hindsight.py")
    r.run(edited, "--tensors", "--flor", "h", "--replay_flor")
    assert [values(r.logs("h"), "replay")[("n", e, None)] for e in range(3)] == [1, 2, 3]
