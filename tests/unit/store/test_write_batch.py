"""A checkpoint's blobs are written behind ONE durability barrier (``LocalBackend.write_batch``,
``BlobStore.put_many``; real files, syscalls counted). ``e2e/test_durable_order.py`` checks the
order of a real recording's syscalls.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flor.errors import StorageError
from flor.store.blobs import BlobStore
from flor.store.hashing import hash_bytes
from flor.store.local import LocalBackend


def _count_syncs(monkeypatch) -> dict[str, list[str]]:
    calls: dict[str, list[str]] = {"file": [], "dir": []}
    real_fsync, real_datasync = os.fsync, getattr(os, "fdatasync", os.fsync)

    def where(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def fsync(fd: int) -> None:
        calls["dir" if os.path.isdir(where(fd)) else "file"].append(where(fd))
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        calls["file"].append(where(fd))
        real_datasync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync, raising=False)
    return calls


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name the synced files")
def test_one_barrier_per_batch_one_fsync_per_folder(tmp_path: Path, monkeypatch):
    import torch

    blobs = BlobStore(LocalBackend(tmp_path))
    tensors = [torch.arange(1000 * (i + 1), dtype=torch.float32) for i in range(12)]
    views = [memoryview(t.view(torch.uint8).numpy()) for t in tensors]  # straight from the buffers
    items = [(v, hash_bytes(v)) for v in views] + [(views[0], hash_bytes(views[0]))]  # one duplicate
    calls = _count_syncs(monkeypatch)
    new = blobs.put_many(items)
    assert new == sum(v.nbytes for v in views)
    folders = {digest[:2] for _, digest in items}
    assert len(calls["file"]) == 12  # each new blob synced once, the duplicate not written
    assert sorted(Path(d).name for d in calls["dir"]) == sorted(folders)  # one fsync per folder, not per blob
    for view, digest in items:
        assert blobs.get(digest) == view.tobytes()
    assert not list(tmp_path.rglob(".tmp-*"))
    calls["file"].clear()
    assert blobs.put_many(items) == 0 and calls["file"] == []  # all deduplicated: nothing written


def test_failed_barrier_leaves_no_files(tmp_path: Path, monkeypatch):
    blobs = BlobStore(LocalBackend(tmp_path))
    items = [(bytes([i]) * 5000, "") for i in range(5)]
    items = [(d, hash_bytes(d)) for d, _ in items]

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", no_space, raising=False)
    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(StorageError, match="No space left"):
        blobs.put_many(items)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # no blob, no temp file
    monkeypatch.undo()
    assert blobs.put_many(items) == 5 * 5000  # and the next try writes them all
    assert all(blobs.exists(d) for _, d in items)
