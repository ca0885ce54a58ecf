"""flor.store.experiment: an experiment's keys are relative, its manifests listed, its runs
resolved by prefix.
"""

from __future__ import annotations

import pytest

from flor.errors import FlorError
from flor.store import ExperimentStore
from flor.store.runmeta import RunMeta


def test_experiment_paths_are_relative_and_manifests_listed(tmp_path):
    store = ExperimentStore(tmp_path, "exp")
    store.write_json(store.manifest_key("r1", "train", 3, 0), {"a": 1})
    store.write_json(store.manifest_key("r1", "train", 3, 1), {"a": 2})
    store.write_json(store.manifest_key("r1", "prep", None, 0), {"a": 3})
    assert sorted(store.manifests("r1"), key=str) == sorted(
        [("train", 3, 0), ("train", 3, 1), ("prep", None, 0)], key=str)
    assert store.read_json(store.manifest_key("r1", "train", 3, 1)) == {"a": 2}
    with pytest.raises(FlorError, match="3-1.json is damaged"):  # not a manifest: read_manifest validates
        store.read_manifest("r1", "train", 3, 1)
    assert store.manifest_key("r1", "train", 3, 1) == "runs/r1/checkpoints/train/3-1.json"


def test_run_resolution_errors(tmp_path):
    store = ExperimentStore(tmp_path, "exp")
    with pytest.raises(Exception, match="nothing recorded"):
        store.resolve_run(None)
    for run in ("20260101T000000.000001-aaaaaa", "20260102T000000.000001-bbbbbb"):
        store.write_json(store.run_key(run, "run.json"), RunMeta("exp", run).to_json())
    assert store.resolve_run(None) == "20260102T000000.000001-bbbbbb"
    assert store.resolve_run("20260101") == "20260101T000000.000001-aaaaaa"
    with pytest.raises(Exception, match="ambiguous"):
        store.resolve_run("2026")
    with pytest.raises(Exception, match="unknown"):
        store.resolve_run("1999")
