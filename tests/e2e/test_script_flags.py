"""Flags in real scripts: a bad ``flor.arg`` value or a bad replay flag ends the script with one
line and exit status 2 before anything is written, a bad writer setting too; a replay of the
latest passes over a run that recorded nothing.
"""

from __future__ import annotations

import pytest

from flor.errors import ConfigError
from flor.settings import parse


def test_a_bad_flor_arg_value_is_one_line_and_exit_2_in_plain_runs_too(runner):
    """flor.arg's value is the script's own flag: a value of the wrong type is one line and exit
    status 2 (as argparse does), in a plain run as in a recording, not a ConfigError traceback."""
    script = runner.cwd / "args.py"
    script.write_text('import flor\nw = flor.arg("width", 128)\nlr = flor.arg("lr", 0.1)\n'
                      'for e in flor.it(range(2)):\n    flor.log("lr", lr)\nprint("ran", w, lr)\n')
    assert runner.run(script, "--lr", "0.5").stdout == "ran 128 0.5\n"
    for extra in ([], ["--flor", "args"]):
        proc = runner.run(script, "--lr", "abc", *extra, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == (
            "flor: error: --lr='abc' is not a valid float, the type of the default in flor.arg('lr', 0.1); "
            "fix the value on the command line"), proc.stderr


def _runs(runner) -> list[str]:
    runs = runner.home / "toy" / "runs"
    return sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []


def test_a_bad_flor_arg_after_a_good_one_leaves_no_run_behind(runner):
    """flor.arg does not start the recording: a bad value in a later flor.arg ends the script
    before any run directory exists, so the latest run is still the real one."""
    script = runner.script(edits={"args = parser.parse_args()": "args, _ = parser.parse_known_args()\n"
                                  "width = flor.arg('width', 3)\nbs = flor.arg('bs', 32)"})
    runner.run(script, "--epochs", "3", "--bs", "16", "--flor", "toy")
    (real,) = _runs(runner)
    before = runner.tree()
    proc = runner.run(script, "--epochs", "3", "--bs", "abc", "--flor", "toy", check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "flor: error: --bs='abc' is not a valid int, the type of the default in flor.arg('bs', 32); "
        "fix the value on the command line"], proc.stderr
    assert runner.tree() == before
    replay = runner.run(script, "--epochs", "3", "--bs", "16", "--flor", "toy", "--replay_flor")
    assert f"of toy run {real}" in replay.stderr and "replay verified exact: 3 blocks restored" in replay.stderr


def test_a_replay_of_the_latest_passes_over_a_run_that_recorded_nothing(runner):
    """A recording that stopped before its first epoch (nothing checkpointed or logged) is not
    'the latest' for a replay when a real run exists: the replay says which run it replays. Asked
    for by name, it is replayed, and the verdict says nothing was checked, not 'verified exact'."""
    script = runner.script()
    runner.run(script, "--epochs", "3", "--flor", "toy")
    stops = runner.script(edits={"step = 0\n": "step = 0\nif flor.recording():\n    raise RuntimeError('no data')\n"},
                          dest="stops.py")
    assert runner.run(stops, "--epochs", "3", "--flor", "toy", check=False).returncode == 1
    real, empty = _runs(runner)
    replay = runner.run(script, "--epochs", "3", "--flor", "toy", "--replay_flor")
    assert (f"flor: FL301 the latest run {empty} (status crashed) of toy recorded nothing (no epoch, checkpoint or logged "
            f"value); replaying {real}, the latest run that did") in replay.stderr, replay.stderr
    assert f"of toy run {real}" in replay.stderr and "replay verified exact: 3 blocks restored" in replay.stderr
    named = runner.run(script, "--epochs", "3", "--flor", "toy", "--replay_flor", "--flor_run", empty)
    last = named.stderr.strip().splitlines()[-1]
    assert last.startswith("flor: replay checked nothing: 0 blocks restored") and "verified exact" not in named.stderr


def test_a_bad_replay_flag_fails_a_recording_before_it_writes(runner):
    script = runner.script()
    for args in (["--flor_epochs", "abc"], ["--flor_threads", "0"], ["--flor_epochs", "-3"]):
        proc = runner.run(script, "--epochs", "2", "--flor", "toy", *args, check=False)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith(f"flor: error: --{args[0][2:]}/FLOR_") and not runner.home.exists()
    proc = runner.run(script, "--epochs", "2", "--flor", "toy", "--flor_threads", "2")
    assert proc.stderr.splitlines()[0] == "flor: FL002 --flor_threads applies to replays only; this recording ignores it"


@pytest.mark.parametrize("env", [
    {"FLOR_FLUSH_TIMEOUT": "-1"}, {"FLOR_FLUSH_TIMEOUT": "nan"}, {"FLOR_FLUSH_TIMEOUT": "inf"},
    {"FLOR_FLUSH_TIMEOUT": "soon"}, {"FLOR_WRITER_MEMORY": "lots"}, {"FLOR_WRITER_MEMORY": "0"},
])
def test_bad_writer_settings_are_one_line_errors(env, runner):
    with pytest.raises(ConfigError) as err:
        parse(["train.py", "--flor", "x"], env)
    assert list(env)[0] in str(err.value)
    proc = runner.run(runner.script(), "--flor", "x", check=False, env=runner.env(**env))
    assert proc.returncode == 2 and proc.stderr.startswith("flor: error: FLOR_") and "Traceback" not in proc.stderr


def test_a_bad_rank_timeout_stops_the_script_with_status_2(runner):
    script = runner.cwd / "t.py"
    script.write_text("import flor\nprint('ran')\n")
    proc = runner.run(script, "--flor", "x", check=False, env=runner.env(FLOR_RANK_TIMEOUT="soon"))
    assert proc.returncode == 2 and "ran" not in proc.stdout, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "flor: error: FLOR_RANK_TIMEOUT='soon' is not a number of seconds > 0; write e.g. FLOR_RANK_TIMEOUT=600 "
        "(how long the ranks of a DDP run wait for rank 0 to name the run, which may still be loading data), "
        "or unset it"]
