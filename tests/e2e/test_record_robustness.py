"""flor never hurts the run it records: full disks, odd values, threads, forked children, blocks
left open, stale temp files.

Each test runs a real script in a subprocess, as a user would, and checks what the user
sees: the exit status, what was printed, run.json, the logs, and that a replay of what was
recorded gives the recorded values.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import Runner, said

from flor.store.experiment import ExperimentStore, dir_size


def _run_json(home: Path, name: str) -> dict:
    runs = sorted((home / name / "runs").iterdir())
    return json.loads((runs[-1] / "run.json").read_text())


def _records(home: Path, name: str, pattern: str = "record.jsonl") -> list[dict]:
    runs = sorted((home / name / "runs").iterdir())
    out = []
    for path in sorted((runs[-1] / "logs").glob(pattern)):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def _verdict(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


# -- flor.log takes anything ----------------------------------------------------------

ODD = '''
import numpy as np
import torch
import flor

torch.manual_seed(0)
net = torch.nn.Linear(2, 1)
flor.log("before", np.float32(0.5), step=np.int64(0))  # outside the loop, before it
for epoch in flor.it(range(3)):
    if flor.SkipBlock.step_into("train", probed=PROBED):
        flor.log("inside", torch.tensor(epoch * 1.5))  # inside a block
        with torch.no_grad():
            net.weight.add_(1.0)
    net = flor.SkipBlock.end(net)
    for i in range(3):
        flor.log("np_step", float(i), step=np.int64(i))
        flor.log("tensor_step", i, step=torch.tensor(i))
        flor.log("float_step", np.float64(i) / 2, step=float(i))  # a whole float step becomes an int
        flor.log("frac_step", 1.0, step=i + 0.5)  # dropped: a step is a whole number
        flor.log("bool_value", np.bool_(i % 2 == 0), step=i)
        flor.log("object", object(), step=i)  # dropped: not a scalar
        flor.log(("not", "a", "name"), 1.0)  # dropped: names are strings
        flor.log("vector", torch.zeros(3), step=i)  # dropped: not one element
    print(f"epoch {epoch} weight {net.weight.sum().item():.4f}")
flor.log("after", torch.tensor(7), step=torch.tensor(3.0))  # outside the loop, after it
'''


def test_odd_values_and_steps_are_coerced_or_dropped_never_raised(runner: Runner):
    script = runner.cwd / "odd.py"
    script.write_text(ODD.replace("PROBED", "False"))
    plain = runner.run(script, env=runner.env())
    proc = runner.run(script, "--flor", "odd")
    assert proc.stdout == plain.stdout  # the script's results are exactly those without flor
    meta = _run_json(runner.home, "odd")
    assert meta["status"] == "finished"
    recs = _records(runner.home, "odd")
    by_name: dict[str, list] = {}
    for r in recs:
        by_name.setdefault(r["name"], []).append(r)
    assert set(by_name) == {"before", "inside", "np_step", "tensor_step", "float_step", "bool_value", "after"}
    assert [(r["step"], r["value"]) for r in by_name["np_step"][:3]] == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert all(type(r["step"]) is int for r in recs if r["step"] is not None)
    assert [r["step"] for r in by_name["float_step"][:3]] == [0, 1, 2]
    assert [r["value"] for r in by_name["bool_value"][:3]] == [True, False, True]
    assert [r["value"] for r in by_name["inside"]] == [0.0, 1.5, 3.0] and by_name["inside"][0]["block"] == "train"
    assert by_name["before"] == [{**by_name["before"][0], "value": 0.5, "step": 0, "loop": "before"}]
    assert by_name["after"][0]["value"] == 7 and by_name["after"][0]["step"] == 3 and by_name["after"][0]["loop"] == "after"
    # one warning per log name and kind, each naming the log and the type
    for needle in ("flor.log('frac_step', ..., step=...) got the step 0.5 (float)", "flor.log('object', ...) got a object",
                   "got a tuple as its name", "flor.log('vector', ...) got a Tensor"):
        assert proc.stderr.count(needle) == 1, (needle, proc.stderr)

    # replay, the block restored, then probed (executed, logging inside it): the same values
    replay = runner.run(script, "--flor", "odd", "--replay_flor")
    assert "verified exact" in _verdict(replay.stderr) and replay.stdout == plain.stdout
    script.write_text(ODD.replace("PROBED", "True"))
    probed = runner.run(script, "--flor", "odd", "--replay_flor")
    assert "verified exact" in _verdict(probed.stderr), probed.stderr
    replayed = _records(runner.home, "odd", "replay-*.jsonl")
    inside = [r["value"] for r in replayed if r["name"] == "inside"]
    assert inside[-3:] == [0.0, 1.5, 3.0]
    assert {r["name"] for r in replayed} >= {"before", "after", "np_step"}


THREADS = '''
import threading
import torch
import flor

N = 3000
net = torch.nn.Linear(2, 1)
pending = []


def work(t):
    for i in range(N):
        flor.log(f"t{t}", i * 0.5, step=i)


for epoch in flor.it(range(3)):
    if flor.SkipBlock.step_into("train"):
        with torch.no_grad():
            net.weight.add_(1.0)
    net = flor.SkipBlock.end(net)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:  # still logging when this epoch ends and flushes
        th.start()
    pending += threads
    for i in range(N):  # the training thread logs too, while the others do
        flor.log("main", i, step=i)
for th in pending:
    th.join()
print("done")
'''


def test_threads_logging_while_epochs_flush_lose_and_duplicate_nothing(runner: Runner):
    script = runner.cwd / "threads.py"
    script.write_text(THREADS)
    runner.run(script, "--flor", "threads")
    recs = _records(runner.home, "threads")
    assert len(recs) == 5 * 3 * 3000  # one record per call: none lost, none twice
    for name in ("main", "t0", "t1", "t2", "t3"):
        steps = sorted(r["step"] for r in recs if r["name"] == name)
        assert steps == sorted(list(range(3000)) * 3), name
    main = [(r["epoch"], r["step"]) for r in recs if r["name"] == "main"]
    assert sorted(main) == [(e, i) for e in range(3) for i in range(3000)]


# -- a full disk -----------------------------------------------------------------------

FULL = '''
import torch
import flor

torch.manual_seed(0)
net = torch.nn.Linear(256, 256)  # 257 KB of parameters, and Adam's state twice that: ~770 KB a checkpoint
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
x = torch.randn(64, 256)
for epoch in flor.it(range(8)):
    if flor.SkipBlock.step_into("train"):
        for _ in range(3):
            loss = net(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    net, opt = flor.SkipBlock.end(net, opt)
    with torch.no_grad():
        value = net(x).pow(2).mean().item()
    flor.log("value", value)
    print(f"epoch {epoch} value {value:.8f}", flush=True)
'''


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MB filesystem (tmpfs, when the tests run as root), else a 128 KB limit on every file
    the script writes (RLIMIT_FSIZE, SIGXFSZ ignored so that writes fail with EFBIG): then the
    256x256 weight's blob never fits, and no checkpoint is saved at all."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = False
    if os.geteuid() == 0 and shutil.which("mount"):
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                                 capture_output=True).returncode == 0

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 17, 1 << 17))

    yield mnt, (None if mounted else limit)
    if mounted:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_training_completes_and_replay_of_what_exists_is_exact(runner: Runner, small_disk, tmp_path: Path):
    mnt, preexec = small_disk
    script = runner.cwd / "full.py"
    script.write_text(FULL)
    plain = runner.run(script)
    env = runner.env(FLOR_HOME=str(mnt / "home"))
    proc = subprocess.run([sys.executable, str(script), "--flor", "full"], cwd=runner.cwd, env=env,
                          capture_output=True, text=True, timeout=300, preexec_fn=preexec)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout  # every epoch ran, with the results it has without flor
    warned = [line.split("RuntimeWarning: flor: ", 1)[1].split(" failed (")[0] for line in proc.stderr.splitlines()
              if "RuntimeWarning: flor: " in line]  # "checkpoint of block 'train' at epoch 2", "writing run.json"
    kinds = [re.sub(r" at epoch \d+", "", w) for w in warned]
    assert warned and len(kinds) == len(set(kinds)), proc.stderr  # one warning per kind, not one per epoch
    meta = _run_json(mnt / "home", "full")
    assert meta["status"] == "finished" and meta["epochs_done"] == 8
    failed = {f["epoch"] for f in meta["checkpoint_failures"]}
    assert failed and failed <= set(range(8)), meta["checkpoint_failures"]
    store = ExperimentStore(mnt / "home", "full")
    saved = {e for _, e, _ in store.manifests(meta["run"])}
    assert (saved or preexec is not None) and saved.isdisjoint(failed) and saved | failed == set(range(8))
    leftovers = [p for p in (mnt / "home").rglob(".tmp-*")]
    assert leftovers == []  # a failed write takes no space
    assert meta["write_failures"] == {} or set(meta["write_failures"]) <= {"logs", "run.json", "stdout", "stdout marks"}
    ls = subprocess.run([sys.executable, "-m", "flor", "ls", "full"], cwd=runner.cwd, env=env, capture_output=True,
                        text=True, timeout=120)
    assert ls.returncode == 0 and "finished" in ls.stdout, ls.stderr

    # replay what exists (a copy off the full disk): the recorded values, exactly
    shutil.copytree(mnt / "home", tmp_path / "copy")
    replay = runner.run(script, "--flor", "full", "--replay_flor", env=runner.env(FLOR_HOME=str(tmp_path / "copy")))
    assert replay.stdout == plain.stdout
    assert "verified exact" in _verdict(replay.stderr), replay.stderr
    assert f"{len(failed)} re-executed without a checkpoint" in replay.stderr


def test_a_replay_whose_logs_cannot_be_written_still_checks_its_values(runner: Runner):
    """A replay against a store it cannot write (every file the replay writes limited to 1
    byte, as a full disk or read-only store does): the values it logs are still compared with
    the recorded ones, from memory. An edited script that logs other values is DIVERGED (exit
    3), not "verified exact" over the nothing that reached the disk; the same script's values
    are all equal, but not stored: NOT EXACT for that reason alone (FL330), exit 1."""
    script = runner.cwd / "full.py"
    script.write_text(FULL.replace("256", "8"))
    runner.run(script, "--flor", "ro")

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1, 1))

    def replay(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(path), "--flor", "ro", "--replay_flor"], cwd=runner.cwd,
                              env=runner.env(), capture_output=True, text=True, timeout=300, preexec_fn=limit)

    same = replay(script)
    assert same.returncode == 1, same.stderr
    verdict = _verdict(same.stderr)
    assert "NOT EXACT" in verdict and "FL330" in verdict and "8/8 shared log values equal" in same.stderr, same.stderr
    assert said(same.stderr, "FL330", "8 of this worker's logged values"), same.stderr
    edited = runner.cwd / "edited.py"
    edited.write_text(FULL.replace("256", "8").replace('flor.log("value", value)', 'flor.log("value", value + 1.0)'))
    bad = replay(edited)
    assert bad.returncode == 3, bad.stderr
    assert "DIVERGED" in _verdict(bad.stderr) and "0/8 shared log values equal" in bad.stderr, bad.stderr


FORK = '''
import glob, json, os, signal, sys, time
import torch
import flor

torch.manual_seed(0)
net = torch.nn.Linear(4, 4)
for epoch in flor.it(range(4)):
    if flor.SkipBlock.step_into("train"):
        with torch.no_grad():
            net.weight.add_(torch.randn(4, 4))
        if epoch == 1:
            for how in ("exit", "term"):
                pid = os.fork()
                if pid == 0:  # a helper process of the script's own: it does its job and ends
                    if how == "term":
                        time.sleep(60)  # ended by SIGTERM from the parent
                    sys.exit(0)
                if how == "term":
                    time.sleep(0.3)
                    os.kill(pid, signal.SIGTERM)
                t0 = time.time()
                _, status = os.waitpid(pid, 0)
                took = time.time() - t0
                runs = sorted(glob.glob(os.path.join(os.environ["FLOR_HOME"], "fork", "runs", "*")))
                if runs:  # recording (a plain run has none)
                    with open(os.path.join(runs[-1], "run.json")) as fh:
                        meta = json.load(fh)
                    print(f"child {how}: status {status} in {took:.1f} s; run {meta['status']}", file=sys.stderr,
                          flush=True)
    net = flor.SkipBlock.end(net)
    w = float(net.weight.detach().sum())
    flor.log("w", w)
    print(f"epoch {epoch} w {w:.6f}", flush=True)
'''


def test_a_forked_child_that_exits_leaves_the_parents_run_alone(runner: Runner):
    """A script that forks a helper (os.fork) which ends with sys.exit, or is sent SIGTERM:
    the child inherits flor's session, atexit hooks and signal handlers, but must not close
    the parent's run (mark it finished, close its open block, wait on a writer thread the
    child does not have). The child ends at once, the run goes on, every epoch is
    checkpointed, and the replay is exact."""
    script = runner.cwd / "fork.py"
    script.write_text(FORK)
    plain = runner.run(script)
    # a child that waited on the parent's writer would wait out the flush timeout: 120 s here
    rec = runner.run(script, "--flor", "fork", env=runner.env(FLOR_FLUSH_TIMEOUT="120"))
    assert rec.stdout == plain.stdout
    children = [line for line in rec.stderr.splitlines() if line.startswith("child ")]
    assert len(children) == 2, rec.stderr
    exited, termed = children
    assert exited.startswith("child exit: status 0 in ") and exited.endswith("; run running"), rec.stderr
    assert termed.startswith(f"child term: status {signal.SIGTERM} in ") and termed.endswith("; run running"), rec.stderr
    assert max(float(line.split(" in ")[1].split(" s;")[0]) for line in children) < 60, rec.stderr  # no wait
    assert "FL106" not in rec.stderr and "FL114" not in rec.stderr, rec.stderr
    meta = _run_json(runner.home, "fork")
    assert meta["status"] == "finished" and meta["epochs_done"] == 4
    assert meta["checkpoint_failures"] == [] and meta.get("checkpoint_skipped", []) == [], meta
    store = ExperimentStore(runner.home, "fork")
    assert sorted(e for _, e, _ in store.manifests(meta["run"])) == [0, 1, 2, 3]
    replay = runner.run(script, "--flor", "fork", "--replay_flor")
    assert replay.stdout == plain.stdout and "verified exact" in _verdict(replay.stderr), replay.stderr


def test_checkpoints_abandoned_at_exit_are_not_counted_as_taken(runner: Runner, tmp_path: Path):
    """The writer is held up (an nvidia-smi that hangs, given up after 5 s) and the exit flush
    may not wait (FLOR_FLUSH_TIMEOUT=0): every checkpoint is abandoned, and the exit line says
    none was taken rather than "abandoned 4" beside "checkpointed 4 of 4"."""
    script = runner.cwd / "small.py"
    script.write_text(FULL.replace("256", "8").replace("range(8)", "range(4)"))
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nvidia-smi").write_text("#!/bin/sh\nexec sleep 30\n")
    (folder / "nvidia-smi").chmod(0o755)
    env = runner.env(FLOR_FLUSH_TIMEOUT="0", PATH=f"{folder}{os.pathsep}{os.environ['PATH']}")
    proc = runner.run(script, "--flor", "held", env=env)
    assert "flor: FL114 abandoned 4 checkpoint(s)" in proc.stderr, proc.stderr
    assert "flor: checkpointed 0 of 4 epochs" in proc.stderr, proc.stderr
    meta = _run_json(runner.home, "held")
    assert sorted(s["epoch"] for s in meta["checkpoint_skipped"]) == [0, 1, 2, 3]


def test_a_cut_short_copy_of_the_script_is_not_taken_for_a_change(runner: Runner):
    """A full disk at the start of a recording cut the copy of the script short (0 bytes);
    the replay said the script "changed by more than logging" and blamed any divergence on
    it. The copy is checked against run.json's sha256: a copy that is not the script is said
    to be, and the replay of the unchanged script is exact with no such note."""
    script = runner.cwd / "full.py"
    script.write_text(FULL.replace("256", "8"))
    runner.run(script, "--flor", "cut")
    meta = _run_json(runner.home, "cut")
    copy = runner.home / "cut" / "runs" / meta["run"] / "source" / "full.py"
    assert copy.read_text() == script.read_text()
    copy.write_bytes(b"")
    replay = runner.run(script, "--flor", "cut", "--replay_flor")
    assert "verified exact" in _verdict(replay.stderr), replay.stderr
    assert "FL309" not in replay.stderr, replay.stderr
    assert "copy of the script" in replay.stderr and "is not the script run.json names" in replay.stderr


def test_an_unwritable_run_json_never_stops_training(runner: Runner):
    """run.json grows past a 3 KB file size limit (at the latest at exit, with its summaries):
    its writes fail, once warned about, and the script runs to its end as it does without flor."""
    script = runner.cwd / "full.py"
    script.write_text(FULL.replace("256", "8"))
    plain = runner.run(script)

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))

    proc = subprocess.run([sys.executable, str(script), "--flor", "meta"], cwd=runner.cwd, env=runner.env(),
                          capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert proc.returncode == 0 and proc.stdout == plain.stdout, proc.stderr
    assert proc.stderr.count("writing run.json failed") == 1, proc.stderr
    meta = _run_json(runner.home, "meta")  # the last run.json that fitted: the final one, with its summaries, did not
    assert meta["epochs_done"] >= 1 and meta["status"] == "running"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounts a tmpfs: needs root")
def test_a_store_that_cannot_be_created_leaves_training_alone(runner: Runner, tmp_path: Path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=3", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("tmpfs could not be mounted here")
    try:
        script = runner.cwd / "full.py"
        script.write_text(FULL.replace("256", "8"))
        plain = runner.run(script)
        proc = runner.run(script, "--flor", "x", env=runner.env(FLOR_HOME=str(mnt / "home")))
        assert proc.stdout == plain.stdout
        assert proc.stderr.count("training goes on without recording") == 1, proc.stderr
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# -- temp files ------------------------------------------------------------------------

def test_a_failed_write_leaves_no_temp_file(tmp_path: Path):
    def write_big() -> None:  # in a child with a 64 KB file size limit
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))

    code = ("import sys; from flor.store.local import LocalBackend; from flor.errors import StorageError\n"
            "b = LocalBackend(sys.argv[1])\n"
            "try:\n    b.write('objects/ab/big', b'x' * (1 << 20))\nexcept StorageError as e:\n    print('refused', e)\n"
            "b.write('objects/ab/small', b'y' * 100)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          preexec_fn=write_big, timeout=60)
    assert proc.returncode == 0 and "refused" in proc.stdout and "File too large" in proc.stdout, proc
    assert sorted(p.name for p in (tmp_path / "objects" / "ab").iterdir()) == ["small"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temp_files_of_dead_writers_are_removed_and_never_counted(runner: Runner):
    runner.run(runner.script(), "--epochs", "1", "--flor", "toy")
    root = runner.home / "toy"
    size = dir_size(root)
    listing = runner.flor("ls").stdout
    host = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"
    blob_dir = next(p for p in (root / "objects").iterdir() if p.is_dir())
    stale = blob_dir / f".tmp-{host}-{_dead_pid()}-0-deadbeef"
    live = blob_dir / f".tmp-{host}-{os.getpid()}-0-0123abcd"  # this test's process is alive
    old_format = root / "runs" / ".tmp-0123456789abcdef0123456789abcdef"  # an older flor's name, fresh
    for p in (stale, live, old_format):
        p.write_bytes(b"z" * 300_000)
    assert dir_size(root) == size  # a write in progress is not part of the store's size
    assert runner.flor("ls").stdout == listing
    runner.run(runner.script(), "--epochs", "1", "--flor", "toy")  # the next recording cleans up
    assert not stale.exists()
    assert live.exists() and old_format.exists()  # a live writer's, and one too young to judge
    assert list(root.rglob(".tmp-*")) == sorted([live, old_format]) or set(root.rglob(".tmp-*")) == {live, old_format}


# -- blocks left open by an exception ----------------------------------------------------

OPEN = '''
import torch
import flor

torch.manual_seed(0)
net = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
x = torch.randn(16, 4)
for epoch in flor.it(range(5)):
    if flor.SkipBlock.step_into("train"):
        try:
            for i in range(3):
                loss = net(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if epoch in (1, 3) and i == 1:
                    raise RuntimeError("CUDA out of memory (simulated)")
        except RuntimeError:
            continue  # skip this epoch: SkipBlock.end is never reached
    net, opt = flor.SkipBlock.end(net, opt)
    value = net(x).pow(2).mean().item()
    flor.log("value", value)
    print(f"epoch {epoch} value {value:.8f}")
'''


def test_a_block_left_open_by_an_exception_is_closed_and_replayed_exactly(runner: Runner):
    script = runner.cwd / "open.py"
    script.write_text(OPEN)
    plain = runner.run(script)
    proc = runner.run(script, "--flor", "open")
    assert proc.stdout == plain.stdout
    assert proc.stderr.count("was still open at the end of the epoch") == 1, proc.stderr
    assert "FL115" not in proc.stderr  # the script's exception, not a failure of flor's
    meta = _run_json(runner.home, "open")
    assert meta["status"] == "finished"
    assert sorted(f["epoch"] for f in meta["checkpoint_failures"]) == [1, 3]
    store = ExperimentStore(runner.home, "open")
    assert sorted(e for _, e, _ in store.manifests(meta["run"])) == [0, 2, 4]
    recorded = [r["value"] for r in _records(runner.home, "open")]
    full = runner.run(script, "--flor", "open", "--replay_flor")
    assert "verified exact" in _verdict(full.stderr), full.stderr
    assert full.stdout == plain.stdout and "2 re-executed without a checkpoint" in full.stderr
    second = runner.run(script, "--flor", "open", "--replay_flor", "1/2")  # starts after the open block of epoch 1
    assert "verified exact" in _verdict(second.stderr), second.stderr
    assert [float(line.split()[-1]) for line in full.stdout.splitlines()] == pytest.approx(recorded, abs=1e-8)


def test_a_script_that_crashes_inside_a_block_is_not_told_its_training_was_not_affected(runner: Runner):
    script = runner.cwd / "crash.py"
    script.write_text(OPEN.replace("        except RuntimeError:\n            continue", "        finally:\n            pass"))
    proc = runner.run(script, "--flor", "crash", check=False)
    assert proc.returncode == 1 and "RuntimeError: CUDA out of memory (simulated)" in proc.stderr
    assert "FL115" not in proc.stderr and said(proc.stderr, "FL106", "at exit"), proc.stderr
    meta = _run_json(runner.home, "crash")
    assert meta["status"] == "crashed" and [f["epoch"] for f in meta["checkpoint_failures"]] == [1]
