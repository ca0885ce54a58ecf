"""The verdict end to end: ``--flor_verdict`` in a worker and ``flor replay --verdict`` decide how
a replay that diverged ends, as ``--flor_lenient``/``--flor_strict`` do."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import Runner

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
