"""The verdict end to end: ``--flor_verdict`` in a worker and ``flor replay --verdict`` decide how
a replay that diverged ends, as ``--flor_lenient``/``--flor_strict`` do."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import Runner, base_env

from flor.store import ExperimentStore
from flor.store.runmeta import RunMeta

RUN = "20260101T000000.000000-abcdef"


@pytest.fixture
def store(tmp_path):
    store = ExperimentStore(tmp_path / "home", "toy")
    meta = RunMeta("toy", RUN, status="finished", epochs_planned=4, epochs_done=4, argv=["t.py"])
    store.write_json(store.run_key(RUN, "run.json"), meta.to_json())
    return store

# an optimizer stepped inside the block but not passed to end(): a worker that starts mid-run diverges
LEAKY = {"net, optimizer, scheduler, step = flor.SkipBlock.end(net, optimizer, scheduler, step)":
         "net, scheduler, step = flor.SkipBlock.end(net, scheduler, step)"}
PROBED = {**LEAKY, 'step_into("training_loop")': 'step_into("training_loop", probed=True)'}


@pytest.fixture(scope="module")
def leaky(tmp_path_factory) -> Runner:
    r = Runner(tmp_path_factory.mktemp("verdict"))
    r.run(r.script(edits=LEAKY, dest="leaky.py"), "--epochs", "4", "--flor", "leaky")
    r.script(edits=PROBED, dest="probed.py")
    return r


def _last(proc: subprocess.CompletedProcess) -> str:
    return proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("flags, env, status", [
    (["--flor_verdict", "lenient"], {}, 0),
    (["--flor_verdict=default"], {"FLOR_LENIENT": "1"}, 3),  # the flag wins over the variable
])
def test_a_workers_verdict(leaky, flags, env, status):
    proc = leaky.run(leaky.cwd / "probed.py", "--epochs", "4", "--flor", "leaky", "--replay_flor", "1/2", *flags,
                     env=leaky.env(**env), check=False)
    assert proc.returncode == status, proc.stderr
    assert _last(proc).startswith("flor: replay DIVERGED")
    assert _last(proc).endswith("exit status 0 (--flor_lenient)" if status == 0 else
                                "exit status 3 (--flor_lenient keeps 0)"), proc.stderr


@pytest.mark.parametrize("verdict, env, status", [("lenient", {}, 0), ("default", {"FLOR_LENIENT": "1"}, 3)])
def test_flor_replay_gives_every_worker_its_verdict(leaky, verdict, env, status):
    proc = subprocess.run([sys.executable, "-m", "flor", "replay", "leaky", "--workers", "1", "--epochs", "2:4",
                           "--verdict", verdict, "--fresh", "--", sys.executable, "probed.py", "--epochs", "4"],
                          cwd=leaky.cwd, env=leaky.env(**env), capture_output=True, text=True, timeout=300)
    assert proc.returncode == status, proc.stderr
    assert "DIVERGED at epoch 2, block 'training_loop'" in proc.stderr
    assert _last(proc).endswith("exit status 0 (--flor_lenient)" if status == 0 else
                                "exit status 3 (--flor_lenient keeps 0)"), proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--verdict", "lenient", "--", sys.executable, "t.py", "--flor_strict"],
     "flor: error: --verdict lenient and --flor_strict in the command both set the replay's verdict"),
    (["--all", "--verdict", "strict", "--", sys.executable, "t.py", "--flor_lenient"],
     "flor: error: --verdict strict and --flor_lenient in the command both set the replay's verdict"),
    (["--verdict", "harsh", "--", sys.executable, "t.py"], "argument --verdict: invalid choice: 'harsh'"),
])
def test_flor_replay_refuses_a_bad_verdict_with_status_2(store, tmp_path, args, message):
    (tmp_path / "t.py").write_text("raise SystemExit('never started')\n")
    env = {**base_env(), "FLOR_HOME": str(store.root.parent)}
    proc = subprocess.run([sys.executable, "-m", "flor", "replay", "toy", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (store.root / "runs" / RUN / "logs").exists()  # nothing launched
