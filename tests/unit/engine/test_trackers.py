"""flor.engine.trackers: what a recording notes of the script's trackers, and how a replay quiets
them (real MLflow with a SQLite store, torch's SummaryWriter, W&B disabled; each patch undone after)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import mlflow
import pytest
import wandb
from torch.utils.tensorboard import SummaryWriter

from flor.engine import trackers
from flor.engine.trackers import MLFLOW_QUIET, TrackerHook, quiet_trackers, seen


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite tracking store for the module (creating its tables takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def undo(monkeypatch: pytest.MonkeyPatch):
    """Every attribute a quieting may replace, put back after the test."""
    import mlflow.tracking.fluent as fluent

    for module in (mlflow, fluent):
        for name in (*MLFLOW_QUIET, "active_run"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(wandb, "init", wandb.init)
    monkeypatch.setattr(SummaryWriter, "__init__", SummaryWriter.__init__)
    monkeypatch.setenv("WANDB_MODE", "offline")
    before = list(sys.meta_path)
    yield
    sys.meta_path[:] = before


def test_seen_notes_the_active_mlflow_run_and_the_writers_logdir(tmp_path: Path, uri: str) -> None:
    mlflow.set_tracking_uri(uri)
    try:
        writer = SummaryWriter(str(tmp_path / "tb"))
        frame = sys._getframe()
        assert "mlflow" not in seen(frame)  # no active run: nothing to note
        with mlflow.start_run() as run:
            found = seen(frame)
        writer.close()
    finally:
        mlflow.set_tracking_uri(None)
    assert found["mlflow"]["run_id"] == run.info.run_id
    assert found["mlflow"]["tracking_uri"] == uri
    assert found["tensorboard"] == {"logdirs": [str(tmp_path / "tb")]}
    assert "wandb" not in found


def test_a_replay_quiets_mlflow_wandb_and_the_writer(tmp_path: Path, uri: str, undo: None) -> None:
    mlflow.set_tracking_uri(uri)
    client = mlflow.tracking.MlflowClient(uri)
    runs = len(client.search_runs(["0"]))
    try:
        quiet_trackers(lambda: tmp_path / "replay-tb", lambda: "recorded-id")
        with mlflow.start_run() as run:
            mlflow.log_metric("acc", 0.5, step=0)
            assert run.info.run_id == "recorded-id" and mlflow.active_run() is None
        mlflow.set_experiment("made-in-replay")
        assert len(client.search_runs(["0"])) == runs and client.get_experiment_by_name("made-in-replay") is None
    finally:
        mlflow.set_tracking_uri(None)
    assert wandb.init(project="p").settings.mode == "disabled" and os.environ["WANDB_MODE"] == "disabled"
    writer = SummaryWriter(str(tmp_path / "script-logdir"))
    writer.add_scalar("acc", 0.5, 0)
    writer.close()
    assert not (tmp_path / "script-logdir").exists() and list((tmp_path / "replay-tb").glob("events.*"))


def test_a_tracker_imported_later_is_quieted_by_the_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "latetracker.py").write_text("def log(x):\n    return 'logged'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    hook = TrackerHook({"latetracker": lambda m: setattr(m, "log", lambda x: None)})
    sys.meta_path.insert(0, hook)
    try:
        import latetracker  # type: ignore[import-not-found]

        assert latetracker.log(1) is None
    finally:
        sys.meta_path.remove(hook)
        sys.modules.pop("latetracker", None)


def test_a_failed_quieting_is_said_and_the_import_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "oddtracker.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def broken(module: object) -> None:
        raise RuntimeError("no such attribute")

    hook = TrackerHook({"oddtracker": broken})
    sys.meta_path.insert(0, hook)
    try:
        import oddtracker  # type: ignore[import-not-found]

        assert oddtracker.VALUE == 1
    finally:
        sys.meta_path.remove(hook)
        sys.modules.pop("oddtracker", None)
    assert "FL360" in capsys.readouterr().err


def test_relative_stores_are_made_absolute() -> None:
    assert trackers.absolute_uri("mlruns", "/w") == "/w/mlruns"
    assert trackers.absolute_uri("file:mlruns", "/w") == "file:///w/mlruns"
