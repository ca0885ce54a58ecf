"""``flor replay NAME --all``: a 2 learning rates x 2 seeds sweep, two runs recorded with an
older script (another augmentation), replayed in one command with today's new metrics; every
value equals a full re-execution of that run's own script version with the metrics added.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import defaultdict

import pytest

from helpers import Runner
from flor.store.runlogs import read_run_logs

EPOCHS = "3"
AUG = "xb = xb + 0.01 * torch.from_numpy"
OLDER = {}  # toy.py as it is: noise 0.01
CURRENT = {AUG: "xb = xb + 0.03 * torch.from_numpy"}  # the training code changed since
# today's logging: a per-epoch metric in the outer loop, a per-step one in the probed block
TODAY = {**CURRENT,
         'step_into("training_loop")': 'step_into("training_loop", probed=True)',
         "            # INNER": '            flor.log("batch_loss", loss.item())',
         "    # OUTER": '    flor.log("wnorm", float(sum(p.detach().double().norm() for p in net.parameters())))'}
NEW_METRICS = ("batch_loss", "wnorm")
# a full re-execution prints every value flor.log is given (flor itself is inert there)
PRINT_LOGS = {"import flor\n": "import flor\nflor.log = lambda n, v, step=None: (print('HS', n, repr(v)), v)[1]\n"}
SWEEP = [("0.01", "0"), ("0.01", "1"), ("0.05", "0"), ("0.05", "1")]


def _printed(proc: subprocess.CompletedProcess) -> dict[str, list]:
    out = defaultdict(list)
    for line in proc.stdout.splitlines():
        if line.startswith("HS "):
            _, name, value = line.split(" ", 2)
            out[name].append(eval(value))  # repr of a float: exact
    return out


def _replayed(r: Runner, name: str, run: str) -> dict[str, list]:
    out = defaultdict(list)
    for x in read_run_logs(r.home / name / "runs" / run, run):
        if x["source"] == "replay":
            out[x["name"]].append(x["value"])
    return out


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    r = Runner(tmp_path_factory.mktemp("sweep"))
    for i, (lr, seed) in enumerate(SWEEP):  # two runs with the older script, two with the current one
        r.script(edits=OLDER if i < 2 else CURRENT, dest="train.py")
        r.run(r.cwd / "train.py", "--epochs", EPOCHS, "--lr", lr, "--seed", seed, "--flor", "sweep")
    runs = sorted(p.name for p in (r.home / "sweep" / "runs").iterdir())
    full = {}  # each run's own version with today's metrics, run in full without flor
    for i, (lr, seed) in enumerate(SWEEP):
        edits = {**TODAY, **PRINT_LOGS}
        if i < 2:
            edits.pop(AUG)
        full[runs[i]] = _printed(r.run(r.script(edits=edits, dest=f"full{i}.py"), "--epochs", EPOCHS,
                                       "--lr", lr, "--seed", seed))
    r.script(edits=TODAY, dest="train.py")
    proc = subprocess.run([sys.executable, "-m", "flor", "replay", "sweep", "--all", "--workers", "2", "--",
                           sys.executable, "train.py"], cwd=r.cwd, env=r.env(), capture_output=True, text=True,
                          timeout=600)
    return r, runs, full, proc


def test_one_command_replays_every_run_with_its_own_script_version(sweep):
    r, runs, full, proc = sweep
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for run in runs:
        got, want = _replayed(r, "sweep", run), full[run]
        for name in NEW_METRICS:
            assert len(want[name]) == (3 * 6 if name == "batch_loss" else 3)
            assert got[name] == want[name], (run, name)
        assert got["acc"] == want["acc"]  # verified against the recording too
    # the older runs really trained differently: the same seed and lr, other values
    assert full[runs[0]]["batch_loss"] != _replayed(r, "sweep", runs[2])["batch_loss"]
    # one table: run, hyperparameters, script version, verdict, the last hindsight values
    table = proc.stdout
    head = next(line for line in table.splitlines() if line.startswith("run "))
    assert head.split() == ["run", "lr", "seed", "script", "verdict", "batch_loss", "wnorm"]
    for i, run in enumerate(runs):
        row = next(line for line in table.splitlines() if line.startswith(run))
        assert ("(recorded+log)" if i < 2 else "(today)") in row and "verified exact" in row
        assert f"{full[run]['wnorm'][-1]:.6g}" in row
    assert "flor: sweep: 4 replayed; exit status 0" in table
    assert "[r0 w0]" in proc.stdout  # the workers' output, named by run
    # the transplanted script is kept with the run, and flor logs says which version each value came from
    kept = list((r.home / "sweep" / "runs" / runs[0] / "transplants").glob("*/train.py"))
    assert len(kept) == 1 and "0.01 * torch" in kept[0].read_text() and "batch_loss" in kept[0].read_text()
    logs = [json.loads(x) for x in r.flor("logs", "sweep", "--run", runs[0]).stdout.splitlines() if x.strip()]
    meta = json.loads((r.home / "sweep" / "runs" / runs[0] / "run.json").read_text())
    assert {x["script"] for x in logs if x["source"] == "record"} == {meta["script_sha256"][:12]}
    assert {x["script"] for x in logs if x["source"] == "replay"} == {kept[0].parent.name}


def test_compare_ranks_the_sweep_on_a_hindsight_metric(sweep):
    r, runs, full, _ = sweep
    out = r.flor("compare", "sweep", "--by", "lr", "--metric", "wnorm").stdout
    assert "wnorm: final value of each run, grouped by lr" in out and "4 runs" in out
    for lr in ("0.01", "0.05"):
        mine = [full[run]["wnorm"][-1] for run, (l, _) in zip(runs, SWEEP) if l == lr]
        row = next(line for line in out.splitlines()[2:] if line.split()[1] == lr)
        assert f"{sum(mine) / 2:.5g}" in row


def test_dry_run_prints_each_older_runs_patch(sweep):
    r, runs, _, _ = sweep
    out = r.flor("replay", "sweep", "--all", "--dry-run", "--", sys.executable, "train.py").stdout
    assert f"run {runs[0]} (epochs=3 lr=0.01 seed=0): recorded script + today's logging" in out
    assert f"run {runs[2]} (epochs=3 lr=0.05 seed=0): today's script" in out
    assert "+            flor.log('batch_loss', loss.item())" in out and '+    flor.log(\'wnorm\'' in out
    assert out.count("--- a/train.py") == 2


def test_a_run_whose_logging_cannot_be_placed_is_skipped_and_the_others_go_on(tmp_path):
    r = Runner(tmp_path)
    r.script(edits={"            step += 1": "            step = step + 1"}, dest="train.py")  # the anchor, changed
    r.run(r.cwd / "train.py", "--epochs", "2", "--flor", "mixed")
    r.script(edits=CURRENT, dest="train.py")
    r.run(r.cwd / "train.py", "--epochs", "2", "--flor", "mixed")
    runs = sorted(p.name for p in (r.home / "mixed" / "runs").iterdir())
    r.script(edits=TODAY, dest="train.py")
    proc = subprocess.run([sys.executable, "-m", "flor", "replay", "mixed", "--where", "epochs=2", "--", sys.executable,
                           "train.py"], cwd=r.cwd, env=r.env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"flor: run {runs[0]} skipped: its script is an older version, and cannot place "
            "`flor.log('batch_loss', loss.item())` (line 44 of today's script): its anchor `step += 1` "
            "is not in the older script") in proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith(tuple(runs))}
    assert "skipped" in rows[runs[0]] and "verified exact" in rows[runs[1]]
    assert "flor: sweep: 1 replayed, 1 skipped; exit status 1" in proc.stdout
    assert _replayed(r, "mixed", runs[1])["wnorm"] and not _replayed(r, "mixed", runs[0])


def test_an_interrupted_sweep_counts_its_queued_runs_as_not_done_and_resumes_them(tmp_path):
    """Ctrl-C while one run replays and the next waits in the queue: the queued run's launch was
    concluded with no worker, so it counted as replayed and its record said 'finished' (an
    interruption between two runs exited 0). Now every run not done is failed, the exit status
    is 1, and the same command replays both, each epoch once."""
    r = Runner(tmp_path)
    r.script(edits={"    # OUTER": "    __import__('time').sleep(0.3)",
                    'step {step}")': 'step {step}", flush=True)'}, dest="train.py")
    for seed in ("0", "1"):
        r.run(r.cwd / "train.py", "--epochs", EPOCHS, "--seed", seed, "--flor", "stop")
    runs = sorted(p.name for p in (r.home / "stop" / "runs").iterdir())
    r.script(edits={"    # OUTER": "    __import__('time').sleep(0.3)\n" + TODAY["    # OUTER"],
                    'step {step}")': 'step {step}", flush=True)'}, dest="train.py")
    cmd = [sys.executable, "-m", "flor", "replay", "stop", "--all", "--workers", "1", "--", sys.executable, "train.py"]
    proc = subprocess.Popen(cmd, cwd=r.cwd, env=r.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("[r0 w0] epoch 0 "):
            proc.send_signal(signal.SIGINT)
            break
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "flor: sweep: 2 failed; exit status 1" in out and "(today)  failed   -" in out
    assert "worker 0 (epochs 0-2) failed: not started" in out
    records = [json.loads(p.read_text()) for run in runs for p in (r.home / "stop" / "runs" / run / "logs").glob("launch-*")]
    assert sorted(x["status"] for x in records) == ["failed", "failed"]
    again = subprocess.run(cmd, cwd=r.cwd, env=r.env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "flor: sweep: 2 replayed; exit status 0" in again.stdout, again.stdout + again.stderr
    assert again.stderr.count("resuming: 1 of 1 segments left") == 2
    for run in runs:
        assert len(_replayed(r, "stop", run)["wnorm"]) == 3


def test_a_run_without_epochs_is_refused_alone_and_skipped_in_a_sweep(tmp_path):
    """A recording that finished no epoch (its loop ran 0 times, or it crashed in the first) was
    launched with one worker that replayed nothing: 'replay FAILED (1 of 1 workers did not
    finish)' under exit status 0, and in a sweep a 'failed' row counted as replayed. Now one line
    and exit 2 alone; skipped with the reason in a sweep (exit 1)."""
    r = Runner(tmp_path)
    (r.cwd / "empty.py").write_text("import sys\nimport flor\nfor epoch in flor.it(range(int(sys.argv[1]))):\n    pass\n")
    r.run(r.cwd / "empty.py", "0", "--flor", "empty")
    run = next((r.home / "empty" / "runs").iterdir()).name
    alone = r.flor("replay", "empty", "--", sys.executable, "empty.py", "0", check=False)
    assert alone.returncode == 2 and alone.stderr == (
        f"flor: error: run {run} of empty recorded no finished epoch (status finished): there is nothing to replay; "
        f"`flor show empty {run}` shows what it recorded\n"), alone.stderr
    sweep = r.flor("replay", "empty", "--all", "--", sys.executable, "empty.py", check=False)
    assert sweep.returncode == 1, sweep.stdout + sweep.stderr
    assert f"flor: run {run} skipped: it recorded no finished epoch (status finished)" in sweep.stderr
    assert "flor: sweep: 1 skipped; exit status 1" in sweep.stdout
    assert not list((r.home / "empty" / "runs" / run / "logs").glob("launch-*"))  # nothing launched


def test_the_same_command_again_shows_the_sweep_without_replaying_it(sweep):
    """Every launch of the sweep finished, so the same command replayed every run again (a
    50-run sweep interrupted at its last run started over). Now each run replayed before by the
    same command keeps its results: the same table, no worker, no new replay; --fresh starts over."""
    r, runs, full, first = sweep
    before = sorted(p.name for run in runs for p in (r.home / "sweep" / "runs" / run / "logs").glob("launch-*"))
    again = subprocess.run([sys.executable, "-m", "flor", "replay", "sweep", "--all", "--workers", "2", "--",
                            sys.executable, "train.py"], cwd=r.cwd, env=r.env(), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stderr.count("done before by the same command, its results stand") == 4
    assert "[r0 w0]" not in again.stdout
    table = [line for line in first.stdout.splitlines() if not line.startswith("[r")]
    assert [line for line in again.stdout.splitlines() if not line.startswith("[r")] == table
    assert sorted(p.name for run in runs for p in (r.home / "sweep" / "runs" / run / "logs").glob("launch-*")) == before
