"""Every form of flor's flags and variables, and the errors for bad ones (``flor.settings.parse``
in process; ``e2e/test_script_flags.py`` and ``e2e/test_error_messages.py`` run scripts with
them).
"""

from __future__ import annotations

import re

import pytest

from flor.errors import ConfigError
from flor.settings import parse, validate_name

from helpers import ABSURD, ABSURD_AT_START, ROOT


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


@pytest.mark.parametrize("argv, script", [
    (["t.py", "--flor_x", "3"], ["t.py", "--flor_x", "3"]),
    (["t.py", "--flor", "x", "--flor_x=3"], ["t.py", "--flor_x=3"]),
    (["t.py", "--flor_bogus", "--flor", "x", "--replay_flor"], ["t.py", "--flor_bogus"]),
])
def test_a_scripts_own_flor_prefixed_flag_is_left_to_the_script(argv, script):
    """flor takes the flags it knows out of argv; a flag of the script's own that starts with
    --flor_ (and is not one of flor's misspelled) stays in the script's argv."""
    assert parse(argv, {})[1] == script


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


def test_epoch_and_thread_settings():
    s, rest = parse(["t.py", "--flor", "x", "--replay_flor", "--flor_epochs", "40:61", "--flor_threads", "2"], {})
    assert (s.epoch_range, s.threads, rest) == ((40, 61), 2, ["t.py"])
    s, _ = parse(["t.py", "--flor", "x", "--replay_flor"], {"FLOR_EPOCHS": "7", "FLOR_THREADS": "1"})
    assert (s.epoch_range, s.threads) == ((7, 8), 1)


def test_the_absurd_table_covers_every_setting():
    text = (ROOT / "flor" / "settings.py").read_text()
    names = set(re.findall(r"\b(FLOR_[A-Z_]+|--flor[a-z_]*|--replay_flor)\b", text))
    names -= {"FLOR_HOME", "FLOR_CONFIG_DIR"}  # any folder is a valid value; FLOR_HOME as a file is tested at start
    covered = {word for flags, env in ABSURD + ABSURD_AT_START for word in [*flags, *env]}
    covered |= {f.split("=")[0] for f in covered}
    assert names - covered == set()


@pytest.mark.parametrize("url, spool", [
    ("s3://my-bucket/team/flor/", "s3://my-bucket/team/flor"),
    ("s3://my.bucket-2", "s3://my.bucket-2"),
])
def test_spool_flag_and_variable(url: str, spool: str) -> None:
    settings, rest = parse(["train.py", "--flor_spool", url, "--flor", "x", "--lr", "1"], {})
    assert (settings.mode, settings.spool, rest) == ("record", spool, ["train.py", "--lr", "1"])
    settings, _ = parse(["train.py", "--flor", "x", "--replay_flor"],
                        {"FLOR_SPOOL": url, "FLOR_SPOOL_BUDGET": "1.5GB", "FLOR_SPOOL_WAIT": "60"})
    assert (settings.spool, settings.spool_budget, settings.spool_wait) == (spool, 1_500_000_000, 60.0)


@pytest.mark.parametrize("env, needle", [
    ({"FLOR_SPOOL": "my-bucket/flor"}, "not an S3 URL"),
    ({"FLOR_SPOOL": "s3://My_Bucket/flor"}, "not a valid S3 bucket name"),
    ({"FLOR_SPOOL": "s3://key:secret@bucket/x"}, "not a valid S3 bucket name"),
    ({"FLOR_SPOOL": "s3://bucket/a/../b"}, "'..' part"),
    ({"FLOR_SPOOL": "s3://bucket/x", "FLOR_SPOOL_BUDGET": "lots"}, "FLOR_SPOOL_BUDGET='lots'"),
    ({"FLOR_SPOOL": "s3://bucket/x", "FLOR_SPOOL_WAIT": "-1"}, "FLOR_SPOOL_WAIT='-1'"),
])
def test_bad_spool_settings_are_config_errors(env: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        parse(["train.py", "--flor", "x"], env)


@pytest.mark.parametrize("env, field, expected", [
    ({}, "flush_timeout", 20.0),
    ({"FLOR_FLUSH_TIMEOUT": "2.5"}, "flush_timeout", 2.5),
    ({"FLOR_FLUSH_TIMEOUT": "0"}, "flush_timeout", 0.0),
    ({}, "writer_memory", None),
    ({"FLOR_WRITER_MEMORY": "512MB"}, "writer_memory", 512 * 10**6),
    ({"FLOR_WRITER_MEMORY": "2GiB"}, "writer_memory", 2 * 2**30),
])
def test_writer_settings(env, field, expected):
    settings, _ = parse(["train.py", "--flor", "x"], env)
    assert getattr(settings, field) == expected


@pytest.mark.parametrize("args,kept,dropped", [
    (["--lr", "1", "--flor", "x", "--replay_flor", "0/2"], ["--lr", "1"], ["--flor", "x", "--replay_flor", "0/2"]),
    (["--flor_spool=s3://b/p", "--flor_strict", "--seed", "3"], ["--seed", "3"], ["--flor_spool=s3://b/p",
                                                                                 "--flor_strict"]),
    (["--flor_epochs", "0:1", "x.csv"], ["x.csv"], ["--flor_epochs", "0:1"]),
    (["--replay_flor", "data.csv"], ["data.csv"], ["--replay_flor"]),
    (["--", "--flor_spool", "s3://b/p"], ["--", "--flor_spool", "s3://b/p"], []),
])
def test_strip_flor_flags_takes_every_flor_flag_out_of_a_recorded_argv(args, kept, dropped):
    from flor.settings import strip_flor_flags

    assert strip_flor_flags(args) == (kept, dropped)
