"""Every form of flor's flags and variables, and the errors for bad ones."""

from __future__ import annotations

import pytest

from flor.errors import ConfigError
from flor.settings import parse, validate_name


@pytest.mark.parametrize(
    "argv, env, mode, name, pid, ngpus, rest",
    [
        (["t.py"], {}, "inert", None, 0, 1, ["t.py"]),
        (["t.py", "--flor", "x"], {}, "record", "x", 0, 1, ["t.py"]),
        (["t.py", "--flor=x", "--lr", "3"], {}, "record", "x", 0, 1, ["t.py", "--lr", "3"]),
        (["t.py", "--lr", "3", "--flor", "x", "--epochs", "2"], {}, "record", "x", 0, 1, ["t.py", "--lr", "3", "--epochs", "2"]),
        (["t.py", "--flor", "x", "--replay_flor"], {}, "replay", "x", 0, 1, ["t.py"]),
        (["t.py", "--replay_flor", "--flor", "x", "--lr", "1"], {}, "replay", "x", 0, 1, ["t.py", "--lr", "1"]),
        (["t.py", "--flor", "x", "--replay_flor", "3/5", "--lr", "1"], {}, "replay", "x", 3, 5, ["t.py", "--lr", "1"]),
        (["t.py", "--flor", "x", "--replay_flor=9/200"], {}, "replay", "x", 9, 200, ["t.py"]),
        (["t.py", "--flor", "x", "--replay_flor", "pos"], {}, "replay", "x", 0, 1, ["t.py", "pos"]),
        (["t.py"], {"FLOR_NAME": "x"}, "record", "x", 0, 1, ["t.py"]),
        (["t.py"], {"FLOR_NAME": "x", "FLOR_REPLAY": "1"}, "replay", "x", 0, 1, ["t.py"]),
        (["t.py"], {"FLOR_NAME": "x", "FLOR_REPLAY": "2/4"}, "replay", "x", 2, 4, ["t.py"]),
        (["t.py", "--flor", "y"], {"FLOR_NAME": "x"}, "record", "y", 0, 1, ["t.py"]),
        (["t.py", "--flor", "x", "--replay_flor"], {"RANK": "1", "WORLD_SIZE": "4"}, "replay", "x", 1, 4, ["t.py"]),
        (["t.py", "--flor", "x", "--replay_flor"],
         {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "5"}, "replay", "x", 2, 4, ["t.py"]),
        (["t.py", "--flor", "x", "--replay_flor"], {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "replay", "x", 0, 2, ["t.py"]),
        (["t.py", "--flor", "x", "--replay_flor", "1/3"], {"RANK": "0", "WORLD_SIZE": "2"}, "replay", "x", 1, 3, ["t.py"]),
        (["t.py", "--flor", "x", "--", "--flor", "y"], {}, "record", "x", 0, 1, ["t.py", "--", "--flor", "y"]),
    ],
)
def test_flag_forms(argv, env, mode, name, pid, ngpus, rest):
    settings, remaining = parse(argv, env)
    assert (settings.mode, settings.name, settings.pid, settings.ngpus) == (mode, name, pid, ngpus)
    assert remaining == rest


def test_switches_and_values():
    s, rest = parse(["t.py", "--flor", "x", "--replay_flor", "--flor_strict", "--flor_strong", "--flor_run", "2026"], {})
    assert (s.strict, s.strong, s.run, rest) == (True, True, "2026", ["t.py"])
    s, _ = parse(["t.py", "--flor", "x", "--flor_every", "3"], {})
    assert s.every == 3
    s, _ = parse(["t.py"], {"FLOR_NAME": "x", "FLOR_EVERY": "4", "FLOR_HOME": "/tmp/somewhere"})
    assert (s.every, str(s.home)) == (4, "/tmp/somewhere")
    # an empty variable is an unset one (`FLOR_EVERY= python train.py`), as FLOR_OVERHEAD and the rest
    s, _ = parse(["t.py"], {"FLOR_NAME": "x", "FLOR_EVERY": "", "FLOR_OVERHEAD": "", "FLOR_SPOOL": ""})
    assert (s.every, s.overhead) == (None, 0.01)
    s, _ = parse(["t.py"], {"FLOR_NAME": "x", "FLOR_REPLAY": "yes", "FLOR_STRICT": "1", "FLOR_REPLAY_ID": "abc"})
    assert (s.mode, s.strict, s.replay_id) == ("replay", True, "abc")


def test_existing_path_is_not_taken_as_segment(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x").write_text("")
    monkeypatch.chdir(tmp_path)
    s, rest = parse(["t.py", "--flor", "x", "--replay_flor", "data/x"], {})
    assert (s.pid, s.ngpus, rest) == (0, 1, ["t.py", "data/x"])


@pytest.mark.parametrize("bad", ["a/b", "3/2", "-1/2", "0/0", "1/", "/2", "2/2"])
def test_malformed_segments(bad):
    with pytest.raises(ConfigError, match="PID|NGPUS"):
        parse(["t.py", "--flor", "x", "--replay_flor", bad], {})
    with pytest.raises(ConfigError):
        parse(["t.py", "--flor", "x", f"--replay_flor={bad}"], {})
    with pytest.raises(ConfigError):
        parse(["t.py"], {"FLOR_NAME": "x", "FLOR_REPLAY": bad})


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["t.py", "--replay_flor"], {}, "needs an experiment"),
        (["t.py", "--flor"], {}, "needs a value"),
        (["t.py", "--flor", "--lr"], {}, "needs a value"),
        (["t.py", "--flor", "x", "--flor_strct"], {}, "unknown flor flag '--flor_strct': did you mean --flor_strict"),
        (["t.py", "--flor", "x", "--flor_epoch=3"], {}, "did you mean --flor_epochs"),
        (["t.py", "--flor", "x", "--flor", "y"], {}, "twice"),
        (["t.py", "--flor", "x", "--flor_every", "0"], {}, "positive"),
        (["t.py", "--flor", "x"], {"FLOR_EVERY": "often"}, "positive"),
        (["t.py", "--flor", "x"], {"FLOR_STRICT": "maybe"}, "yes/no"),
        (["t.py", "--flor", "x", "--replay_flor"], {"RANK": "one", "WORLD_SIZE": "2"}, "whole number"),
        (["t.py", "--flor", "x", "--replay_flor"], {"RANK": "2", "WORLD_SIZE": "2"}, "out of range"),
        (["t.py", "--flor", "x", "--replay_flor", "--flor_run", "../r"], {}, "invalid run"),
    ],
)
def test_bad_settings(argv, env, message):
    with pytest.raises(ConfigError, match=message):
        parse(argv, env)


