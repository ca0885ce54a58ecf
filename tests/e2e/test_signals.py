"""flor never holds the run hostage: SIGTERM/SIGHUP, a writer that falls behind, a bounded exit.

Real scripts in subprocesses, signalled as Slurm or Kubernetes would; replays compared value
for value with a full run of the edited script. The background writer's promises (never
blocks, abandons whole, bounded close) are tested on the class itself in
``unit/store/test_background_writer.py``, with jobs that block on purpose, so nothing here
depends on timing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path


from helpers import Runner, values
from flor.store import ExperimentStore
from flor.store.experiment import blob_hashes

EPOCHS = 12
#: toy.py, slowed down only when TOY_SLEEP is set, and printing each epoch as it ends
SLOW = {
    "    # OUTER": "    import os, time; time.sleep(float(os.environ.get('TOY_SLEEP', 0)))",
    'print(f"epoch {epoch} acc {acc:.6f} step {step}")': 'print(f"epoch {epoch} acc {acc:.6f} step {step}", flush=True)',
}
OUTER_LOG = '    flor.log("wnorm", float(sum(p.double().norm() for p in net.parameters())))'


def signalled(r: Runner, script: Path, sig: int, after_epoch: int, *args: str,
              env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` and send ``sig`` once it printed epoch ``after_epoch``."""
    # the default disposition, whatever this test runs under: a suite started with nohup passes an
    # ignored SIGHUP on, and flor rightly leaves a signal the process ignores alone
    proc = subprocess.Popen([sys.executable, str(script), "--epochs", str(EPOCHS), *args], cwd=r.cwd,
                            env=env or r.env(TOY_SLEEP="0.2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(f"epoch {after_epoch} "):
            proc.send_signal(sig)
            break
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(seen) + out, err)


def only_run(r: Runner, name: str) -> tuple[ExperimentStore, str, dict]:
    store = ExperimentStore(r.home, name)
    runs = sorted(p.name for p in (r.home / name / "runs").iterdir())
    assert len(runs) == 1
    return store, runs[0], json.loads((r.home / name / "runs" / runs[0] / "run.json").read_text())


def check_checkpoints(store: ExperimentStore, run: str, meta: dict) -> set[int]:
    """Every manifest reads and every blob it names exists and verifies; every epoch done has a
    manifest or is listed as skipped. Returns the checkpointed epochs."""
    have = set()
    for block, epoch, occ in store.manifests(run):
        manifest = store.read_manifest(run, block, epoch, occ)
        assert store.blobs.get_many(blob_hashes(manifest))  # raises on a missing or corrupt blob
        have.add(epoch)
    skipped = {s["epoch"] for s in meta["checkpoint_skipped"]} | {f["epoch"] for f in meta["checkpoint_failures"]}
    assert set(range(meta["epochs_done"])) <= have | skipped
    return have


def replay_is_exact(r: Runner, name: str, epochs_done: int) -> None:
    """A hindsight replay of the run gives what a full run of the edited script gives."""
    edited = r.script("toy.py", edits={**SLOW, "    # OUTER": OUTER_LOG}, dest="edited.py")
    proc = r.run(edited, "--epochs", str(EPOCHS), "--flor", name, "--replay_flor")
    assert "replay verified exact" in proc.stderr, proc.stderr
    r.run(edited, "--epochs", str(EPOCHS), "--flor", f"{name}-full")
    full = {k: v for k, v in values(r.logs(f"{name}-full")).items() if k[1] < epochs_done}
    got = values([x for x in r.logs(name) if x["source"] == "replay"])
    assert {k for k in got if k[0] == "wnorm"} == {("wnorm", e, None) for e in range(epochs_done)}
    assert got == full


def test_sigterm_flushes_writes_terminated_and_exits_143(runner):
    script = runner.script("toy.py", edits=SLOW)
    proc = signalled(runner, script, signal.SIGTERM, 3, "--flor", "term")
    assert proc.returncode == -signal.SIGTERM, proc.stderr  # a shell shows 143: the default action ran
    store, run, meta = only_run(runner, "term")
    assert meta["status"] == "terminated" and meta["error"] == "SIGTERM"
    assert 4 <= meta["epochs_done"] < EPOCHS
    have = check_checkpoints(store, run, meta)
    assert set(range(meta["epochs_done"])) <= have  # queued before the signal: flushed, none lost
    assert "epoch 3 acc" in (runner.home / "term" / "runs" / run / "stdout.log").read_text()
    replay_is_exact(runner, "term", meta["epochs_done"])


PARENT = """
import subprocess, sys, os
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
for line in child.stdout:
    if line.startswith(b"epoch 1 "):
        os._exit(0)  # dies as a SIGKILLed launcher would: the pipe closes, no signal is sent
"""


def test_a_run_whose_parent_died_and_closed_its_pipe_ended_terminated(runner):
    """A launcher killed outright closes its workers' output pipe before their SIGTERM
    (PR_SET_PDEATHSIG) comes, so a worker's next print may raise BrokenPipeError first: it was
    stopped with its launcher, and says "terminated" as the signal would (it said
    "BrokenPipeError"). Its parent here sends no signal at all."""
    script = runner.script("toy.py", edits=SLOW)
    parent = runner.cwd / "parent.py"
    parent.write_text(PARENT)
    subprocess.run([sys.executable, str(parent), sys.executable, str(script), "--epochs", str(EPOCHS),
                    "--flor", "orphan"], cwd=runner.cwd, env=runner.env(TOY_SLEEP="0.2"), timeout=120, check=True)
    for _ in range(600):  # the orphan ends by itself at its next print: bounded, not timed
        _, run, meta = only_run(runner, "orphan")
        if meta["status"] != "running":
            break
        time.sleep(0.1)
    assert meta["status"] == "terminated" and meta["error"] == "terminated" and meta["epochs_done"] < EPOCHS, meta


def test_sighup_ends_with_129_and_status(runner):
    script = runner.script("toy.py", edits=SLOW)
    proc = signalled(runner, script, signal.SIGHUP, 1, "--flor", "hup")
    assert proc.returncode == -signal.SIGHUP, proc.stderr
    store, run, meta = only_run(runner, "hup")
    assert meta["status"] == "terminated" and meta["error"] == "SIGHUP"
    assert set(range(meta["epochs_done"])) <= check_checkpoints(store, run, meta)


def test_the_scripts_own_sigterm_handler_still_runs(runner):
    """A preemption-aware script (handler installed before flor starts) gets its handler called
    after flor flushed, and may go on to finish its epoch and exit on its own terms."""
    script = runner.script("toy.py", edits={
        **SLOW,
        "step = 0\n": "step = 0\nimport signal\nstop = []\n"
                      "signal.signal(signal.SIGTERM, lambda s, f: (stop.append(s), print('handler called', flush=True)))\n",
        "# AFTER": "    if stop:\n        break\nprint('stopped cleanly', flush=True)",
    })
    proc = signalled(runner, script, signal.SIGTERM, 2, "--flor", "own")
    assert proc.returncode == 0, proc.stderr
    assert "handler called" in proc.stdout and "stopped cleanly" in proc.stdout
    store, run, meta = only_run(runner, "own")
    assert meta["status"] == "terminated" and meta["error"] == "SIGTERM"
    assert set(range(meta["epochs_done"])) <= check_checkpoints(store, run, meta)


def test_a_writer_that_falls_behind_skips_epochs_instead_of_blocking(runner):
    """The script holds the writer busy for epochs 0-3 (a job the size of the whole budget):
    those checkpoints are skipped with the reason, training never waits, and a replay
    re-executes them exactly."""
    script = runner.script("toy.py", edits={
        **SLOW,
        "step = 0\n": "step = 0\nimport threading, flor.runtime\nrelease = threading.Event()\n"
                      "w = flor.runtime.current().checkpoints.writer\nw.submit(release.wait, w.budget, print)\n",
        "    # OUTER": "    if epoch == 3:\n        release.set(); w.flush()",
    })
    runner.run(script, "--epochs", str(EPOCHS), "--flor", "behind", env=runner.env(FLOR_WRITER_MEMORY="64MB"))
    store, run, meta = only_run(runner, "behind")
    assert meta["status"] == "finished"
    assert meta["checkpoint_skipped"] == [
        {"epoch": e, "block": "training_loop", "reason": "writer behind"} for e in range(4)]
    assert check_checkpoints(store, run, meta) == set(range(4, EPOCHS))
    replay_is_exact(runner, "behind", EPOCHS)


CTRL_C = '''
import os, signal, sys, time
import torch
import flor


class Counter:
    """A script's own stateful helper: Ctrl-C lands while flor reads it, inside SkipBlock.end."""

    def __init__(self):
        self.n = 0

    def state_dict(self):
        if self.n == 3 and "--replay_flor" not in sys.argv:
            os.kill(os.getpid(), signal.SIGINT)  # delivered at the next bytecode, in this frame
            time.sleep(0.05)
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


torch.manual_seed(0)
net = torch.nn.Linear(4, 4)
counter = Counter()
where = "in end()"
try:
    for epoch in flor.it(range(6)):
        if flor.SkipBlock.step_into("train"):
            with torch.no_grad():
                net.weight.add_(torch.randn(4, 4))
            counter.n += 1
        where = "in end()"
        net, counter = flor.SkipBlock.end(net, counter)
        where = "after end()"
        flor.log("w", float(net.weight.detach().sum()))
        print(f"epoch {epoch} n {counter.n}", flush=True)
        time.sleep(0.5)
except KeyboardInterrupt:
    print(f"interrupted {where} at epoch {epoch}", flush=True)
    raise
'''


def test_ctrl_c_inside_flor_lands_after_its_call_returns(runner):
    """Ctrl-C while the training thread is inside flor (here: SkipBlock.end reading the script's
    own stateful object) is a KeyboardInterrupt once end() has returned, not inside it: the
    epoch's checkpoint is taken whole, the run is "interrupted", and a replay of what was
    recorded is exact."""
    script = runner.cwd / "ctrl_c.py"
    script.write_text(CTRL_C)
    # the default disposition, as in signalled(): pytest-xdist workers and `trap '' INT` pass an
    # ignored SIGINT on, and a process that ignores SIGINT has no KeyboardInterrupt to defer
    proc = subprocess.run([sys.executable, str(script), "--flor", "int"], cwd=runner.cwd, env=runner.env(),
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in proc.stderr, proc.stderr
    assert "interrupted after end() at epoch 2" in proc.stdout, proc.stdout + proc.stderr
    store, run, meta = only_run(runner, "int")
    assert meta["status"] == "interrupted"
    assert 2 in check_checkpoints(store, run, meta)  # the epoch whose end() was interrupted
    replay = runner.run(script, "--flor", "int", "--replay_flor")
    assert "replay verified exact" in replay.stderr, replay.stderr
    assert replay.stdout.splitlines() == [f"epoch {e} n {e + 1}" for e in range(meta["epochs_done"])], replay.stdout
