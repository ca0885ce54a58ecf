"""A recording made before flor 0.1.0 (run.json format 1, manifest format 2) is refused with one
line that says so and what to do, by replay and by the commands; never a traceback, never a
replay with fallbacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import Runner

OLD_RUN = "recorded by flor older than 0.1.0 (format 1); record again"


@pytest.fixture
def toy(tmp_path) -> Runner:
    r = Runner(tmp_path)
    r.run(r.script(), "--epochs", "2", "--flor", "toy")
    return r


def _rewrite(path: Path, **fields) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_a_run_of_format_1_is_refused_by_replay_and_named_by_the_commands(toy):
    run_json = next(toy.home.glob("toy/runs/*/run.json"))
    _rewrite(run_json, format=1)
    proc = toy.run(toy.cwd / "toy.py", "--epochs", "2", "--flor", "toy", "--replay_flor", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"flor: error: the latest recording cannot be replayed: run {run_json.parent.name} of toy: " in proc.stderr
    assert OLD_RUN in proc.stderr
    listed = toy.flor("ls", "toy")
    assert f"{run_json.parent.name}  " in listed.stdout and "damaged" in listed.stdout  # listed, not a traceback
    verify = toy.flor("verify", "toy", check=False)
    assert verify.returncode == 1 and OLD_RUN in verify.stdout + verify.stderr


def test_a_manifest_of_format_2_is_named_by_verify(toy):
    manifest = next(toy.home.glob("toy/runs/*/checkpoints/training_loop/1.json"))
    _rewrite(manifest, format=2)
    verify = toy.flor("verify", "toy", check=False)
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert (f"checkpoint manifest {manifest} was recorded by flor older than 0.1.0 (format 2); record again"
            in verify.stdout + verify.stderr)
