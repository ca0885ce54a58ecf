"""``flor replay --ray``: one Ray task per segment, the same plan, files and merged summary.

Skipped when Ray is not installed (``pip install -e '.[ray]'``): a local Ray takes ~15 s to
start on two cores, so this test lives apart from e2e/test_launch.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import Runner, values
from flor.store.runlogs import read_run_logs

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")

OUTER = {"    # OUTER": '    flor.log("wnorm", float(sum(p.detach().double().norm() for p in net.parameters())))'}


def test_ray_runs_one_task_per_segment(tmp_path):
    r = Runner(tmp_path)
    r.run(r.script(), "--epochs", "4", "--flor", "toy")
    outer = r.script(edits=OUTER, dest="outer.py")
    r.run(outer, "--epochs", "4", "--flor", "full")
    proc = subprocess.run([sys.executable, "-m", "flor", "replay", "toy", "--workers", "2", "--ray", "--",
                           sys.executable, "outer.py", "--epochs", "4"], cwd=r.cwd,
                          env=r.env(RAY_ADDRESS="", RAY_AUTH_MODE="disabled"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "flor: replay verified exact: 4 blocks restored" in proc.stderr
    assert "worker 1: epochs 2-3 (initialization 1)" in proc.stderr
    assert "[w0] epoch 1 acc" in proc.stdout and "[w1] epoch 3 acc" in proc.stdout  # streamed back, prefixed
    run = next((r.home / "toy" / "runs").iterdir())
    logs = [x for x in read_run_logs(run, run.name) if x["source"] == "replay"]
    assert sorted((x["epoch"], x["worker"]) for x in logs if x["name"] == "wnorm") == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert values(logs) == values(r.logs("full"), "record")
