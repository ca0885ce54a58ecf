"""A name the block assigns, read after ``SkipBlock.end`` but not given to it, is named
(``scripts/last_loss.py``), and so is a name given to ``end()`` that the block binds first.

Nothing said so: ``flor.log("loss", loss.item())`` after the block recorded silently; a whole
replay stopped with a NameError, and a worker starting mid-run logged one stale loss for every
epoch and ended "verified exact".
"""

from __future__ import annotations

from conftest import Runner, values

HINDSIGHT = {"    # HINDSIGHT": '    flor.log("loss", loss.item())'}
GIVEN = {"    net, opt = flor.SkipBlock.end(net, opt)": "    net, opt, loss = flor.SkipBlock.end(net, opt, loss)"}
BOUND = {"# BEFORE LOOP": "loss = None"}


def test_a_name_the_block_assigns_and_the_loop_reads_after_it_is_named(tmp_path):
    r = Runner(tmp_path)
    proc = r.run(r.script("last_loss.py"), "--flor", "l")
    assert "loss" not in proc.stderr, proc.stderr  # nothing reads it after the block yet
    edited = r.script("last_loss.py", HINDSIGHT, dest="logged.py")
    proc = r.run(edited, "--flor", "full")  # a recording that reads it is told at once
    assert "SkipBlock.end('train') is not given `loss`, which the block assigns and the code after end() reads" \
        in proc.stderr, proc.stderr
    assert proc.stderr.count("is not given `loss`") == 1  # once a block
    assert "`opt`" not in proc.stderr and "`xb`" not in proc.stderr  # given to end(), or not read after it
    proc = r.run(edited, "--flor", "l", "--replay_flor=2/3")  # the hindsight log reads it: the replay says so
    assert proc.stderr.count("where 'train' is restored, `loss` keeps the value it had before the block") == 1, \
        proc.stderr
    full, got = values(r.logs("full"), "record"), values(r.logs("l"), "replay")
    assert got[("loss", 4, None)] == got[("loss", 5, None)] != full[("loss", 5, None)]  # why it matters


def test_a_name_given_to_end_but_first_bound_in_the_block_is_named(tmp_path):
    r = Runner(tmp_path)
    proc = r.run(r.script("last_loss.py", {**GIVEN, **HINDSIGHT}), "--flor", "l")
    assert "SkipBlock.end('train') is given `loss`, which was not bound when the block was first entered" \
        in proc.stderr, proc.stderr
    assert "is not given" not in proc.stderr
    proc = r.run(r.script("last_loss.py", {**GIVEN, **HINDSIGHT}), "--flor", "l", "--replay_flor", check=False)
    assert "NameError: name 'loss' is not defined" in proc.stderr  # what the warning foretold


def test_bound_before_the_loop_and_given_replays_exactly_without_a_word(tmp_path):
    r = Runner(tmp_path)
    script = r.script("last_loss.py", {**GIVEN, **BOUND, **HINDSIGHT})
    proc = r.run(script, "--flor", "l")
    assert "is not given" not in proc.stderr and "not bound" not in proc.stderr, proc.stderr
    full = values(r.logs("l"), "record")
    proc = r.run(script, "--flor", "l", "--replay_flor=2/3")
    assert "replay verified exact" in proc.stderr and "is not given" not in proc.stderr, proc.stderr
    got = values(r.logs("l"), "replay")
    assert got == {k: v for k, v in full.items() if k[1] >= 4} and len(got) == 4
