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


def test_growing_dumps_gives_dumps_text_and_encodes_only_what_was_added(monkeypatch) -> None:
    """run.json rewritten as a loop of short epochs grows it: the same bytes as ``dumps`` after
    every kind of change its growing containers see, encoding only the items added since."""
    import random

    import flor.store.experiment as experiment
    from flor.store.experiment import GrowingDumps, dumps

    encoded: list[int] = []
    real = experiment._text
    monkeypatch.setattr(experiment, "_text", lambda obj: (encoded.append(len(obj)), real(obj))[1])
    rng = random.Random(7)
    epochs: list[float] = []
    blocks: dict[str, list] = {}
    replay: list[int] = []
    doc = {"name": "x", "timings": {"epoch_s": epochs, "blocks": {"train": []}}, "epoch_blocks": blocks,
           "checkpoint_policy": {"replay_epochs": replay, "skipped_epochs": []}, "status": "running",
           "odd": [float("nan"), float("inf"), "\u00e9\"\\", None, {"k": [1, 2]}]}
    g = GrowingDumps()
    for epoch in range(3000):
        epochs.append(rng.random())
        doc["timings"]["blocks"]["train"].append(round(rng.random(), 6))
        blocks[str(epoch)] = [["train", 0]]
        replay.append(epoch)
        if rng.random() < 0.3:
            replay.pop()  # the policy's refused(): a list's end taken back
        if epoch % 97 == 0:
            doc["status"] = f"epoch {epoch}"
        if epoch == 2000:
            doc["checkpoint_policy"]["skipped_epochs"] = list(range(600))  # another list object: all of it
        if epoch % 50 == 0 or epoch > 2990:
            encoded.clear()
            assert g(doc) == dumps(doc), epoch
            if 1000 < epoch != 2000 and epoch % 50 == 0:  # all long by 1000 (encoded whole once then)
                assert max(encoded) < 200  # the long ones: only what came since the last write
    replay[100] = -1  # a change in the middle of a list is seen too (the items are compared)
    assert g(doc) == dumps(doc)
    assert GrowingDumps()([1, 2]) == dumps([1, 2])
