"""A name the block assigns, read after ``SkipBlock.end`` but not given to it, is set by a replay
where it is plain data and named where it is not (``scripts/last_loss.py``), and so is a name given
to ``end()`` that the block binds first.

Nothing said so: ``flor.log("out", out.mean().item())`` after the block recorded silently; a whole
replay stopped with a NameError, and a worker starting mid-run logged one stale value for every
epoch and ended "verified exact".
"""

from __future__ import annotations

import pytest

from helpers import Runner, copy_of, said, values

LOSS = {"    # HINDSIGHT": '    flor.log("loss", loss.item())'}
OUT = {"    # HINDSIGHT": '    flor.log("out", out.abs().mean().item())'}
GIVEN = {"    net, opt = flor.SkipBlock.end(net, opt)": "    net, opt, loss = flor.SkipBlock.end(net, opt, loss)"}
BOUND = {"# BEFORE LOOP": "loss = None"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """last_loss.py recorded as "l", and what the recording said."""
    r = Runner(tmp_path_factory.mktemp("last_loss"))
    return r, r.run(r.script("last_loss.py"), "--flor", "l")


def test_the_last_loss_read_after_the_block_is_set_as_recorded(recorded, tmp_path):
    r = copy_of(recorded[0], tmp_path)
    edited = r.script("last_loss.py", LOSS, dest="logged.py")
    proc = r.run(edited, "--flor", "full")  # a number the block leaves: noted, so nothing to warn about
    assert not said(proc.stderr, "FL204", "`loss`"), proc.stderr
    proc = r.run(edited, "--flor", "l", "--replay_flor=2/3")
    assert "variables block 'train' changes outside end() are set as recorded where it is restored: loss" \
        in proc.stderr, proc.stderr
    assert "FL204" not in proc.stderr
    full, got = values(r.logs("full"), "record"), values(r.logs("l"), "replay")
    assert got == {k: v for k, v in full.items() if k[1] >= 4} and len(got) == 4, (got, full)


def test_a_name_the_block_assigns_that_is_not_plain_data_and_the_loop_reads_after_it_is_named(recorded, tmp_path):
    r, proc = copy_of(recorded[0], tmp_path), recorded[1]
    assert not said(proc.stderr, "FL204", "`out`"), proc.stderr  # nothing reads it after the block yet
    edited = r.script("last_loss.py", OUT, dest="logged.py")
    proc = r.run(edited, "--flor", "full")  # a recording that reads it is told at once
    assert "SkipBlock.end('train') is not given `out`, which the block assigns and the code after end() reads" \
        in proc.stderr, proc.stderr
    assert proc.stderr.count("is not given `out`") == 1  # once a block
    assert len(said(proc.stderr, "FL204")) == 1  # `out` only: not `opt`, `xb` or `loss`
    proc = r.run(edited, "--flor", "l", "--replay_flor=2/3", check=False)  # the hindsight log reads it
    assert proc.stderr.count("where 'train' is restored, `out` keeps the value it had before the block") == 1, \
        proc.stderr  # the replay says so before what it foretells: the worker never bound `out`
    assert proc.returncode == 1 and "NameError: name 'out' is not defined" in proc.stderr, proc.stderr


def test_a_name_given_to_end_but_first_bound_in_the_block_is_named(tmp_path):
    r = Runner(tmp_path)
    proc = r.run(r.script("last_loss.py", {**GIVEN, **LOSS}), "--flor", "l")
    assert "SkipBlock.end('train') is given `loss`, which was not bound when the block was first entered" \
        in proc.stderr, proc.stderr
    assert "FL204" not in proc.stderr
    proc = r.run(r.script("last_loss.py", {**GIVEN, **LOSS}), "--flor", "l", "--replay_flor", check=False)
    assert "NameError: name 'loss' is not defined" in proc.stderr  # what the warning foretold


def test_bound_before_the_loop_and_given_replays_exactly_without_a_word(tmp_path):
    r = Runner(tmp_path)
    script = r.script("last_loss.py", {**GIVEN, **BOUND, **LOSS})
    proc = r.run(script, "--flor", "l")
    assert "FL204" not in proc.stderr and "FL205" not in proc.stderr, proc.stderr
    full = values(r.logs("l"), "record")
    proc = r.run(script, "--flor", "l", "--replay_flor=2/3")
    assert "replay verified exact" in proc.stderr and "FL204" not in proc.stderr, proc.stderr
    got = values(r.logs("l"), "replay")
    assert got == {k: v for k, v in full.items() if k[1] >= 4} and len(got) == 4
