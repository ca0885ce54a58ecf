"""Replay stays exact on the loops people actually write (issue 12).

``scripts/loops.py`` keeps state in the epoch loop itself, outside ``SkipBlock.end``: early
stopping with patience (``best_val``, ``bad``, a ``break``), best-model tracking with a
guarded ``torch.save``, an EMA of the validation loss, a running sample counter and a
hand-written warmup with plateau decay (``lr`` set from outer state). Each variant is
recorded once and replayed with 1, 2 and 3 workers (``--replay_flor PID/N``), and every
replayed value is compared with a full re-execution of the hindsight-edited script.
The same loop runs at module level (state in globals) and inside ``main()`` (state in
locals, written back into the running frame).
"""

from __future__ import annotations

import json

import pytest

from helpers import SCRIPTS, Runner, values

EPOCHS = 6
OUTER = {"    # OUTER": '    flor.log("gap", val - best_val)'}  # a hindsight value in the outer loop
PROBED = {**OUTER, 'step_into("train")': 'step_into("train", probed=True)',  # ... and inside the block
          "            # INNER": '            flor.log("batch_loss", loss.item(), step=step)'}
OUTER_STATE = {"best_val", "bad", "ema", "samples", "lr"}

# variant -> (loop inside main(), --patience, epochs the recording runs). A loop inside main()
# that stops early covers both: its locals restored in a worker that starts mid-run (2/3).
VARIANTS = {
    "module-early-stop": (False, 2, 3),
    "module-all-epochs": (False, 4, 6),
    "main-early-stop": (True, 2, 3),
}