@pytest.mark.parametrize("name", ["../x", "/abs", "", "a/b", "..", ".hidden", "x/../../y", "a" * 200, "white space"])
def test_names_that_escape_or_are_invalid(name):
    with pytest.raises(ConfigError, match="invalid experiment name"):
        validate_name(name)
    with pytest.raises(ConfigError):
        parse(["t.py", "--flor", name] if name else ["t.py", "--flor="], {})


@pytest.mark.parametrize("name", ["x", "cnn-demo", "run_1.2", "A+B"])
def test_good_names(name):
    assert validate_name(name) == name


def test_lenient_keeps_a_diverged_replay_at_status_0():
    s, rest = parse(["t.py", "--flor", "x", "--replay_flor", "--flor_lenient"], {})
    assert (s.lenient, s.strict, rest) == (True, False, ["t.py"])
    s, _ = parse(["t.py"], {"FLOR_NAME": "x", "FLOR_REPLAY": "1", "FLOR_LENIENT": "1"})
    assert s.lenient
    assert not parse(["t.py", "--flor", "x", "--replay_flor"], {})[0].lenient  # default: a divergence exits 3
    with pytest.raises(ConfigError, match="contradict"):
        parse(["t.py", "--flor", "x", "--replay_flor", "--flor_lenient", "--flor_strict"], {})


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


@pytest.mark.parametrize("argv, script", [
    (["t.py", "--flor_x", "3"], ["t.py", "--flor_x", "3"]),
    (["t.py", "--flor", "x", "--flor_x=3"], ["t.py", "--flor_x=3"]),
    (["t.py", "--flor_bogus", "--flor", "x", "--replay_flor"], ["t.py", "--flor_bogus"]),
])
def test_a_scripts_own_flor_prefixed_flag_is_left_to_the_script(argv, script):
    """flor takes the flags it knows out of argv; a flag of the script's own that starts with
    --flor_ (and is not one of flor's misspelled) stays in the script's argv."""
    assert parse(argv, {})[1] == script


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


@pytest.mark.parametrize("mode", [[], ["--replay_flor"]])
@pytest.mark.parametrize("argv, env, message", [
    (["--flor_epochs", "abc"], {}, "'abc' is not an epoch range"),
    (["--flor_epochs", "-3"], {}, "'-3' is not an epoch range"),
    (["--flor_epochs=5:2"], {}, "selects no epoch"),
    ([], {"FLOR_EPOCHS": "x"}, "'x' is not an epoch range"),
    (["--flor_threads", "0"], {}, "'0' is not a number of threads"),
    (["--flor_threads", "x"], {}, "'x' is not a number of threads"),
    (["--flor_threads", "-2"], {}, "'-2' is not a number of threads"),
    ([], {"FLOR_THREADS": "2000"}, "'2000' is not a number of threads"),
    (["--flor_every", "-1"], {}, "'-1' is not a positive whole number"),
])
def test_replay_values_are_checked_while_recording_too(mode, argv, env, message):
    with pytest.raises(ConfigError, match=message):
        parse(["t.py", "--flor", "x", *mode, *argv], env)


def test_a_flag_the_mode_does_not_use_gets_a_note():
    s, _ = parse(["t.py", "--flor", "x", "--flor_epochs", "3:", "--flor_threads", "2"], {"FLOR_RUN": "r"})
    assert s.mode == "record" and s.notes == ("--flor_epochs applies to replays only; this recording ignores it",
                                              "--flor_threads applies to replays only; this recording ignores it")
    s, _ = parse(["t.py", "--flor", "x", "--replay_flor", "--flor_every", "2", "--flor_epochs", "1:"], {})
    assert s.notes == ("--flor_every applies to recordings only; this replay ignores it",)
    assert parse(["t.py", "--flor", "x", "--replay_flor"], {"FLOR_EVERY": "2"})[0].notes == ()


def test_a_bad_replay_flag_fails_a_recording_before_it_writes(runner):
    script = runner.script()
    for args in (["--flor_epochs", "abc"], ["--flor_threads", "0"], ["--flor_epochs", "-3"]):
        proc = runner.run(script, "--epochs", "2", "--flor", "toy", *args, check=False)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith(f"flor: error: --{args[0][2:]}/FLOR_") and not runner.home.exists()
    proc = runner.run(script, "--epochs", "2", "--flor", "toy", "--flor_threads", "2")
    assert proc.stderr.splitlines()[0] == "flor: FL002 --flor_threads applies to replays only; this recording ignores it"
