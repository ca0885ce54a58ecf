"""``flor replay --verdict``: what each worker is given (``FLOR_VERDICT``), and a verdict given
twice refused before anything is launched. A recorded run.json is all a launch needs here."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from flor.errors import ConfigError
from flor.launch.launcher import Launch, check_verdict_once
from flor.store import ExperimentStore
from flor.store.runmeta import RunMeta

RUN = "20260101T000000.000000-abcdef"


@pytest.fixture
def store(tmp_path: Path) -> ExperimentStore:
    store = ExperimentStore(tmp_path / "home", "toy")
    meta = RunMeta("toy", RUN, status="finished", epochs_planned=4, epochs_done=4, argv=["t.py"])
    store.write_json(store.run_key(RUN, "run.json"), meta.to_json())
    return store


def _flor_env(store: ExperimentStore, verdict: str | None) -> dict[str, str]:
    launch = Launch(store, RUN, [sys.executable, "t.py"], workers=2, gpus=[], epoch_range=None, strong=False,
                    threads=None, fresh=True, out=io.StringIO(), err=io.StringIO(), verdict=verdict)
    envs = [launch.env(w) for w in range(2)]
    assert envs[0]["FLOR_REPLAY"] == "0/2" and envs[1]["FLOR_REPLAY"] == "1/2"
    return {k: v for k, v in envs[1].items() if k in ("FLOR_VERDICT", "FLOR_STRICT", "FLOR_LENIENT")}


@pytest.mark.parametrize("exported, verdict, given", [
    ({}, None, {}),
    ({"FLOR_STRICT": "1"}, None, {"FLOR_STRICT": "1"}),  # without --verdict: the user's variables, as they are
    ({"FLOR_VERDICT": "lenient", "FLOR_LENIENT": "1"}, None, {"FLOR_VERDICT": "lenient", "FLOR_LENIENT": "1"}),
    ({}, "lenient", {"FLOR_VERDICT": "lenient"}),
    ({"FLOR_STRICT": "1", "FLOR_VERDICT": "strict"}, "lenient", {"FLOR_VERDICT": "lenient"}),  # --verdict wins
    ({"FLOR_LENIENT": "1"}, "default", {"FLOR_VERDICT": "default"}),
])
def test_every_worker_gets_the_verdict(store, monkeypatch, exported, verdict, given):
    for k in ("FLOR_VERDICT", "FLOR_STRICT", "FLOR_LENIENT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in exported.items():
        monkeypatch.setenv(k, v)
    assert _flor_env(store, verdict) == given


@pytest.mark.parametrize("command", [["python", "t.py", "--flor_lenient"], ["python", "t.py", "--flor_strict=1"],
                                     ["python", "t.py", "--flor_verdict", "strict"]])
def test_a_verdict_in_the_command_and_in_verdict_is_refused(command):
    check_verdict_once(command, None)  # the command's own flag alone: each worker reads it
    with pytest.raises(ConfigError, match=r"--verdict lenient and --flor_\w+ in the command both set the replay's "
                                          r"verdict: give it once, as --verdict"):
        check_verdict_once(command, "lenient")
