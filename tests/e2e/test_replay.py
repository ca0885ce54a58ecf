"""Record a real training script, edit it, replay, and compare with a full re-execution.

Every comparison is value-for-value and bit-identical: the replayed hindsight values must
be exactly what running the edited script from scratch gives.
"""

from __future__ import annotations

import json
import shutil

import pytest

from helpers import OUTER_LOG, PROBED_LOG, Runner, values

EPOCHS = 6


@pytest.fixture(scope="module")
def rec(tmp_path_factory) -> Runner:
    """One recording of toy.py, plus full re-executions of each edited script."""
    r = Runner(tmp_path_factory.mktemp("rec"))
    r.run(r.script(), "--epochs", str(EPOCHS), "--flor", "toy")
    for tag, edits in (("outer", OUTER_LOG), ("probed", PROBED_LOG)):
        r.run(r.script(edits=edits, dest=f"{tag}.py"), "--epochs", str(EPOCHS), "--flor", f"full-{tag}")
    return r


def full(r: Runner, tag: str) -> dict:
    return values(r.logs(f"full-{tag}"), "record")


def latest_replay(r: Runner) -> list[dict]:
    logs = [x for x in r.logs("toy") if x["source"] == "replay"]
    newest = max(x["replay"] for x in logs)
    return [x for x in logs if x["replay"] == newest]


def test_record_writes_the_run(rec):
    runs = list((rec.home / "toy" / "runs").iterdir())
    assert len(runs) == 1
    run = runs[0]
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "finished" and meta["epochs_done"] == EPOCHS
    assert meta["torch_threads"] == 1 and meta["argv"][1:] == ["--epochs", str(EPOCHS)]
    assert (run / "source" / "toy.py").read_text() == (rec.cwd / "toy.py").read_text()
    ckpts = sorted(p.name for p in (run / "checkpoints" / "training_loop").iterdir())
    assert ckpts == sorted(f"{e}.json" for e in range(EPOCHS))
    manifest = json.loads((run / "checkpoints" / "training_loop" / "0.json").read_text())
    assert set(manifest["rng"]["k"]) == {"python", "numpy", "torch"}
    assert "epoch 5 acc" in (run / "stdout.log").read_text()
    logs = rec.logs("toy")
    assert {(x["name"], x["epoch"]) for x in logs} == {(n, e) for n in ("acc", "jitter", "step") for e in range(EPOCHS)}
    assert all(x["source"] == "record" and x["step"] is None for x in logs)
    # the store holds no absolute paths: it can be moved
    for p in (rec.home / "toy").rglob("*.json"):
        if p.name != "run.json":
            assert str(rec.home) not in p.read_text()


def test_record_matches_a_plain_run(rec):
    plain = rec.run(rec.cwd / "toy.py", "--epochs", str(EPOCHS), env=rec.env(FLOR_HOME=str(rec.cwd / "unused")))
    recorded = (next((rec.home / "toy" / "runs").iterdir()) / "stdout.log").read_text()
    assert plain.stdout == recorded
    assert not (rec.cwd / "unused").exists()  # inert: no files


def test_outer_loop_hindsight_log(rec):
    proc = rec.run(rec.cwd / "outer.py", "--epochs", str(EPOCHS), "--flor", "toy", "--replay_flor")
    assert "replay verified exact" in proc.stderr
    assert f"{EPOCHS} blocks restored" in proc.stderr
    got = values(latest_replay(rec))
    expected = full(rec, "outer")
    assert {k for k in got if k[0] == "wnorm"} == {("wnorm", e, None) for e in range(EPOCHS)}
    assert got == expected  # wnorm, acc, jitter and step, bit for bit


def test_probed_inner_loop_log(rec):
    proc = rec.run(rec.cwd / "probed.py", "--epochs", str(EPOCHS), "--flor", "toy", "--replay_flor")
    assert "replay verified exact" in proc.stderr and f"{EPOCHS} executed and checked (0 diverged)" in proc.stderr
    got = values(latest_replay(rec))
    expected = full(rec, "probed")
    assert len([k for k in got if k[0] == "loss"]) == EPOCHS * 6
    assert got == expected


