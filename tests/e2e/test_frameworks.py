"""FlorCallback on real trainers: PyTorch Lightning and the Hugging Face Trainer, on the CPU, with
tiny models built from code or configs (nothing downloaded) and synthetic data.

Each trainer is recorded once; metrics are added to its validation afterwards (``self.log`` in
``validation_step``, a new entry of ``compute_metrics``), which a replay gets by restoring every
epoch, and to its training steps (``self.log`` in ``training_step``, ``flor.log`` in
``compute_loss``), which a replay gets by re-executing them. Every value the replays give is
compared (==) with what the edited script gives when it runs in full without flor, which also
shows the callback is inert without flags (nothing written to the store, nothing said).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import Runner, said, values

LIGHTNING_VALIDATION = {
    "        # VALIDATION": '        self.log("val_acc", (logits.argmax(1) == y).float().mean())',
    "        # EPOCH END": '        self.log("val_wmax", self.net[0].weight.abs().max())'}
#: and one in training_step: its values need the epoch's steps run, so a replay re-executes them (FL339)
LIGHTNING_METRIC = {**LIGHTNING_VALIDATION,
                    "        # TRAINING": '        self.log("wmax", self.net[0].weight.abs().max(), on_step=False, on_epoch=True)'}
#: the same script on the unified package's namespace (``pip install lightning``)
UNIFIED = {"pytorch_lightning": "lightning.pytorch"}
HF_METRIC = {"    # METRICS": '    metrics["max_logit"] = float(logits.max())'}
#: the loss of each training step (compute_loss also runs in evaluation: not a training step's)
HF_TRAINING = {"        # TRAINING": "        if model.training:\n            print('STEP', json.dumps({'epoch': int(self.state.epoch), "
               "'step': self.state.global_step, 'step_loss': flor.log('step_loss', float(loss.detach()), "
               "step=self.state.global_step)}))"}
HF_PROBED = {"FlorCallback()": "FlorCallback(probed=True)"}


def printed(proc: subprocess.CompletedProcess, mark: str = "VALUES") -> list[dict]:
    return [json.loads(line[len(mark) + 1:]) for line in proc.stdout.splitlines() if line.startswith(mark + " ")]


def replayed(r: Runner, name: str, proc: subprocess.CompletedProcess) -> dict[tuple, object]:
    """The values the replay whose summary ``proc`` printed logged (every worker of it)."""
    assert "replay verified exact" in proc.stderr, proc.stderr
    rid = proc.stderr.split("flor: replay ")[1].split()[0]
    return values([x for x in r.logs(name) if x["replay"] == rid])


def inert_full_run(r: Runner, script, env: dict | None = None) -> subprocess.CompletedProcess:
    """The edited script run without flor's flags: the store is untouched and flor says nothing."""
    before = r.tree()
    proc = r.run(script, env=env)
    assert r.tree() == before
    assert "flor" not in proc.stderr.replace("flor.integrations", "")
    return proc


def test_lightning_record_then_hindsight_metric_replayed_whole_and_by_two_workers(tmp_path):
    pytest.importorskip("pytorch_lightning")
    r = Runner(tmp_path)
    r.run(r.script("lightning_fit.py"), "--flor", "lt")
    edited = r.script("lightning_fit.py", LIGHTNING_METRIC, dest="hindsight.py")
    full = {(name, e["epoch"], None): v for e in printed(inert_full_run(r, edited)) for name, v in e["values"].items()}
    ckpts = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("lightning_logs/*/checkpoints/*.ckpt"))
    assert len(ckpts) == 2  # the recording's and the full run's
    assert {k[1] for k in full if k[0] in ("val_acc", "val_wmax")} == {0, 1, 2, 3}  # the new metrics, every epoch
    assert ("train_loss", 3, None) in full  # built from steps a replay skips: restored with the epoch

    # the validation metrics alone, replayed whole by one worker: every epoch restored, the new metrics at each
    r.script("lightning_fit.py", LIGHTNING_VALIDATION, dest="validation.py")
    whole = r.run(tmp_path / "validation.py", "--flor", "lt", "--replay_flor")
    assert "4 blocks restored, 0 executed" in whole.stderr and not said(whole.stderr, "FL309"), whole.stderr
    assert replayed(r, "lt", whole) == {k: v for k, v in full.items() if k[0] != "wmax"}

    # with the metric of training_step too, by the launcher's two workers: each re-executes its epochs' steps
    # (worker 1 from the checkpoint of epoch 1), each executed epoch checked against the recording
    launch = r.flor("replay", "lt", "--workers", "2", "--", sys.executable, "hindsight.py")
    assert "worker 1: epochs 2-3" in launch.stderr, launch.stderr
    assert "0 blocks restored, 4 executed and checked (0 diverged)" in launch.stderr, launch.stderr
    got = replayed(r, "lt", launch)
    assert {k: v for k, v in got.items() if k[2] is None} == full  # wmax too
    assert sorted({k[2] for k in got if k[0] == "train_loss_step"}) == list(range(1, 33))  # every step, re-executed
    # the Trainer's own checkpoint files are a recording's: a replay writes none
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("lightning_logs/*/checkpoints/*.ckpt")) == ckpts


