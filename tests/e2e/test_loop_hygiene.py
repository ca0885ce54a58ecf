"""The small things around the loop that users trip over, in real scripts: a scheduler or a
random generator left out of ``end()`` (warned at record time), gradients carried into the
next epoch, an ``end()`` that no longer fits its checkpoint (named on replay), the "changed by
more than logging" note (logging edits do not trigger it; each note once),
``len(flor.it(...))`` for tqdm, and ``flor replay`` output (bars collapsed, one summary).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from helpers import Runner, said, values

# toy.py with its loop counted: `len(flor.it(...))` printed before the loop
COUNTED = {"for epoch in flor.it(range(args.epochs)):": "loop = flor.it(range(args.epochs))\n"
                                                       "print('LEN', len(loop))\n"
                                                       "for epoch in loop:"}
EPOCHS = 5


@pytest.fixture(scope="module")
def rec(tmp_path_factory) -> tuple[Runner, subprocess.CompletedProcess]:
    """The counted toy.py recorded once (``toy``); the recording's own output with it."""
    r = Runner(tmp_path_factory.mktemp("hygiene"))
    return r, r.run(r.script(edits=COUNTED, dest="counted.py"), "--epochs", str(EPOCHS), "--flor", "toy")


def replay(r: Runner, edits: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """A replay of ``toy`` by the counted script with ``edits``."""
    script = r.script(edits={**COUNTED, **edits}, dest="edited.py")
    return r.run(script, "--epochs", str(EPOCHS), "--flor", "toy", "--replay_flor", *args, check=check)


# -- forgotten objects at record time ---------------------------------------------------

NO_SCHEDULER = {"net, optimizer, scheduler, step = flor.SkipBlock.end(net, optimizer, scheduler, step)":
                "net, optimizer, step = flor.SkipBlock.end(net, optimizer, step)"}
FORGOT = "was not given `scheduler`"


def test_a_forgotten_scheduler_is_warned_once(runner: Runner):
    proc = runner.run(runner.script(edits=NO_SCHEDULER), "--epochs", "3", "--flor", "toy")
    assert proc.stderr.count(FORGOT) == 1, proc.stderr
    assert "torch.optim.lr_scheduler.OneCycleLR" in proc.stderr
    assert "pass it to SkipBlock.end(..., scheduler)" in proc.stderr


def test_a_passed_scheduler_is_not_warned(rec):
    _, recording = rec
    assert not said(recording.stderr, "FL201", "FL202", "FL203"), recording.stderr


# -- a random generator of the script's own, left out of end() ---------------------------

OWN_GENERATORS = {"step = 0\n": "step = 0\ng = torch.Generator().manual_seed(1)\nrng = np.random.default_rng(2)\n"
                                "r = random.Random(3)\n"}
DREW = "a random generator the block drew from"


def test_generators_drawn_in_the_block_but_not_given_are_warned_once(runner: Runner):
    edits = {**OWN_GENERATORS, "            # INNER": "            drawn = torch.randperm(4, generator=g), rng.normal(), r.random()"}
    proc = runner.run(runner.script(edits=edits), "--epochs", "3", "--flor", "toy")
    assert proc.stderr.count(DREW) == 3, proc.stderr  # three generators, each once in three epochs
    for var, kind in (("g", "torch._C.Generator"), ("rng", "numpy.random._generator.Generator"), ("r", "random.Random")):
        assert f"was not given `{var}` (a {kind}, {DREW})" in proc.stderr, proc.stderr
        assert f"pass it to SkipBlock.end(..., {var})" in proc.stderr


def test_a_generator_given_or_drawn_outside_the_block_is_not_warned(runner: Runner):
    # g is given to end(), rng and r are drawn outside the block: only h, drawn inside and not given, is named
    edits = {**OWN_GENERATORS, "            # INNER": "            drawn = torch.randperm(4, generator=g), h.random()",
             "step = 0\n": OWN_GENERATORS["step = 0\n"] + "h = random.Random(4)\n",
             "    # OUTER": "    noise = rng.normal() + r.random()",  # drawn every epoch, but outside the block
             "net, optimizer, scheduler, step = flor.SkipBlock.end(net, optimizer, scheduler, step)":
             "net, optimizer, scheduler, step, g = flor.SkipBlock.end(net, optimizer, scheduler, step, g)"}
    proc = runner.run(runner.script(edits=edits), "--epochs", "3", "--flor", "toy")
    assert proc.stderr.count(DREW) == 1 and "was not given `h` (a random.Random" in proc.stderr, proc.stderr


def test_a_generator_reseeded_every_epoch_is_not_warned_and_replays_exactly(runner: Runner):
    # the reproducibility idiom: the epoch's own seed before the block; a worker that starts
    # mid-run reseeds it too, so its draws need no checkpoint
    block = '    if flor.SkipBlock.step_into("training_loop"):  # BLOCK'
    edits = {**OWN_GENERATORS, "            # INNER": "            drawn = torch.randperm(4, generator=g)",
             block: "    g.manual_seed(100 + epoch)\n" + block}
    proc = runner.run(runner.script(edits=edits, dest="reseeded.py"), "--epochs", "3", "--flor", "toy")
    assert "FL202" not in proc.stderr, proc.stderr
    rep = runner.run(runner.script(edits=edits, dest="reseeded.py"), "--epochs", "3", "--flor", "toy",
                     "--replay_flor", "1/3")
    assert "replay verified exact" in rep.stderr, rep.stderr


CARRIED = "added to the gradients its previous run left"


def test_gradients_carried_into_the_next_epoch_are_checkpointed_and_restored(runner: Runner):
    # a block whose next run adds to the gradients it left: from its second run on its checkpoints keep
    # p.grad, and a replay that restores one and re-executes the next epoch starts from the recorded
    # gradients; the first run's checkpoint (taken before flor could know) holds none and is re-executed
    script = runner.script("accumulate.py")
    rec = runner.run(script, "--acc", "4", "--flor", "acc", env=runner.env(FLOR_EVERY="2"))
    assert rec.stderr.count(CARRIED) == 1, rec.stderr
    (run_dir,) = (runner.home / "acc" / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["grads_carried"] == ["train"]
    manifests = {p.name: json.loads(p.read_text()) for p in (run_dir / "checkpoints" / "train").iterdir()}
    assert set(manifests) == {"0.json", "2.json"} and "grads" not in manifests["0.json"], sorted(manifests)
    grads = manifests["2.json"]["grads"]
    assert grads["k"] == ["0"] and len(grads["v"][0]["k"]) == 4, grads  # net's two weights and two biases

    # hindsight: the gradient left after each epoch, logged after end() (restored with the block), against
    # the same script recorded in full
    edits = {'    flor.log("w", float(net[0].weight.sum()))':
             '    flor.log("w", float(net[0].weight.sum()))\n    flor.log("g", float(net[0].weight.grad.sum()))'}
    hindsight = runner.script("accumulate.py", edits=edits, dest="hindsight.py")
    runner.run(hindsight, "--acc", "4", "--flor", "full")
    full = values(runner.logs("full"), "record")
    assert len(full) == 8, full
    for worker in ("1/2", "0/2"):  # 1/2: epoch 2 restored with its gradients, epoch 3 re-executed from them
        rep = runner.run(hindsight, "--acc", "4", "--flor", "acc", "--replay_flor", worker)
        assert "replay verified exact" in rep.stderr, rep.stderr
    rep = runner.run(hindsight, "--acc", "4", "--flor", "acc", "--replay_flor")
    assert "replay verified exact" in rep.stderr and "its checkpoint at epoch 0 holds none" in rep.stderr, rep.stderr
    replayed = [r for r in runner.logs("acc") if r["source"] == "replay" and r["name"] == "g"]
    assert len(replayed) == 8 and all(r["value"] == full[("g", r["epoch"], r["step"])] for r in replayed), replayed


@pytest.mark.parametrize("args", [["--acc", "7"], ["--acc", "4", "--zero"]])
def test_gradients_stepped_or_zeroed_at_the_epochs_end_are_not_named(runner: Runner, args):
    script = runner.script("accumulate.py")
    rec = runner.run(script, *args, "--flor", "acc", env=runner.env(FLOR_EVERY="2"))
    assert "FL208" not in rec.stderr, rec.stderr
    (run_dir,) = (runner.home / "acc" / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["grads_carried"] == []
    rep = runner.run(script, *args, "--flor", "acc", "--replay_flor")
    assert "replay verified exact" in rep.stderr, rep.stderr


def test_a_dataloaders_generator_is_warned_by_its_path(runner: Runner):
    edits = {"batch_size=32, shuffle=True)": "batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(5))"}
    proc = runner.run(runner.script(edits=edits), "--epochs", "3", "--flor", "toy")
    assert proc.stderr.count(DREW) == 1, proc.stderr
    assert "was not given `loader.generator` (a torch._C.Generator" in proc.stderr
    assert "pass it to SkipBlock.end(..., loader.generator)" in proc.stderr


# -- an end() that does not fit its checkpoint --------------------------------------------

def test_replay_names_the_missing_object_by_type_and_position(rec):
    proc = replay(rec[0], NO_SCHEDULER, check=False)
    assert proc.returncode != 0
    assert ("SkipBlock.end('training_loop') was given 3 objects at epoch 0, the recording had 4: position 2 was "
            "a torch.optim.lr_scheduler.OneCycleLR (missing now); pass the same objects, in the same order") \
        in proc.stderr, proc.stderr


# the README's kind of hindsight edit: a probed block, a value computed for a log, prints and logging
LOGGING_ONLY = {'step_into("training_loop")': 'step_into("training_loop", probed=True)',
                "            # INNER": '            gn = float(sum(p.grad.norm() for p in net.parameters()))\n'
                                      '            flor.log("gn", gn, step=step)',
                "    # OUTER": '    print("outer", epoch)\n    logging.info("acc %s", acc)',
                "import random\n": "import logging\nimport random\n"}


@pytest.mark.parametrize("edits, notes", [
    (LOGGING_ONLY, 0),
    ({"    # OUTER": "    optimizer.zero_grad()  # not logging (harmless: the block zeroes them first)"}, 1),
], ids=["probed-and-logging-edit", "training-change"])
def test_the_note_is_printed_once_and_only_for_real_changes(rec, edits, notes):
    proc = replay(rec[0], edits)
    assert proc.stderr.count("changed by more than logging") == notes, proc.stderr
    assert "flor: replay verified exact" in proc.stderr


# -- len(flor.it(...)) ----------------------------------------------------------------------

def epochs_run(out: str) -> list[int]:
    return [int(m) for m in re.findall(r"^epoch (\d+) acc", out, re.M)]


def test_flor_it_has_a_length_inert_and_recording(rec):
    r, recording = rec
    inert = r.run(r.cwd / "counted.py", "--epochs", str(EPOCHS)).stdout
    for out in (inert, recording.stdout):
        assert f"LEN {EPOCHS}\n" in out and epochs_run(out) == list(range(EPOCHS)), out


def test_flor_it_has_the_length_of_a_replay_workers_epochs(rec):
    """Worker 1/2 of 5 epochs: initialization epoch 1, then its segment 2-4: four epochs."""
    out = replay(rec[0], {}, "1/2").stdout
    assert epochs_run(out) == [1, 2, 3, 4] and "LEN 4\n" in out, out


def test_flor_replay_shows_lines_not_redraws_and_one_summary(runner: Runner):
    """8 epochs of a tqdm script, 2 workers, a probed replay (inner bars redraw) with a small
    change to the script that both workers note. Before this, the output had 327 lines."""
    recording = runner.run(runner.script("tqdm_loop.py"), "--flor", "tq")
    assert "8/8" in recording.stderr.replace("\r", "\n")  # tqdm(flor.it(range(8))) has a total
    runner.script("tqdm_loop.py", dest="edited.py", edits={
        'step_into("training_loop")': 'step_into("training_loop", probed=True)',
        "            # INNER": '            flor.log("loss", loss.item())',
        "    # OUTER": "    optimizer.zero_grad()  # not logging: both workers say so",
    })
    proc = subprocess.run([sys.executable, "-m", "flor", "replay", "tq", "--workers", "2", "--", sys.executable,
                           "edited.py"], cwd=runner.cwd, env=runner.env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = (proc.stdout + proc.stderr).splitlines()
    assert len(lines) < 40, "\n".join(lines)
    assert sum("replay verified exact" in x for x in lines) == 1
    assert sum("changed by more than logging" in x for x in lines) == 1
    assert not any("%|" in x or "it/s" in x for x in lines)
    assert all(f"[w{w}] epoch {e} acc" in proc.stdout for w, e in ((0, 0), (0, 3), (1, 4), (1, 7)))
    # each worker's own summary is kept in its files
    run_dir = next((runner.home / "tq" / "runs").iterdir())
    assert len(list((run_dir / "logs").glob("replay-*.summary.json"))) == 2
