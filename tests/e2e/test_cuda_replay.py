"""Recordings on a GPU replay bit for bit, and a CPU script recorded on a GPU machine replays
exactly. Runs only where a GPU is present (skipped on CPU-only machines such as CI's);
``unit/state/test_cuda.py`` tests the CUDA snapshot path in process.
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers import OUTER_LOG, PROBED_LOG, values


pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


CUDA_EDITS = {
    "torch.nn.Linear(24, 2))": "torch.nn.Linear(24, 2)).cuda()",
    "cross_entropy(net(xb), yb)": "cross_entropy(net(xb.cuda()), yb.cuda())",
    "(net(X).argmax(1) == y)": "(net(X.cuda()).argmax(1).cpu() == y)",
}


def test_a_cuda_recording_replays_bit_for_bit(runner):
    """toy.py on the GPU (dropout draws from the CUDA generator), checkpointed every other
    epoch: outer-loop and probed replay give exactly the edited script's values in full."""
    env = runner.env(FLOR_EVERY="2", CUBLAS_WORKSPACE_CONFIG=":4096:8")
    runner.run(runner.script(edits=CUDA_EDITS), "--epochs", "4", "--flor", "gpu", env=env)
    meta = json.loads(next((runner.home / "gpu" / "runs").glob("*/run.json")).read_text())
    assert meta["timings"]["encoded"] == ["learned", "fast"]
    manifest = next((runner.home / "gpu" / "runs").glob("*/checkpoints/training_loop/2.json")).read_text()
    assert '"device":"cuda:0"' in manifest.replace(" ", "") and '"cuda"' in manifest  # the tensors, the CUDA RNG
    for tag, edits in (("outer", OUTER_LOG), ("probed", PROBED_LOG)):
        script = runner.script(edits={**CUDA_EDITS, **edits}, dest=f"{tag}.py")
        runner.run(script, "--epochs", "4", "--flor", f"full-{tag}", env=env)
        replay = runner.run(script, "--epochs", "4", "--flor", "gpu", "--replay_flor", env=env)
        assert "replay verified exact" in replay.stderr, replay.stderr
        logs = [x for x in runner.logs("gpu") if x["source"] == "replay"]
        newest = [x for x in logs if x["replay"] == max(r["replay"] for r in logs)]
        assert values(newest) == values(runner.logs(f"full-{tag}"), "record")


def test_a_cpu_script_on_a_gpu_machine_replays_exactly(runner):
    """A CPU script recorded on a GPU machine: run.json names the GPUs, and a probed replay,
    which never makes CUDA's context, is exact. On an H200 every block was reported diverged
    ("random state"): the recording had captured a CUDA generator because something in that
    process had initialized CUDA (flor's own run metadata did; ``flor.runinfo.gpus`` no longer
    does, and ``flor.state.diff_rng`` no longer counts a CUDA generator only one side has)."""
    runner.run(runner.script(), "--epochs", "4", "--flor", "cpu")
    run = next((runner.home / "cpu" / "runs").iterdir())
    assert json.loads((run / "run.json").read_text())["versions"]["gpus"]
    probed = runner.script(edits=PROBED_LOG, dest="probed.py")
    replay = runner.run(probed, "--epochs", "4", "--flor", "cpu", "--replay_flor")
    assert "replay verified exact" in replay.stderr and "4 executed and checked (0 diverged)" in replay.stderr
    # the second of two workers starts from a checkpoint: its process has not trained yet
    # (torch's Adam may make CUDA's context at its first step) when it checks the random state
    # the recording had at the start of its first block
    second = runner.run(probed, "--epochs", "4", "--flor", "cpu", "--replay_flor", "1/2",
                        env=runner.env(FLOR_REPLAY_ID="second"))
    assert "replay verified exact" in second.stderr and "(0 diverged)" in second.stderr
    assert "FL324" not in second.stderr
