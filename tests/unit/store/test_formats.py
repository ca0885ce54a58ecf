"""run.json format 2 and manifest format 3 (flor 0.1.0): an earlier format is refused with one
named error, not read with fallbacks; a format that is not a number is damage."""

from __future__ import annotations

import pytest

from flor.errors import CheckpointError, StorageError
from flor.store import ExperimentStore
from flor.store.manifest import FORMAT, check_manifest, seal
from flor.store.runmeta import FORMAT as RUN_FORMAT, RunMeta

RUN = "20260101T000000.000000-abcdef"


def test_the_formats_were_bumped_once_for_0_1_0():
    assert (RUN_FORMAT, FORMAT) == (2, 3)
    assert RunMeta("x", RUN).to_json()["format"] == RUN_FORMAT
    assert RunMeta.from_json(RunMeta("x", RUN).to_json()).format == RUN_FORMAT


@pytest.mark.parametrize("fmt, message", [
    (1, r"run\.json: recorded by flor older than 0\.1\.0 \(format 1\); record again: this flor reads run\.json "
        r"format 2 only"),
    (3, r"run\.json: written by a newer flor \(format 3; this flor reads format 2\): upgrade flor"),
    (None, r"run\.json: format is None, not a run\.json format; the file is damaged"),
    ("2", r"format is '2', not a run\.json format; the file is damaged"),
    (True, r"format is True, not a run\.json format; the file is damaged"),
    (2.0, r"format is 2\.0, not a run\.json format"),
    (0, r"format is 0, not a run\.json format"),
    (10**9, r"format is 1000000000, not a run\.json format"),
])
def test_a_run_json_of_another_format_is_refused(fmt, message):
    obj = {**RunMeta("x", RUN).to_json(), "format": fmt}
    if fmt is None:
        del obj["format"]
    with pytest.raises(StorageError, match=message):
        RunMeta.from_json(obj, "run.json")


@pytest.mark.parametrize("field", ["name", "run"])
def test_name_and_run_are_not_filled_in_from_the_path(field):
    obj = RunMeta("x", RUN).to_json()
    del obj[field]
    with pytest.raises(StorageError, match=rf"{field} is NoneType None, expected str; the file is damaged"):
        RunMeta.from_json(obj, "run.json")


def test_the_store_names_the_run_and_how_to_set_it_aside(tmp_path):
    store = ExperimentStore(tmp_path, "x")
    store.write_json(store.run_key(RUN, "run.json"), {**RunMeta("x", RUN).to_json(), "format": 1})
    with pytest.raises(StorageError, match=rf"run {RUN} of x: .*run\.json: recorded by flor older than 0\.1\.0 "
                                           r"\(format 1\); record again: .*; to set the run aside, move "):
        store.read_run(RUN)


def _manifest(**extra) -> dict:
    rng = {"t": "dict", "k": ["python", "numpy", "torch"], "v": [None, None, None]}
    return seal({"block": "train", "epoch": 0, "occurrence": 0, "count": 1, "rng": rng,
                 "objects": {"t": "list", "v": [{"t": "stateful", "cls": "Linear", "v": {"t": "dict", "k": [],
                                                                                        "v": []}, **extra}]}})


@pytest.mark.parametrize("fmt, message", [
    (1, r"m\.json was recorded by flor older than 0\.1\.0 \(format 1\); record again: this flor reads format 3"),
    (2, r"m\.json was recorded by flor older than 0\.1\.0 \(format 2\); record again"),
    (4, r"m\.json was written by a newer flor \(format 4; this flor reads format 3\): upgrade flor"),
    ("3", r"m\.json is damaged \(format: format '3' is not a manifest format\)"),
    (None, r"m\.json is damaged \(format: format None is not a manifest format\)"),
])
def test_a_manifest_of_another_format_is_refused(fmt, message):
    manifest = _manifest(frozen=[], eval=[])
    assert check_manifest(dict(manifest), "m.json") == manifest
    manifest["format"] = fmt
    with pytest.raises(CheckpointError, match=message):
        check_manifest(manifest, "m.json")


@pytest.mark.parametrize("extra", [{"frozen": []}, {"eval": [""]}])
def test_a_module_node_has_both_its_frozen_and_eval_lists(extra):
    with pytest.raises(CheckpointError, match="frozen parameters and its modules in eval mode are not both given"):
        check_manifest(_manifest(**extra), "m.json")
    check_manifest(_manifest(), "m.json")  # a node of another stateful object: neither


@pytest.mark.parametrize("field,value", [("started", 1e308), ("ended", float("inf")), ("started", -5.0),
                                         ("epochs_done", 10**15), ("process_started", float("nan")),
                                         ("world_size", 10**9), ("pid", 2**40)])
def test_a_number_of_run_json_past_its_bound_is_a_damaged_file(field, value):
    obj = {"name": "x", "run": "r", "format": RUN_FORMAT, field: value}
    with pytest.raises(StorageError, match=f"{field} is .*out of range"):
        RunMeta.from_json(obj, "runs/r/run.json")


def test_epoch_durations_must_be_finite_seconds():
    obj = {"name": "x", "run": "r", "format": RUN_FORMAT, "timings": {"epoch_s": [1.0, 1e308 * 10]}}
    with pytest.raises(StorageError, match="timings.epoch_s"):
        RunMeta.from_json(obj, "runs/r/run.json")
    assert RunMeta.from_json({**obj, "timings": {"epoch_s": [1.0, 2]}}, "w").timings["epoch_s"] == [1.0, 2]


def test_a_metadata_file_too_many_or_too_deep_in_json_nodes_is_refused_with_one_line(tmp_path):
    store = ExperimentStore(tmp_path, "x")
    path = store.root / "runs" / "r1" / "run.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"[" + b"{}," * 2_000_001 + b"{}]")
    with pytest.raises(StorageError, match="JSON objects and lists, more than flor reads"):
        store.read_json("runs/r1/run.json")
    path.write_bytes(b"[" * 300 + b"]" * 300)
    with pytest.raises(StorageError, match="deeper than 256 levels"):
        store.read_json("runs/r1/run.json")
    path.write_bytes(b"[" * 200 + b"]" * 200)
    assert store.read_json("runs/r1/run.json") == eval("[" * 200 + "]" * 200)
