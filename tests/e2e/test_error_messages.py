"""Errors a user must act on are one line and exit status 2, in real processes: a replay that no
longer fits its recording, an absurd value of every flag and variable (the table lives in
``helpers.py``; ``unit/test_settings.py`` checks it covers every setting), values wrong only
once the run starts; the script's own exceptions keep their traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ABSURD, ABSURD_AT_START, Runner


def _run_json(home: Path, name: str) -> dict:
    runs = sorted((home / name / "runs").iterdir())
    return json.loads((runs[-1] / "run.json").read_text())


def _verdict(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


# -- errors a user must act on ----------------------------------------------------------

def test_a_flor_error_is_one_line_and_exit_2_with_the_cause_in_the_summary(runner: Runner):
    script = runner.script()
    runner.run(script, "--epochs", "3", "--flor", "toy")
    proc = runner.run(script, "--epochs", "4", "--flor", "toy", "--replay_flor", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("flor: error:")]
    assert errors == ["flor: error: the epoch loop now has 4 epochs but the recording "
                      f"{_run_json(runner.home, 'toy')['run']} had 3: replay with the recorded arguments, or record again"]
    last = _verdict(proc.stderr)
    assert last.startswith("flor: replay FAILED (ReplayError: the epoch loop now has 4 epochs") and "before it finished" in last
    debug = runner.run(script, "--epochs", "4", "--flor", "toy", "--replay_flor", check=False,
                       env=runner.env(FLOR_DEBUG="1"))
    assert debug.returncode == 2 and "Traceback" in debug.stderr and "flor: error: the epoch loop" in debug.stderr


def test_other_exceptions_keep_their_traceback(runner: Runner):
    script = runner.script(edits={"# OUTER": "raise KeyError('mine')"}, dest="boom.py")
    proc = runner.run(script, "--epochs", "2", "--flor", "boom", check=False)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "KeyError: 'mine'" in proc.stderr
    assert "flor: error:" not in proc.stderr
    assert _run_json(runner.home, "boom")["status"] == "crashed"


def _one_error_line(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("flor: error:")]
    assert len(errors) == 1, proc.stderr


@pytest.mark.parametrize("flags, env", ABSURD, ids=[f"{' '.join(f)[:40]} {' '.join(env)}" for f, env in ABSURD])
def test_every_setting_with_an_absurd_value_is_one_line_exit_2(runner: Runner, flags, env):
    proc = subprocess.run([sys.executable, "-c", "import flor", *flags], cwd=runner.cwd, env=runner.env(**env),
                          capture_output=True, text=True, timeout=60)
    _one_error_line(proc)


TINY = '''
import flor
state = [0]
for epoch in flor.it(range(3)):
    if flor.SkipBlock.step_into("b"):
        state[0] += epoch
    flor.SkipBlock.end(state)
    flor.log("s", state[0])
'''


def test_absurd_values_found_at_start_are_one_line_exit_2(runner: Runner):
    script = runner.cwd / "tiny.py"
    script.write_text(TINY)
    runner.run(script, "--flor", "t")
    (runner.cwd / "FILE").write_text("not a folder")
    for flags, env in ABSURD_AT_START:
        env = {k: v.replace("FILE", str(runner.cwd / "FILE")) for k, v in env.items()}
        _one_error_line(runner.run(script, *flags, check=False, env=runner.env(**env)))
