"""The replay verdict as one setting: ``--flor_verdict`` and ``FLOR_VERDICT``, with
``--flor_strict``/``--flor_lenient`` (``FLOR_STRICT``/``FLOR_LENIENT``) as its aliases."""

from __future__ import annotations

import pytest

from flor.errors import ConfigError
from flor.settings import VERDICTS, parse

REPLAY = ["t.py", "--flor", "x", "--replay_flor"]


@pytest.mark.parametrize("argv, env, verdict", [
    ([], {}, "default"),
    (["--flor_verdict", "strict"], {}, "strict"),
    (["--flor_verdict=lenient"], {}, "lenient"),
    (["--flor_verdict", "DEFAULT"], {}, "default"),
    (["--flor_strict"], {}, "strict"),
    (["--flor_lenient"], {}, "lenient"),
    (["--flor_strict=0"], {}, "default"),
    (["--flor_verdict", "strict", "--flor_strict"], {}, "strict"),  # the same verdict twice: no conflict
    (["--flor_verdict", "lenient", "--flor_lenient=yes"], {}, "lenient"),
    ([], {"FLOR_VERDICT": "lenient"}, "lenient"),
    ([], {"FLOR_VERDICT": " Strict "}, "strict"),
    ([], {"FLOR_VERDICT": ""}, "default"),  # empty: unset, as every variable
    ([], {"FLOR_STRICT": "1"}, "strict"),
    ([], {"FLOR_LENIENT": "true"}, "lenient"),
    ([], {"FLOR_STRICT": "0", "FLOR_LENIENT": "1"}, "lenient"),
    ([], {"FLOR_VERDICT": "strict", "FLOR_STRICT": "1"}, "strict"),
    # any of the flags wins over all of the variables
    (["--flor_lenient"], {"FLOR_STRICT": "1"}, "lenient"),
    (["--flor_verdict", "default"], {"FLOR_LENIENT": "1"}, "default"),
    (["--flor_strict=no"], {"FLOR_STRICT": "1"}, "default"),
])
def test_one_verdict_from_the_flag_its_aliases_or_the_variables(argv, env, verdict):
    s, rest = parse(REPLAY + argv, env)
    assert (s.verdict, s.strict, s.lenient, rest) == (verdict, verdict == "strict", verdict == "lenient", ["t.py"])


@pytest.mark.parametrize("argv, env, message", [
    (["--flor_strict", "--flor_lenient"], {}, "--flor_strict and --flor_lenient contradict each other"),
    (["--flor_verdict", "lenient", "--flor_strict"], {}, "--flor_verdict lenient and --flor_strict contradict"),
    (["--flor_verdict", "default", "--flor_lenient"], {}, "--flor_verdict default and --flor_lenient contradict"),
    ([], {"FLOR_STRICT": "1", "FLOR_LENIENT": "1"}, "FLOR_STRICT=1 and FLOR_LENIENT=1 contradict"),
    ([], {"FLOR_VERDICT": "lenient", "FLOR_STRICT": "yes"}, "FLOR_VERDICT=lenient and FLOR_STRICT=1 contradict"),
])
def test_two_verdicts_from_one_source_are_an_error(argv, env, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse(REPLAY + argv, env)
    assert "strict, default or lenient" in str(err.value)  # and says how to give one


@pytest.mark.parametrize("argv, env, named", [
    (["--flor_verdict", "harsh"], {}, "--flor_verdict='harsh' is not a verdict: write --flor_verdict strict"),
    (["--flor_verdict="], {}, "--flor_verdict='' is not a verdict"),
    ([], {"FLOR_VERDICT": "on"}, "FLOR_VERDICT='on' is not a verdict: write FLOR_VERDICT=strict"),
    (["--flor_lenient=maybe"], {}, "--flor_lenient/FLOR_LENIENT='maybe' is not a yes/no value"),
    ([], {"FLOR_STRICT": "2"}, "--flor_strict/FLOR_STRICT='2' is not a yes/no value"),
])
def test_a_bad_verdict_names_the_setting_and_the_fix(argv, env, named):
    for mode in (REPLAY, ["t.py", "--flor", "x"], ["t.py"]):  # checked in every mode, as every value
        with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace("?", r"\?")):
            parse(mode + argv, env)


def test_a_recording_notes_the_verdict_flag_it_ignores():
    s, _ = parse(["t.py", "--flor", "x", "--flor_verdict", "strict"], {})
    assert (s.mode, s.verdict) == ("record", "strict")
    assert s.notes == ("--flor_verdict applies to replays only; this recording ignores it",)
    assert VERDICTS == ("strict", "default", "lenient")
