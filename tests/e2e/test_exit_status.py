"""A run's recorded status says how its process ended (flor.engine.exits).

``sys.exit(n)``, ``raise SystemExit(n)``, ``exit(n)`` and ``quit(n)`` with a nonzero ``n`` (or a
message, which exits 1) are recorded ``crashed`` with ``exit_code``; ``n`` 0 or None stays
``finished``; a ``SystemExit`` the script caught changes nothing. The process's own exit
status is Python's, with or without flor. A recording killed outright stays ``running`` in
run.json, and ``flor ls``/``flor show`` say its process is gone.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from helpers import Runner

IN_LOOP = "    # IN LOOP"
AFTER_LOOP = "# AFTER LOOP"


def record(r: Runner, name: str, where: str, ending: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Record exits.py with ``ending`` (its first line unindented) at the marked line ``where``
    into ``name``; the process and the run's run.json."""
    indent = where[:len(where) - len(where.lstrip())]
    proc = r.run(r.script("exits.py", edits={where: indent + ending}, dest=f"{name}.py"), "--flor", name, check=False)
    (run_dir,) = (r.home / name / "runs").iterdir()
    return proc, json.loads((run_dir / "run.json").read_text())


@pytest.mark.parametrize("where, ending, status, code, message", [
    (IN_LOOP, "if epoch == 1:\n        sys.exit(3)", "crashed", 3, None),
    (IN_LOOP, "if epoch == 1:\n        raise SystemExit(1)", "crashed", 1, None),
    (IN_LOOP, "if epoch == 1:\n        sys.exit('loss is NaN')", "crashed", 1, "loss is NaN"),
    (IN_LOOP, "if epoch == 1:\n        raise SystemExit(None)", "finished", 0, None),
    (AFTER_LOOP, "quit(2)", "crashed", 2, None),
])
def test_the_status_follows_the_exit_code(runner: Runner, where, ending, status, code, message):
    proc, meta = record(runner, "ends", where, ending)
    assert proc.returncode == code, proc.stderr  # what Python makes of it: flor changes nothing
    assert (meta["status"], meta["exit_code"], meta["error"]) == (status, code, message), meta
    if where == IN_LOOP:  # the loop stopped at epoch 1; what ran is replayed as before
        assert meta["epochs_done"] == 1 and meta["loop_ended"] == "error"


@pytest.mark.parametrize("returns, status", [(None, "finished"), ("0", "finished"), ("4", "crashed")])
def test_sys_exit_of_main_is_seen(runner: Runner, returns, status):
    """``sys.exit(main())`` looks ``sys.exit`` up before ``main()`` starts the recording: the
    wrapper must already be there, from ``import flor``."""
    env = runner.env(**({} if returns is None else {"MAIN_RETURNS": returns}))
    proc = runner.run(runner.script("exit_main.py"), "--flor", "main", env=env, check=False)
    (run_dir,) = (runner.home / "main" / "runs").iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    code = int(returns or 0)
    assert proc.returncode == code, proc.stderr
    assert (meta["status"], meta["exit_code"], meta["epochs_done"]) == (status, code, 3), meta


def test_ls_and_show_say_the_exit_code_and_a_caught_exit_changes_nothing(runner: Runner):
    caught, meta = record(runner, "caught", IN_LOOP, "try:\n        sys.exit(5)\n    except SystemExit:\n        pass")
    assert caught.returncode == 0 and "done" in caught.stderr
    assert (meta["status"], meta["exit_code"], meta["epochs_done"]) == ("finished", None, 4), meta
    record(runner, "stopped", IN_LOOP, "if epoch == 2:\n        sys.exit(3)")
    assert "finished" in runner.flor("ls", "caught").stdout.splitlines()[1]
    assert "crashed (exit 3)" in runner.flor("ls", "stopped").stdout.splitlines()[1]
    assert ": crashed (exit 3)" in runner.flor("show", "stopped").stdout.splitlines()[0]


def test_a_killed_recording_is_listed_as_gone(runner: Runner):
    script = runner.script("exits.py", dest="killed.py")
    proc = subprocess.Popen([sys.executable, str(script), "--flor", "killed"], cwd=runner.cwd,
                            env=runner.env(EPOCH_SLEEP="30"), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("epoch 0 ")
    proc.send_signal(signal.SIGKILL)  # nothing runs: no exit hook writes a status
    proc.communicate(timeout=60)
    (run_dir,) = (runner.home / "killed" / "runs").iterdir()
    before = (run_dir / "run.json").read_bytes()
    assert json.loads(before)["status"] == "running"
    row = runner.flor("ls", "killed").stdout.splitlines()[1]
    assert "running (process gone)" in row, row
    shown = runner.flor("show", "killed").stdout
    assert ": running (process gone)" in shown.splitlines()[0] and "its process is gone" in shown, shown
    assert (run_dir / "run.json").read_bytes() == before  # the store is only read
