"""A store whose disk fills up in the middle of a recording: the end of the run must stay clean.

Unlike the small disk of ``test_record_robustness.py``, where the checkpoints never fit, here a
real tmpfs is left with a few pages free, so the first writes succeed and the disk fills while
the run goes on: buffered TensorBoard events and the final run.json are what fail. Needs root
(mount).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import Runner


@pytest.fixture
def tiny_disk(tmp_path: Path):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt: Path, free_kb: int) -> None:
    """Leave ``free_kb`` KB free on ``mnt`` (everything else in one file, removed first)."""
    for p in mnt.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    st = os.statvfs(mnt)
    (mnt / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - free_kb * 1024))


def test_a_disk_that_fills_mid_run_ends_without_a_traceback_and_keeps_the_final_run_json(
        runner: Runner, tiny_disk: Path) -> None:
    script = runner.script()
    plain = runner.run(script, "--epochs", "6")
    seen: set[str] = set()
    # 8 KB: too little to set disk aside for the final run.json; from 20 KB it is set aside at the start.
    # Which few KB leave the TensorBoard events (written last) without a page moves with every file a
    # recording writes, so the sizes above 40 KB are tried in 4 KB (page) steps until that failure is met
    for free_kb in (8, 20, 40, *range(44, 148, 4)):
        if free_kb > 40 and "tensorboard" in seen:
            break
        fill(tiny_disk, free_kb)
        env = runner.env(FLOR_HOME=str(tiny_disk / "home"))
        proc = runner.run(script, "--epochs", "6", "--flor", "k", env=env)  # exit 0: training is not affected
        assert proc.stdout == plain.stdout
        assert "Traceback" not in proc.stderr, proc.stderr
        if "writing TensorBoard events failed" in proc.stderr:
            seen.add("tensorboard")
        [run] = list((tiny_disk / "home" / "k" / "runs").iterdir())
        meta = json.loads((run / "run.json").read_text())
        if free_kb == 8:  # the final write failed: the user is told what readers will see
            seen.add("run.json")
            assert meta["status"] == "running", meta
            assert (f"the final run.json could not be written, so the run's end, checkpoint_failures and "
                    f"write_failures are not recorded: the last one written says 'running' with "
                    f"{meta['epochs_done']} epoch(s) done") in proc.stderr, proc.stderr
            continue
        # the space set aside is given back for the final run.json: the run's end and every epoch are recorded
        assert meta["status"] == "finished" and meta["epochs_done"] == 6, meta
        assert "FL116" not in proc.stderr
        assert [p.name for p in run.iterdir() if p.name.startswith(".tmp-")] == []  # nothing left set aside
        (tiny_disk / "filler").unlink()  # space again: a replay covers all six epochs (what the full disk
        rep = runner.run(script, "--epochs", "6", "--flor", "k", "--replay_flor", env=env)  # lost, it re-executes)
        assert "epochs 0-5 (initialization epochs none)" in rep.stderr, rep.stderr
    assert seen == {"tensorboard", "run.json"}, seen