@pytest.mark.parametrize("tag", ["outer", "probed"])
def test_two_worker_parallel_replay(rec, tag):
    env = rec.env(FLOR_REPLAY_ID=f"par{tag}")
    outs = [rec.run(rec.cwd / f"{tag}.py", "--epochs", str(EPOCHS), "--flor", "toy", "--replay_flor", f"{w}/2", env=env)
            for w in range(2)]
    assert all("replay verified exact" in o.stderr for o in outs)
    assert "initialization epochs 2-2" in outs[1].stderr
    logs = [x for x in rec.logs("toy") if x["replay"] == f"par{tag}"]
    epochs = sorted((x["epoch"], x["worker"]) for x in logs if x["name"] == "acc")
    assert epochs == [(e, 0 if e < EPOCHS // 2 else 1) for e in range(EPOCHS)]  # each epoch exactly once
    assert values(logs) == full(rec, tag)


def test_moved_store_still_replays(rec, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.copytree(rec.home, moved)
    proc = rec.run(rec.cwd / "outer.py", "--epochs", str(EPOCHS), "--flor", "toy", "--replay_flor", "1/2",
                   env=rec.env(FLOR_HOME=str(moved)))
    assert "replay verified exact" in proc.stderr


def test_thread_count_is_taken_from_the_recording(rec):
    proc = rec.run(rec.cwd / "outer.py", "--epochs", str(EPOCHS), "--flor", "toy", "--replay_flor", "1/2",
                   env=rec.env(OMP_NUM_THREADS="2", FLOR_REPLAY_ID="threads"))
    assert "using 1 torch threads as recorded" in proc.stderr
    assert "replay verified exact" in proc.stderr
    logs = [x for x in rec.logs("toy") if x["replay"] == "threads"]
    assert values(logs) == {k: v for k, v in full(rec, "outer").items() if k[1] >= EPOCHS // 2}


def test_changed_arguments_and_code_are_reported(rec):
    script = rec.script(edits={"xb + 0.01": "xb + 0.02"}, dest="changed.py")
    proc = rec.run(script, "--epochs", str(EPOCHS), "--lr", "0.01", "--flor", "toy", "--replay_flor",
                   "--flor_run", "2026", check=False)
    assert "changed by more than logging" in proc.stderr
    assert "arguments differ from the recording" in proc.stderr


def test_divergence_exits_3_unless_lenient(tmp_path):
    """An optimizer stepped inside the block but not passed to end() makes a worker that
    starts mid-run diverge; the summary names the epoch, block, tensors and the cause, and
    the worker exits 3 (a pipeline fails) unless --flor_lenient/FLOR_LENIENT asks for 0."""
    r = Runner(tmp_path)
    edits = {"net, optimizer, scheduler, step = flor.SkipBlock.end(net, optimizer, scheduler, step)":
             "net, scheduler, step = flor.SkipBlock.end(net, scheduler, step)"}
    r.run(r.script(edits=edits, dest="leaky.py"), "--epochs", "4", "--flor", "leaky")
    probed = r.script(edits={**edits, 'step_into("training_loop")': 'step_into("training_loop", probed=True)'},
                      dest="leaky_probed.py")
    proc = r.run(probed, "--epochs", "4", "--flor", "leaky", "--replay_flor", "1/2", check=False)
    assert proc.returncode == 3
    assert "DIVERGED at epoch 2, block 'training_loop'" in proc.stderr
    assert "end() argument 0 (Sequential).0.weight" in proc.stderr
    assert "an object changed inside the block was not passed to end()" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("flor: replay DIVERGED") and last.endswith("exit status 3 (--flor_lenient keeps 0)")
    strict = r.run(probed, "--epochs", "4", "--flor", "leaky", "--replay_flor", "1/2", "--flor_strict", check=False)
    assert strict.returncode == 3
    lenient = r.run(probed, "--epochs", "4", "--flor", "leaky", "--replay_flor", "1/2", "--flor_lenient")
    assert lenient.stderr.strip().splitlines()[-1].endswith("exit status 0 (--flor_lenient)")
    by_env = r.run(probed, "--epochs", "4", "--flor", "leaky", "--replay_flor", "1/2", env=r.env(FLOR_LENIENT="1"))
    assert "flor: replay DIVERGED" in by_env.stderr
    # the same replay on the unchanged script passes strict mode
    r.run(r.script(dest="ok.py"), "--epochs", "4", "--flor", "ok")
    ok = r.run(r.script(edits={'step_into("training_loop")': 'step_into("training_loop", probed=True)'},
                        dest="ok_probed.py"), "--epochs", "4", "--flor", "ok", "--replay_flor", "1/2", "--flor_strict")
    assert ok.returncode == 0 and "verified exact" in ok.stderr


def test_a_replay_of_a_live_recording_says_so_once_and_covers_its_finished_epochs(tmp_path):
    import subprocess
    import sys
    import time

    runner = Runner(tmp_path)
    slow = {"    # OUTER": "    if __import__('os').environ.get('SLOW') and epoch >= 2:\n"
                          "        __import__('time').sleep(300)"}
    script = runner.script(edits=slow)
    rec = subprocess.Popen([sys.executable, str(script), "--epochs", "6", "--flor", "live"], cwd=runner.cwd,
                           env=runner.env(SLOW="1"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until run.json says 2 epochs done (the third sleeps)
            found = list((runner.home / "live" / "runs").glob("*/run.json"))
            if found and json.loads(found[0].read_text()).get("epochs_done") == 2:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the recording never finished 2 epochs")
        rep = runner.run(script, "--epochs", "6", "--flor", "live", "--replay_flor")
        assert rep.stderr.count("the recording is still running") == 1, rep.stderr  # (it was said twice)
        assert "replaying the 2 epochs it has finished" in rep.stderr and "epochs 0-1" in rep.stderr, rep.stderr
        assert "replay verified exact" in rep.stderr, rep.stderr
    finally:
        rec.kill()
        rec.wait()
