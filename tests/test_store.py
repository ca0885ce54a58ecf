"""The store: round trip, deduplication, corruption detected, atomic writes."""

from __future__ import annotations

import pytest

from flor.errors import CorruptBlobError, FlorError, StorageError
from flor.store import BlobStore, ExperimentStore, LocalBackend, blob_key, hash_bytes
from flor.store.runmeta import RunMeta


def test_roundtrip_and_dedup(tmp_path):
    blobs = BlobStore(LocalBackend(tmp_path))
    h1, new1 = blobs.put(b"weights" * 1000)
    h2, new2 = blobs.put(b"weights" * 1000)
    h3, new3 = blobs.put(b"other")
    assert (new1, new2, new3) == (True, False, True)
    assert h1 == h2 == hash_bytes(b"weights" * 1000) and h3 != h1
    assert blobs.get(h1) == b"weights" * 1000
    assert len([p for p in (tmp_path / "objects").rglob("*") if p.is_file()]) == 2


def test_corruption_is_detected(tmp_path):
    blobs = BlobStore(LocalBackend(tmp_path))
    digest, _ = blobs.put(b"\x00" * 64)
    path = tmp_path / blob_key(digest)
    path.write_bytes(b"\x00" * 63 + b"\x01")
    with pytest.raises(CorruptBlobError, match=digest):
        blobs.get(digest)
    path.unlink()
    with pytest.raises(StorageError, match="missing"):
        blobs.get(digest)


def test_writes_are_atomic_and_leftovers_ignored(tmp_path):
    backend = LocalBackend(tmp_path)
    backend.write("runs/r/a.json", b"{}")
    (tmp_path / "runs/r/.tmp-deadbeef").write_bytes(b"half a fi")  # what a crash mid-write leaves
    assert backend.list("runs") == ["runs/r/a.json"]
    backend.write("runs/r/a.json", b'{"x": 1}')
    assert backend.read("runs/r/a.json") == b'{"x": 1}'


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


def test_disk_is_set_aside_in_a_temp_file_or_not_at_all(tmp_path):
    from flor.store.local import LocalBackend, TMP_PREFIX

    backend = LocalBackend(tmp_path)
    (tmp_path / "runs" / "r").mkdir(parents=True)
    reserved = backend.reserve("runs/r/run.json", (1 << 62, 1 << 16))  # more than any disk: the next size
    assert reserved.parent == tmp_path / "runs" / "r" and reserved.name.startswith(TMP_PREFIX)
    assert reserved.stat().st_size == 1 << 16 and reserved.stat().st_blocks * 512 >= 1 << 16  # allocated
    reserved.unlink()
    assert backend.reserve("runs/r/run.json", (1 << 62,)) is None
    assert list((tmp_path / "runs" / "r").iterdir()) == []  # nothing left behind
    assert backend.reserve("../outside/run.json", (1 << 10,)) is None  # a key that leaves the store
