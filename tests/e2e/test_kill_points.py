"""SIGKILL at exact points of a recording's file operations, and what every command does after.

A wrapper runs the real script with an audit hook (``sys.addaudithook``) that sends the
process SIGKILL right before a chosen file operation under FLOR_HOME, so each kill point is
hit every time instead of by chance.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import Runner

KILLER = '''
import os, runpy, signal, sys
HOME, EVENT, SUFFIX = os.environ["FLOR_HOME"], os.environ["KILL_EVENT"], os.environ["KILL_SUFFIX"]

def hook(event, args):
    if event != EVENT:
        return
    path = args[1] if event == "os.rename" else args[0]
    try:
        path = os.fsdecode(os.fspath(path))
    except TypeError:
        return
    if path.startswith(HOME) and path.endswith(SUFFIX):
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(hook)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def killed_at(r: Runner, event: str, suffix: str, *args: str) -> subprocess.CompletedProcess:
    """Record toy.py, SIGKILLed right before the first ``event`` on a path ending in ``suffix``."""
    killer = r.cwd / "killer.py"
    killer.write_text(KILLER)
    script = r.script()
    proc = subprocess.run([sys.executable, str(killer), str(script), *args], cwd=r.cwd,
                          env=r.env(KILL_EVENT=event, KILL_SUFFIX=suffix), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -9, (proc.returncode, proc.stderr)
    return proc


def run_folders(r: Runner, name: str) -> list[Path]:
    return sorted((r.home / name / "runs").iterdir())


def test_a_recording_killed_before_its_first_run_json_is_a_leftover_not_a_problem(runner: Runner) -> None:
    # killed after its run folder and run.json's temp file exist, before the rename: no run.json
    killed_at(runner, "os.rename", "/run.json", "--epochs", "2", "--flor", "k")
    [folder] = run_folders(runner, "k")
    assert not (folder / "run.json").exists()
    assert [p.name.startswith(".tmp-") for p in folder.iterdir()] == [True]

    # `flor ls` lists the experiment, so the commands that name it must not call it unknown
    assert "\nk " in runner.flor("ls").stdout
    for cmd in (("ls", "k"), ("show", "k"), ("logs", "k")):
        out = runner.flor(*cmd, check=False)
        assert out.returncode == 2 and out.stderr.startswith("flor: error: experiment 'k' under ") \
            and "has no run to read: no run folder holds a run.json" in out.stderr, (cmd, out.stderr)

    # nothing recorded was lost, so nothing is wrong: verify exits 0 and offers the repair
    out = runner.flor("verify", "k")
    assert "problem:" not in out.stdout and "no problems" in out.stdout, out.stdout
    assert "1 run folder(s) of recordings killed before they wrote run.json" in out.stdout, out.stdout

    # a new recording under the same name clears the temp file; the store is still sound
    runner.run(runner.script(), "--epochs", "2", "--flor", "k")
    out = runner.flor("verify", "k")
    assert "problem:" not in out.stdout and "1 run(s), 2 manifest(s)" in out.stdout, out.stdout

    # and the repair removes the empty folder (older than a recording's start-up window)
    import os
    import time

    old = time.time() - 3600
    os.utime(folder, (old, old))
    out = runner.flor("verify", "k", "--repair")
    assert f"removed run folder runs/{folder.name}" in out.stdout, out.stdout
    assert not folder.exists() and len(run_folders(runner, "k")) == 1
    out = runner.flor("verify", "k", "--repair")
    assert "nothing to repair" in out.stdout, out.stdout


def test_a_run_folder_with_data_but_no_run_json_is_still_a_problem(runner: Runner) -> None:
    runner.run(runner.script(), "--epochs", "2", "--flor", "k")
    [folder] = run_folders(runner, "k")
    (folder / "run.json").unlink()
    out = runner.flor("verify", "k", check=False)
    assert out.returncode == 1 and "run.json: missing" in out.stdout, out.stdout
    out = runner.flor("verify", "k", "--repair", check=False)
    assert out.returncode == 1 and folder.is_dir() and "removed run folder" not in out.stdout, out.stdout