def test_lightning_unified_namespace_record_then_hindsight_metric_replayed_whole(tmp_path):
    """``from lightning.pytorch import ...``: the Trainer of the unified package takes the same callback."""
    pytest.importorskip("lightning")
    r = Runner(tmp_path)
    env = r.env(EPOCHS="2", SAMPLES="128")
    r.run(r.script("lightning_fit.py", UNIFIED), "--flor", "lt", env=env)
    edited = r.script("lightning_fit.py", {**UNIFIED, **LIGHTNING_VALIDATION}, dest="hindsight.py")
    assert "pytorch_lightning" not in edited.read_text()
    full = {(name, e["epoch"], None): v for e in printed(inert_full_run(r, edited, env))
            for name, v in e["values"].items()}
    assert {k[1] for k in full if k[0] in ("val_acc", "val_wmax")} == {0, 1}
    whole = r.run(edited, "--flor", "lt", "--replay_flor", env=env)
    assert "2 blocks restored, 0 executed" in whole.stderr and not said(whole.stderr, "FL309"), whole.stderr
    assert replayed(r, "lt", whole) == full


def test_hugging_face_record_then_hindsight_metrics_replayed_by_two_workers_whole_and_probed(tmp_path):
    pytest.importorskip("transformers")
    r = Runner(tmp_path)
    env = r.env(HF_HUB_OFFLINE="1")
    r.run(r.script("hf_trainer.py"), "--flor", "hf", env=env)
    saved = sorted(p.name for p in (tmp_path / "hf_out").iterdir())
    edited = r.script("hf_trainer.py", {**HF_METRIC, **HF_TRAINING}, dest="hindsight.py")
    before = r.tree()
    proc = r.run(edited, env=env)
    assert r.tree() == before and "flor:" not in proc.stderr  # inert without flags
    timings = ("_runtime", "_per_second")
    full = {(name, round(e["epoch"]) - 1, e["step"]): v for e in printed(proc) for name, v in e.items()
            if name not in ("epoch", "step") and not name.endswith(timings)}
    assert {k[1] for k in full if k[0] == "eval_max_logit"} == {0, 1, 2, 3}
    assert {k[0] for k in full} >= {"loss", "grad_norm", "learning_rate", "eval_loss", "eval_accuracy"}
    evaluation = dict(full)
    full.update({("step_loss", e["epoch"], e["step"]): e["step_loss"] for e in printed(proc, "STEP")})
    assert sorted(k[2] for k in full if k[0] == "step_loss") == list(range(32))  # 8 steps an epoch

    # the compute_metrics entry, by the launcher's two workers: each restores its epochs, and the edit is
    # logging only (no FL309)
    r.script("hf_trainer.py", HF_METRIC, dest="metric.py")
    launch = r.flor("replay", "hf", "--workers", "2", "--", sys.executable, "metric.py", env=env)
    assert "worker 1: epochs 2-3" in launch.stderr, launch.stderr
    assert "4 blocks restored, 0 executed" in launch.stderr and not said(launch.stderr, "FL309"), launch.stderr
    assert replayed(r, "hf", launch) == evaluation  # the training loss and grad norm of restored epochs included
    # and whole, by one worker
    whole = r.run(tmp_path / "metric.py", "--flor", "hf", "--replay_flor", env=env)
    assert "4 blocks restored, 0 executed" in whole.stderr and not said(whole.stderr, "FL309"), whole.stderr
    assert replayed(r, "hf", whole) == evaluation

    # the loss of each training step needs the steps run: a flor.log added in compute_loss makes the replay
    # re-execute them, as probed=True does (FL339), and each executed epoch is checked against the recording
    got = {}
    for pid, script in ((0, edited), (1, r.script("hf_trainer.py", {**HF_METRIC, **HF_TRAINING, **HF_PROBED},
                                                   dest="probed.py"))):
        part = r.run(script, "--flor", "hf", f"--replay_flor={pid}/2", env=env)
        assert "verified exact: 0 blocks restored, 2 executed and checked (0 diverged)" in part.stderr, part.stderr
        assert bool(said(part.stderr, "FL339", "step_loss")) is (pid == 0), part.stderr  # probed=True says nothing
        assert not said(part.stderr, "FL309", "FL338"), part.stderr
        got.update(replayed(r, "hf", part))
    assert got == full
    assert sorted(p.name for p in (tmp_path / "hf_out").iterdir()) == saved  # no checkpoint folder written
