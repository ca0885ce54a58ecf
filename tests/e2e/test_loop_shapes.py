"""Outside-loop blocks, generators, several blocks, sparse checkpoints, crashes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from helpers import Runner, values

OUTER = {"    # OUTER": '    flor.log("w_max", w.max().item())'}


def test_outside_blocks_generators_and_two_blocks(runner: Runner):
    r = runner
    r.run(r.script("shapes.py"), "--flor", "shapes")
    edited = r.script("shapes.py", edits=OUTER, dest="edited.py")
    r.run(edited, "--flor", "full")
    expected = values(r.logs("full"))
    run = next((r.home / "shapes" / "runs").iterdir())
    assert (run / "checkpoints" / "preprocess" / "outside.json").is_file()
    assert len(list((run / "checkpoints" / "stats").iterdir())) == 5

    single = r.run(edited, "--flor", "shapes", "--replay_flor", env=r.env(FLOR_REPLAY_ID="single"))
    assert "replay verified exact" in single.stderr
    assert "preprocess: restored: outside the loop" in single.stderr
    got = values([x for x in r.logs("shapes") if x["replay"] == "single"])
    assert got == expected

    env = r.env(FLOR_REPLAY_ID="pair")
    for w in ("0/2", "1/2"):
        assert "verified exact" in r.run(edited, "--flor", "shapes", "--replay_flor", w, env=env).stderr
    logs = [x for x in r.logs("shapes") if x["replay"] == "pair"]
    assert values(logs) == expected
    # values outside the loop are reported once: before it by worker 0, after it by the last worker
    assert [(x["name"], x["worker"]) for x in logs if x["epoch"] is None] == [("features_sum", 0), ("final_norm", 1)]


def test_sparse_checkpoints_are_re_executed_never_skipped(runner: Runner):
    r = runner
    r.run(r.script(), "--epochs", "7", "--flor", "sparse", "--flor_every", "3")
    run = next((r.home / "sparse" / "runs").iterdir())
    assert sorted(p.stem for p in (run / "checkpoints" / "training_loop").iterdir()) == ["0", "3", "6"]
    edited = r.script(edits={"    # OUTER": '    flor.log("bias", net[3].bias.sum().item())'}, dest="edited.py")
    r.run(edited, "--epochs", "7", "--flor", "full")
    expected = values(r.logs("full"))
    env = r.env(FLOR_REPLAY_ID="sp")
    outs = [r.run(edited, "--epochs", "7", "--flor", "sparse", "--replay_flor", f"{w}/2", env=env) for w in range(2)]
    assert "initialization epochs 0-2" in outs[1].stderr  # from the checkpoint at 0, re-executing 1 and 2
    assert "executed (no checkpoint)" in outs[1].stderr
    assert all("verified exact" in o.stderr for o in outs)
    assert values([x for x in r.logs("sparse") if x["replay"] == "sp"]) == expected


def test_a_crash_leaves_every_earlier_checkpoint_readable(runner: Runner):
    r = runner
    script = r.script("shapes.py")
    from flor.state import restore
    from flor.store import ExperimentStore

    store = ExperimentStore(r.home, "crash")
    expected = {("preprocess", None, 0)} | {(b, e, 0) for b in ("fit", "stats") for e in range(3)}
    # the script stops in epoch 3 and waits; we kill it once epochs 0-2 are committed, so the
    # kill can never land before the checkpoints this test then expects (it did, under load)
    proc = subprocess.Popen([sys.executable, str(script), "--epochs", "6", "--crash-at", "3", "--flor", "crash"],
                            cwd=r.cwd, env=r.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "crash point" in proc.stdout.readline()
        run = next((r.home / "crash" / "runs").iterdir())
        deadline = time.monotonic() + 120
        while not expected <= set(store.manifests(run.name)):
            assert time.monotonic() < deadline, f"epochs 0-2 not committed: {sorted(store.manifests(run.name))}"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # mid-epoch 3: its checkpoint may be half written
        proc.communicate(timeout=60)
    finally:
        proc.kill()  # no-op once it is dead; never leave it sleeping
    assert proc.returncode == -9
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "running" and meta["epochs_done"] == 3  # killed: no chance to say more
    found = list(store.manifests(run.name))
    assert expected <= set(found)
    for block, epoch, occ in found:  # every committed checkpoint reads back with verified blobs
        manifest = store.read_manifest(run.name, block, epoch, occ)
        restore([None] * manifest["count"], manifest["objects"], store.blobs.get)
    # a replay of the crashed run restores what was committed and says what it could not know
    rep = r.run(script, "--epochs", "6", "--crash-at", "3", "--flor", "crash", "--replay_flor", "1/2")
    assert "the recording did not finish (its process is gone" in rep.stderr
    assert "the recording ended after 3 epochs (its process is gone); replaying those" in rep.stderr
    assert "fit: restored: epochs 1-2" in rep.stderr and "verified exact" in rep.stderr


def test_adaptive_policy_thins_checkpoints_and_replay_stays_exact(runner: Runner):
    """With a tiny overhead budget most epochs go without a checkpoint; the schedule is in
    run.json, the manifests match it, and a 2-worker replay still equals a full re-execution."""
    r = runner
    env = r.env(FLOR_OVERHEAD="0.0005")
    env.pop("FLOR_EVERY")
    proc = r.run(r.script(), "--epochs", "6", "--flor", "adaptive", env=env)
    assert "flor: FL121 checkpointed" in proc.stderr and "--flor_overhead" in proc.stderr
    run = next((r.home / "adaptive" / "runs").iterdir())
    policy = json.loads((run / "run.json").read_text())["checkpoint_policy"]
    assert policy["mode"] == "adaptive" and policy["overhead_budget"] == 0.0005
    assert policy["checkpointed_epochs"][0] == 0 and policy["skipped_epochs"]
    assert sorted(policy["checkpointed_epochs"] + policy["skipped_epochs"]) == list(range(6))
    stems = sorted(int(p.stem) for p in (run / "checkpoints" / "training_loop").iterdir())
    assert stems == policy["checkpointed_epochs"]
    edited = r.script(edits={"    # OUTER": '    flor.log("bias", net[3].bias.sum().item())'}, dest="edited.py")
    r.run(edited, "--epochs", "6", "--flor", "full")
    env = r.env(FLOR_REPLAY_ID="ad")
    for w in ("0/2", "1/2"):
        assert "verified exact" in r.run(edited, "--epochs", "6", "--flor", "adaptive", "--replay_flor", w, env=env).stderr
    assert values([x for x in r.logs("adaptive") if x["replay"] == "ad"]) == values(r.logs("full"))
