"""flor.export.mlflow against a real MLflow tracking store (SQLite): the recorded run gets flor's
values, nothing twice; a run without one gets a run tagged with the flor experiment and run."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow  # the mlflow extra, in [test]: never skipped
import pytest

from helpers import fake_run, note_trackers
from flor.errors import ConfigError
from flor.export import export, export_run
from flor.store import ExperimentStore


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def recorded(tmp_path: Path, uri: str, run_id: str | None) -> ExperimentStore:
    store = fake_run(tmp_path, [{"name": "acc", "value": 0.5, "epoch": 0}, {"name": "acc", "value": 0.6, "epoch": 1}],
                     [{"name": "wnorm", "value": 3.5, "epoch": 0}, {"name": "wnorm", "value": 3.25, "epoch": 1}])
    if run_id is not None:  # as the recording noted it, signed with the user's key
        note_trackers(store, {"mlflow": {"run_id": run_id, "tracking_uri": uri}}, tmp_path / "config")
    return store


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_the_recorded_run_gets_hindsight_values_once(tmp_path: Path, uri: str) -> None:
    client = mlflow.tracking.MlflowClient(uri)
    exp = client.create_experiment("recorded-run")
    run_id = client.create_run(exp).info.run_id
    client.log_metric(run_id, "acc", 0.5, step=0)  # what the script logged itself
    store = recorded(tmp_path, uri, run_id)
    mine = {"config_dir": tmp_path / "config"}
    dry = export_run(store, "r1", "mlflow", dry_run=True, **mine)
    assert [(p.key, p.step) for p in dry.written] == [("acc", 1), ("wnorm", 0), ("wnorm", 1)] and dry.present == 1
    assert history(client, run_id, "wnorm") == []  # a dry run writes nothing
    first = export_run(store, "r1", "mlflow", **mine)
    second = export_run(store, "r1", "mlflow", **mine)
    assert (len(first.written), first.present, len(second.written), second.present) == (3, 1, 0, 4)
    assert history(client, run_id, "acc") == [(0, 0.5), (1, 0.6)]
    assert history(client, run_id, "wnorm") == [(0, 3.5), (1, 3.25)]
    assert client.get_run(run_id).data.tags["flor.run"] == "r1"
    assert len(client.search_runs([exp])) == 1


def test_without_a_recorded_run_one_tagged_run_is_made_and_found_again(tmp_path: Path, uri: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the tracker's own variable names the store
    recorded(tmp_path, uri, None)
    results = export("ex", "mlflow", home=tmp_path) + export("ex", "mlflow", home=tmp_path)
    client = mlflow.tracking.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("ex").experiment_id])
    assert len(runs) == 1 and runs[0].data.tags["flor.experiment"] == "ex"
    assert [r.created for r in results] == [True, False] and len(results[1].written) == 0
    assert history(client, runs[0].info.run_id, "wnorm") == [(0, 3.5), (1, 3.25)]


def test_a_recorded_run_missing_from_the_store_is_a_clear_error(tmp_path: Path, uri: str) -> None:
    store = recorded(tmp_path, uri, "0" * 32)
    with pytest.raises(ConfigError, match="--tracking-uri"):
        export_run(store, "r1", "mlflow", config_dir=tmp_path / "config")


def test_a_planted_tracking_uri_receives_nothing(tmp_path: Path, uri: str) -> None:
    """A run.json changed in a shared store to send the run's values to another tracking server
    (here: another store) is refused unless the user names the store or trusts it after looking."""
    attacker = f"sqlite:///{tmp_path / 'attacker.db'}"
    client = mlflow.tracking.MlflowClient(attacker)
    run_id = client.create_run(client.create_experiment("theirs")).info.run_id
    store = recorded(tmp_path, uri, None)
    note_trackers(store, {"mlflow": {"run_id": run_id, "tracking_uri": attacker}})  # planted: unsigned
    for dry_run in (True, False):
        with pytest.raises(ConfigError, match="not signed.*--trust.*--tracking-uri"):
            export_run(store, "r1", "mlflow", dry_run=dry_run, config_dir=tmp_path / "config")
    assert history(client, run_id, "wnorm") == []
    other = tmp_path / "other-config"  # signed, but with a key the user does not trust
    note_trackers(store, {"mlflow": {"run_id": run_id, "tracking_uri": attacker}}, other)
    with pytest.raises(ConfigError, match="key you do not trust"):
        export_run(store, "r1", "mlflow", config_dir=tmp_path / "config")
    assert history(client, run_id, "wnorm") == []
    assert len(export_run(store, "r1", "mlflow", trust=True, config_dir=tmp_path / "config").written) == 4  # trusted


def test_an_unknown_tracker_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mlflow, tensorboard, wandb"):
        export("ex", "neptune", home=tmp_path)
