"""A checkpoint's blobs are written behind ONE durability barrier, and its manifest only after.

Unit tests of ``LocalBackend.write_batch`` / ``BlobStore.put_many`` (real files, syscalls
counted), and a real recording whose fsync, fdatasync and rename calls are logged in order:
every manifest is renamed into place only after each blob it names was synced to disk, renamed
and its folder fsynced.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flor.errors import StorageError
from flor.store.blobs import BlobStore, blob_key
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


TRACE = '''
import os, runpy, sys
LOG = open(os.environ["TRACE_LOG"], "a", buffering=1)
real = {n: getattr(os, n) for n in ("fsync", "fdatasync", "replace")}

def synced(name):
    def sync(fd):
        real[name](fd)
        LOG.write(f"sync {os.readlink(f'/proc/self/fd/{fd}')}\\n")
    return sync

def replace(src, dst, **kw):
    real["replace"](src, dst, **kw)
    LOG.write(f"rename {os.path.abspath(dst)}\\n")

os.fsync, os.fdatasync, os.replace = synced("fsync"), synced("fdatasync"), replace
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name the synced files")
def test_manifest_only_after_its_blobs_are_durable(runner, tmp_path: Path):
    script = runner.script()
    wrapper = tmp_path / "trace.py"
    wrapper.write_text(TRACE)
    log = tmp_path / "trace.log"
    runner.run(wrapper, str(script), "--epochs", "3", "--flor", "batched", env=runner.env(TRACE_LOG=str(log)))
    events = [line.split(" ", 1) for line in log.read_text().splitlines()]
    manifests = [i for i, (op, p) in enumerate(events) if op == "rename" and "/checkpoints/" in p]
    assert len(manifests) == 3
    for i in manifests:
        manifest = json.loads(Path(events[i][1]).read_text())
        digests = set()

        def walk(node):
            if isinstance(node, dict):
                if isinstance(node.get("h"), str):
                    digests.add(node["h"])
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk({k: manifest[k] for k in ("objects", "rng", "rng_start")})
        assert digests
        before = events[:i]
        for digest in digests:
            dest = str(runner.home / "batched" / blob_key(digest))
            renamed = [j for j, (op, p) in enumerate(before) if op == "rename" and p.endswith(blob_key(digest))]
            if not renamed:
                continue  # deduplicated: written (and made durable) by an earlier checkpoint
            j = renamed[-1]
            folder = os.path.dirname(events[j][1])
            assert any(op == "sync" and p == folder for op, p in before[j:]), f"{dest}: folder not synced before the manifest"
        assert any(op == "rename" and "/objects/" in p for op, p in before)