def loop_script(r: Runner, dest: str, in_main: bool, edits: dict[str, str] | None = None) -> str:
    """scripts/loops.py with ``edits``; with ``in_main`` the lines after ``# MAIN`` become ``main()``."""
    text = (SCRIPTS / "loops.py").read_text()
    for old, new in (edits or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    if in_main:
        head, _, body = text.partition("# MAIN\n")
        body = "".join("    " + line if line.strip() else line for line in body.splitlines(keepends=True))
        text = f"{head}def main():\n{body}\n\nmain()\n"
    path = r.cwd / dest
    path.write_text(text)
    return dest


def stat(path) -> tuple[int, bytes]:
    return path.stat().st_mtime_ns, path.read_bytes()


def run_logs(r: Runner, name: str) -> list[dict]:
    """Every log record of the latest run of ``name``, read in this process (no `flor logs`)."""
    from flor.store.runlogs import read_run_logs

    run_dir = sorted((r.home / name / "runs").iterdir())[-1]
    return read_run_logs(run_dir, run_dir.name)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_loop_replays_exactly_with_1_2_3_workers(tmp_path, variant):
    in_main, patience, ran = VARIANTS[variant]
    r = Runner(tmp_path)
    args = ["--epochs", str(EPOCHS), "--patience", str(patience)]
    base = r.cwd / loop_script(r, "loops.py", in_main)
    r.run(base, *args, "--flor", "loop")
    saved = stat(r.cwd / "best.pt")
    meta = json.loads(next((r.home / "loop" / "runs").glob("*/run.json")).read_text())
    assert (meta["epochs_planned"], meta["epochs_done"]) == (EPOCHS, ran)
    assert meta["loop_ended"] == ("break" if ran < EPOCHS else "completed")

    # the full re-execution of the edited script (recorded elsewhere, saving elsewhere)
    probed = r.cwd / loop_script(r, "probed.py", in_main, PROBED)
    outer = r.cwd / loop_script(r, "outer.py", in_main, OUTER)
    r.run(probed, *args, "--save", "full.pt", "--flor", "full")
    full = values(run_logs(r, "full"), "record")
    assert {k[1] for k in full} == set(range(ran))
    assert {k[0] for k in full} >= OUTER_STATE | {"val", "gap", "batch_loss"}

    for n, script in ((1, probed), (2, outer), (3, probed)):
        rid = f"w{n}"
        outs = [r.run(script, *args, "--flor", "loop", "--replay_flor", f"{w}/{n}", env=r.env(FLOR_REPLAY_ID=rid))
                for w in range(n)]
        for o in outs:
            assert o.stderr.strip().splitlines()[-1].startswith("flor: replay verified exact"), o.stderr
        logs = [x for x in run_logs(r, "loop") if x["source"] == "replay" and x["replay"] == rid]
        keys = [(x["name"], x["epoch"], x["step"]) for x in logs]
        assert len(keys) == len(set(keys))  # every epoch exactly once across the workers
        expected = full if script == probed else {k: v for k, v in full.items() if k[0] != "batch_loss"}
        assert values(logs) == expected, f"{n} workers"
        assert max(x["epoch"] for x in logs) == ran - 1  # nothing for epochs the recording never ran
        late = [o for w, o in enumerate(outs) if w * ran // n > 1]  # workers that start mid-run
        for o in late:  # each variable restored, or left as the worker set it when the loop had not changed it yet
            lines = o.stderr.splitlines()
            restored = set(next(ln for ln in lines if "outer-loop variables restored" in ln).split(": ", 2)[-1].split(", "))
            left = next((ln for ln in lines if "had not changed" in ln), "")
            left = set(left.split(": ", 2)[-1].split(", ")) if left else set()
            assert OUTER_STATE <= restored | left and not restored & left

    # the guarded save ran in the recording only: replays never rewrote it
    assert stat(r.cwd / "best.pt") == saved
    import torch

    recorded, again = torch.load(r.cwd / "best.pt"), torch.load(r.cwd / "full.pt")
    assert recorded.keys() == again.keys() and all(torch.equal(recorded[k], again[k]) for k in recorded)

    shown = r.flor("show", "loop").stdout
    assert f"epochs          {ran} of {EPOCHS} " + ("planned (stopped early)" if ran < EPOCHS else "done") in shown
    plan = r.flor("replay", "loop", "--plan", "--workers", "2", "--json").stdout
    assert json.loads(plan)["segments"][-1][1] == ran
    counts = {name: sum(1 for k in full if k[0] == name) for name in sorted({k[0] for k in full})}
    print(f"{variant}: {ran} of {EPOCHS} epochs; values {counts}")


def test_the_loop_is_noted_only_before_checkpointed_epochs_and_a_worker_there_is_exact(tmp_path):
    """With --flor_every 2 the loop's variables are noted after epochs 1 and 3, not after the last (a
    worker starts at 0 or at a checkpointed epoch: a loop of short epochs does not pay the noting at
    every one); a worker
    that starts at epoch 2 sets them and gives a full run's values."""
    r = Runner(tmp_path)
    args = ["--epochs", str(EPOCHS), "--patience", "4"]
    base, outer = r.cwd / loop_script(r, "loops.py", True), r.cwd / loop_script(r, "outer.py", True, OUTER)
    r.run(base, *args, "--flor", "loop", env=r.env(FLOR_EVERY="2"))
    state = next((r.home / "loop" / "runs").glob("*/logs/state.jsonl")).read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in state if '"vars"' in line] == [1, 3]
    r.run(outer, *args, "--flor", "full")
    full = values(run_logs(r, "full"), "record")
    proc = r.run(outer, *args, "--flor", "loop", "--replay_flor", "1/2", env=r.env(FLOR_REPLAY_ID="mid"))
    assert "outer-loop variables restored as recorded at the end of epoch 1" in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("flor: replay verified exact"), proc.stderr
    got = values([x for x in run_logs(r, "loop") if x["source"] == "replay" and x["replay"] == "mid"])
    assert got == {k: v for k, v in full.items() if k[1] >= 3} and {k[1] for k in got if k[0] == "gap"} == {3, 4, 5}


def test_worker_without_outer_state_diverges_loudly(tmp_path):
    """Without the recorded outer state (an older recording), a worker that starts mid-run
    gets best_val/bad wrong: the loop does not stop where the recording did, and the replay
    says so and exits 3."""
    r = Runner(tmp_path)
    script = r.cwd / loop_script(r, "loops.py", False)
    r.run(script, "--patience", "2", "--flor", "loop")
    state = next((r.home / "loop" / "runs").glob("*/logs/state.jsonl"))
    state.unlink()
    proc = r.run(script, "--patience", "2", "--flor", "loop", "--replay_flor", "2/3", check=False)
    assert proc.returncode == 3
    assert "has no outer-loop state for epoch 0" in proc.stderr
    assert "DIVERGED loop: the recording left the loop after epoch 2 (a break: early stopping)" in proc.stderr
    assert "DIVERGED log 'best_val' at epoch 2" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("exit status 3 (--flor_lenient keeps 0)")


@pytest.mark.parametrize("start", ["{}", "None"])
def test_state_that_cannot_be_restored_is_named(tmp_path, start):
    """A best-weights dict (not plain data) kept in the loop is named with the fix; strict fails.
    Also where it starts as None (plain data) and becomes the dict later. (The loop reads it: a
    variable nothing reads before binding it again is not state, test_carried_values.py.)"""
    r = Runner(tmp_path)
    edits = {"            torch.save(net.state_dict(), args.save)":
             "            torch.save(net.state_dict(), args.save)\n"
             "        best_state = {k: v.clone() for k, v in net.state_dict().items()}",
             "    # OUTER\n": "    # OUTER\n    print(len(best_state or ()))\n",
             "bad = 0\n": f"bad = 0\nbest_state = {start}\n"}
    script = r.cwd / loop_script(r, "kept.py", True, edits)
    r.run(script, "--patience", "4", "--flor", "kept")
    proc = r.run(script, "--patience", "4", "--flor", "kept", "--replay_flor", "1/2", check=False)
    assert "outer-loop variables of main() that this worker (starting at epoch 2) cannot restore: best_state" in proc.stderr
    assert proc.returncode == 3 and "FL322" in proc.stderr.strip().splitlines()[-1]  # not exact
    assert "pass them to SkipBlock.end(), or replay with --flor_strong" in proc.stderr
    strict = r.run(script, "--patience", "4", "--flor", "kept", "--replay_flor", "1/2", "--flor_strict", check=False)
    assert strict.returncode != 0 and "cannot restore: best_state" in strict.stderr
    strong = r.run(script, "--patience", "4", "--flor", "kept", "--replay_flor", "1/2", "--flor_strong")
    assert "FL322" not in strong.stderr and "verified exact" in strong.stderr


SIDE_EFFECTS = """\
import sys
import flor
for epoch in flor.it(range(2)):
    if flor.SkipBlock.step_into("b"):
        pass
    flor.SkipBlock.end([epoch])
    print("mode", flor.recording(), flor.replaying())
"""


def test_recording_and_replaying_say_the_mode(tmp_path):
    r = Runner(tmp_path)
    script = tmp_path / "modes.py"
    script.write_text(SIDE_EFFECTS)
    assert "mode False False" in r.run(script).stdout  # inert
    assert "mode True False" in r.run(script, "--flor", "m").stdout
    assert "mode False True" in r.run(script, "--flor", "m", "--replay_flor").stdout


UNCHANGED = """
import os
import torch
import flor

tag = os.environ["TAG"]  # read before the loop, never changed by it: a path, a timer, a setting
late = 0  # unchanged until epoch 3
count = 0  # changed every epoch
net = torch.nn.Linear(2, 1)
for epoch in flor.it(range(6)):
    if flor.SkipBlock.step_into("train"):
        net.weight.data += 1
    net = flor.SkipBlock.end(net)
    count += 1
    if epoch == 3:
        late = 1
    # HINDSIGHT
    flor.log("late", late)
    flor.log("count", count)
"""


def test_a_variable_the_loop_never_changed_is_left_as_the_worker_set_it(tmp_path):
    r = Runner(tmp_path)
    recorded, script = r.cwd / "recorded.py", r.cwd / "unchanged.py"
    recorded.write_text(UNCHANGED)
    script.write_text(UNCHANGED.replace("    # HINDSIGHT", '    flor.log("tag", tag)  # hindsight'))
    r.run(recorded, "--flor", "u", env=r.env(TAG="recorded", FLOR_EVERY="1"))  # workers start where planned
    # what a full re-execution of the edited script with today's setting logs
    r.run(script, "--flor", "full", env=r.env(TAG="today"))
    full = values(run_logs(r, "full"), "record")
    assert full[("tag", 5, None)] == "today" and full[("late", 3, None)] == 1 and full[("count", 5, None)] == 6
    checked = set()
    for n in (2, 6):  # a last worker that restores the state of before `late` changes (epoch 3) and after
        rid = f"w{n}"
        outs = [r.run(script, "--flor", "u", "--replay_flor", f"{w}/{n}", env=r.env(TAG="today", FLOR_REPLAY_ID=rid))
                for w in range(n)]
        logs = [x for x in run_logs(r, "u") if x["source"] == "replay" and x["replay"] == rid]
        assert values(logs) == full, f"{n} workers"
        notes = outs[-1].stderr
        assert "restored as recorded at the end of epoch" in notes and "count" in notes
        left = next(ln for ln in notes.splitlines() if "had not changed" in ln)
        after = int(left.split("by epoch ")[1].split(",")[0])
        assert "tag" in left and "count" not in left and ("late" in left) == (after < 3), left
        checked.add(after < 3)
    assert checked == {True, False}, "a worker started before the change of `late` and one after"


UNFREEZE = """\
import torch
import flor

torch.manual_seed(0)
backbone, head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
for q in backbone.parameters():
    q.requires_grad_(False)
opt = torch.optim.SGD(head.parameters(), lr=0.1)
x = torch.randn(16, 4)
for epoch in flor.it(range(4)):
    # GUARD
    if flor.SkipBlock.step_into("train"):
        if epoch == 2:  # UNFREEZE
            for q in backbone.parameters():
                q.requires_grad_(True)
            opt.add_param_group({"params": list(backbone.parameters()), "lr": 0.01})
        loss = head(backbone(x).relu()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    backbone, head, opt = flor.SkipBlock.end(backbone, head, opt)
    print(f"epoch {epoch} loss {loss.item() if flor.recording() else 0:.6f}", flush=True)
    flor.log("w", float(backbone.weight.detach().sum() + head.weight.detach().sum()))
"""


def test_an_optimizer_changed_in_a_restored_block_is_named_with_the_fix(tmp_path):
    """add_param_group inside the block at epoch 2 (unfreezing a backbone): a replay restores
    that block, so the change never runs, and the optimizer cannot take the checkpoint's
    state. The replay fails with both shapes of parameter groups and the fix, not torch's
    bare "different number of parameter groups"; the fix (the change follows from the epoch,
    outside the block) replays exactly with 1 and 2 workers."""
    r = Runner(tmp_path)
    script = r.cwd / "unfreeze.py"
    script.write_text(UNFREEZE)
    r.run(script, "--flor", "unfreeze")
    proc = r.run(script, "--flor", "unfreeze", "--replay_flor", check=False)
    assert proc.returncode != 0 and "verified exact" not in proc.stderr, proc.stderr
    assert ("had 2 parameter group(s) of [2, 2] parameters at this checkpoint and has 1 of [2] now" in proc.stderr
            and "if epoch >= K and len(opt.param_groups) == 1" in proc.stderr), proc.stderr

    script.write_text(UNFREEZE.replace("        if epoch == 2:  # UNFREEZE", "        if False:").replace(
        "    # GUARD", "    if epoch >= 2 and len(opt.param_groups) == 1:\n"
        "        for q in backbone.parameters():\n            q.requires_grad_(True)\n"
        "        opt.add_param_group({'params': list(backbone.parameters()), 'lr': 0.01})"))
    r.run(script, "--flor", "guarded")
    recorded = {k: v for k, v in values(run_logs(r, "guarded")).items()}
    for worker in ("0/2", "1/2", "0/1"):
        proc = r.run(script, "--flor", "guarded", "--replay_flor", worker)
        assert "verified exact" in proc.stderr.strip().splitlines()[-1], proc.stderr
    replayed = values([x for x in run_logs(r, "guarded") if x["source"] == "replay"])
    assert replayed and all(recorded[k] == v for k, v in replayed.items())


THAW = """\\
import torch
import flor

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
for q in net[0].parameters():
    q.requires_grad_(False)
opt = torch.optim.SGD(net.parameters(), lr=0.1)  # frozen parameters get no grad, so no update
x, y = torch.randn(32, 4), torch.randn(32, 1)
for epoch in flor.it(range(6)):
    if flor.SkipBlock.step_into("train"):
        if epoch == 3:
            for q in net[0].parameters():
                q.requires_grad_(True)
        for i in range(4):
            loss = (net(x[i * 8:(i + 1) * 8]) - y[i * 8:(i + 1) * 8]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    net, opt = flor.SkipBlock.end(net, opt)
    flor.log("w", float(net[0].weight.detach().sum()))
"""


def test_requires_grad_changed_in_a_restored_block_comes_back(tmp_path):
    """Unfreezing layers inside the block (requires_grad_ only) at epoch 3, checkpoints at 0
    and 3: a replay restores epoch 3 and trains 4 and 5 again. state_dict carries no
    requires_grad, so those epochs trained the layer frozen and the replay DIVERGED, blaming
    state outside the blocks; the module's frozen parameters are kept with its checkpoint."""
    r = Runner(tmp_path)
    script = r.cwd / "thaw.py"
    script.write_text(THAW)
    r.run(script, "--flor", "thaw", env=r.env(FLOR_EVERY="3"))
    recorded = values(run_logs(r, "thaw"))
    for worker in ("0/1", "1/2"):
        proc = r.run(script, "--flor", "thaw", "--replay_flor", worker)
        assert "verified exact" in proc.stderr.strip().splitlines()[-1], proc.stderr
        assert "executed (no checkpoint): epochs" in proc.stderr, proc.stderr  # it did train again
    replayed = values([x for x in run_logs(r, "thaw") if x["source"] == "replay"])
    assert len(replayed) == 6 and all(recorded[k] == v for k, v in replayed.items())


SAMPLES = """\
import torch
import flor

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
x = torch.randn(32, 4)
for epoch in flor.it(range(4)):
    if flor.SkipBlock.step_into("train"):
        loss = net(x).pow(2).mean()  # dropout draws from torch's generator
        opt.zero_grad()
        loss.backward()
        opt.step()
    net, opt = flor.SkipBlock.end(net, opt)
    flor.log("w", float(net[0].weight.detach().sum()))
    # HINDSIGHT
"""


def test_a_hindsight_line_that_samples_outside_the_blocks_is_noted(tmp_path):
    """A hindsight line after end() that draws from torch's global generator (a random
    subset for an evaluation) changes what a full run of the edited script trains; a replay
    that restores the next block sets the recorded state instead. The replay says so (not a
    silent "verified exact" over different training); the same script, or hindsight code
    that draws from its own generator, gets no such note."""
    r = Runner(tmp_path)
    script = r.cwd / "samples.py"
    script.write_text(SAMPLES)
    r.run(script, "--flor", "samples")
    sampling = r.cwd / "sampling.py"
    sampling.write_text(SAMPLES.replace("    # HINDSIGHT", '    flor.log("pick", int(torch.randperm(32)[0]))'))
    own = r.cwd / "own.py"
    own.write_text(SAMPLES.replace("    # HINDSIGHT", "    g = torch.Generator().manual_seed(epoch)\n"
                                   '    flor.log("pick", int(torch.randperm(32, generator=g)[0]))'))
    noted = "code outside the blocks drew from the torch random generator before 'train' at epoch 1"
    proc = r.run(sampling, "--flor", "samples", "--replay_flor", check=False)
    assert noted in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]  # a condition of the verdict: not exact, exit 3
    assert proc.returncode == 3 and last.startswith("flor: replay NOT EXACT") and "FL325" in last, proc.stderr
    for quiet in (script, own):
        proc = r.run(quiet, "--flor", "samples", "--replay_flor")
        assert "FL325" not in proc.stderr and "verified exact" in proc.stderr, proc.stderr
