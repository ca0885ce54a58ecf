"""Values a block run carries into its next run (nanoGPT's prefetched ``X, Y``), end to end: kept
with the block's checkpoint and set where a replay restores it, so every replay gives a full
run's values; the dict nanoGPT builds for ``torch.save`` inside the block is not state, and the
unguarded ``torch.save`` a replay runs again is named."""

from __future__ import annotations

import sys

import pytest

from helpers import Runner, values

#: hindsight: the weights after each chunk, which depend on every batch the chunk trained on, through a
#: helper function used only by the log (a logging-only edit)
WEIGHTS = {"# HELPERS": "def weight_sum(m):\n    return float(m.head.weight.detach().double().sum())\n\n",
           "    # OUTER": '    flor.log("w", weight_sum(model))'}
#: hindsight inside the block: the gradient norm the recording computed and dropped, kept for a log
GRAD_NORM = {"            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)":
             "            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
             '            flor.log("gn", float(gn), step=iter_num)'}


@pytest.fixture(scope="module")
def nanogpt(tmp_path_factory) -> tuple[Runner, dict]:
    """prefetch.py recorded with a checkpoint every other chunk, and a full run of the edited script."""
    r = Runner(tmp_path_factory.mktemp("carried"))
    env = r.env(FLOR_EVERY="2")
    rec = r.run(r.script("prefetch.py"), "--chunks", "5", "--flor", "gpt", env=env)
    r.recorded = rec.stderr  # type: ignore[attr-defined]
    edited = r.script("prefetch.py", WEIGHTS, dest="hindsight.py")
    r.run(edited, "--chunks", "5", "--flor", "full", env=env)
    full = values(r.logs("full"), "record")
    assert len(full) == 5
    return r, full


def _replay(r: Runner, *flags: str) -> tuple[dict, str]:
    proc = r.run(r.cwd / "hindsight.py", "--chunks", "5", "--flor", "gpt", *flags)
    replay = proc.stderr.split("flor: replay ")[1].split()[0]
    return values([x for x in r.logs("gpt") if x["replay"] == replay]), proc.stderr


def test_a_prefetched_batch_is_restored_with_the_block(nanogpt):
    r, full = nanogpt
    assert "FL207" not in r.recorded and "FL211" not in r.recorded, r.recorded  # checkpoint: not state
    got, err = _replay(r, "--replay_flor")
    assert got == full, err
    assert "FL309" not in err, err  # a helper def only a log uses is a logging-only edit
    assert "FL335" in err and "replay verified exact" in err.splitlines()[-1], err
    # the unguarded torch.save of the best checkpoint runs again in the re-executed chunks: named once
    assert err.count("FL340 this replay writes") == 1 and f"{r.cwd / 'ckpt.pt'}, which the recording wrote" in err
    # a worker that starts mid-run: its first chunk reads the batch the restored initialization chunk fetched
    part, err = _replay(r, "--replay_flor=1/2")
    assert len(part) >= 2 and part == {k: full[k] for k in part}, err
    assert "replay verified exact" in err.splitlines()[-1], err
    assert "FL322" not in err and "not restored" not in err, err  # nor the checkpoint dict
    # a launch's workers each write ckpt.pt again: named once, with which (FL341)
    launch = r.flor("replay", "gpt", "--workers", "2", "--", sys.executable, "hindsight.py", "--chunks", "5")
    assert f"FL341 workers 0, 1 of this replay each wrote {r.cwd / 'ckpt.pt'}" in launch.stderr + launch.stdout, \
        launch.stderr


def test_keeping_a_result_the_recording_dropped_is_a_logging_only_edit(nanogpt):
    """``gn = clip_grad_norm_(...)`` where the recording called ``clip_grad_norm_(...)``: no FL309, and
    the log inside the block re-executes it (FL339) with the values of a full run."""
    r, _ = nanogpt
    edited = r.script("prefetch.py", GRAD_NORM, dest="hindsight.py")
    r.run(edited, "--chunks", "5", "--flor", "gn_full", env=r.env(FLOR_EVERY="2"))
    full = values(r.logs("gn_full"), "record")
    got, err = _replay(r, "--replay_flor")
    assert got == full and len(full) == 25, err
    assert "FL309" not in err and "FL339 block 'train' is re-executed" in err, err
    assert "replay verified exact" in err.splitlines()[-1], err
