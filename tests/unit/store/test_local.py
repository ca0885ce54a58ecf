"""flor.store.local: atomic writes and their temp files, disk set aside, large buffers written
around the page cache, and no key or link that leads out of the store.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from flor.errors import StorageError
from flor.state.pending import _aligned_empty
from flor.store import BlobStore, LocalBackend, hash_bytes
from flor.store.local import DIRECT_MIN, PAGE, _write_direct, tmp_name


def test_writes_are_atomic_and_leftovers_ignored(tmp_path):
    backend = LocalBackend(tmp_path)
    backend.write("runs/r/a.json", b"{}")
    (tmp_path / "runs/r/.tmp-deadbeef").write_bytes(b"half a fi")  # what a crash mid-write leaves
    assert backend.list("runs") == ["runs/r/a.json"]
    backend.write("runs/r/a.json", b'{"x": 1}')
    assert backend.read("runs/r/a.json") == b'{"x": 1}'


def test_disk_is_set_aside_in_a_temp_file_or_not_at_all(tmp_path):
    from flor.store.local import TMP_PREFIX, LocalBackend

    backend = LocalBackend(tmp_path)
    (tmp_path / "runs" / "r").mkdir(parents=True)
    reserved = backend.reserve("runs/r/run.json", (1 << 62, 1 << 16))  # more than any disk: the next size
    assert reserved.parent == tmp_path / "runs" / "r" and reserved.name.startswith(TMP_PREFIX)
    assert reserved.stat().st_size == 1 << 16 and reserved.stat().st_blocks * 512 >= 1 << 16  # allocated
    reserved.unlink()
    assert backend.reserve("runs/r/run.json", (1 << 62,)) is None
    assert list((tmp_path / "runs" / "r").iterdir()) == []  # nothing left behind
    assert backend.reserve("../outside/run.json", (1 << 10,)) is None  # a key that leaves the store


def _o_direct_works(folder: Path) -> bool:
    """Whether this filesystem takes O_DIRECT (tmpfs on older kernels does not)."""
    try:
        os.close(os.open(folder / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
        return True
    except OSError:
        return False


def test_large_snapshot_buffers_are_written_around_the_page_cache(tmp_path):
    buf = _aligned_empty(DIRECT_MIN * 2 + 123)  # the tail is not a whole page: written buffered
    assert buf.data_ptr() % PAGE == 0
    buf.copy_(torch.randint(0, 256, (buf.numel(),), dtype=torch.uint8))
    data = memoryview(buf.numpy())
    fd = os.open(tmp_path / "blob", os.O_WRONLY | os.O_CREAT)
    try:
        direct = _write_direct(fd, data)
    finally:
        os.close(fd)
    assert direct == _o_direct_works(tmp_path)
    assert (tmp_path / "blob").read_bytes() == bytes(data)
    # what cannot go around the page cache is left to the buffered write, untouched
    unaligned = memoryview(buf[1:].numpy())
    for cannot in (unaligned, bytes(data), data[:DIRECT_MIN - 1]):
        fd = os.open(tmp_path / "other", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            assert not _write_direct(fd, cannot)
        finally:
            os.close(fd)
        assert (tmp_path / "other").stat().st_size == 0
    # the store's batched write takes that path and reads back verified
    store = BlobStore(LocalBackend(tmp_path / "store"))
    digest = hash_bytes(data)
    assert store.put_many([(data, digest), (bytes(7), hash_bytes(bytes(7)))]) == len(data) + 7
    assert store.get(digest) == bytes(data)


def test_temp_names_are_unique_per_process_and_write():
    a, b = tmp_name(), tmp_name()
    assert a != b and f"-{os.getpid()}-" in a and a.startswith(".tmp-")


def test_write_failure_removes_its_temp_file(tmp_path: Path, monkeypatch):
    backend = LocalBackend(tmp_path)

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(StorageError, match="No space left"):
        backend.write("runs/r/run.json", b"{}")
    assert list((tmp_path / "runs" / "r").iterdir()) == []


#: the attacks this file tries, each listed as its test reaches it (nothing reports them: a
#: name for each, to read here or in a debugger)
ATTACKS: list[str] = []


def files_outside(root: Path, *skip: Path) -> dict[str, bytes]:
    """Every file under ``root`` but not under any of ``skip`` (the stores), with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and not any(s in p.parents for s in skip)}


# -- the local backend and the blob store: nothing outside the store -------------------------------

BAD_KEYS = ["../outside.txt", "objects/../../outside.txt", "/tmp/outside.txt", "objects\\..\\..\\outside.txt",
            "objects/a\0b", "objects//ab"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_backend_refuses_keys_that_leave_the_store(tmp_path: Path, key: str) -> None:
    ATTACKS.append(f"backend key {key!r}")
    root = tmp_path / "store"
    backend = LocalBackend(root)
    before = files_outside(tmp_path, root)
    for op in (lambda: backend.write(key, b"evil"), lambda: backend.read(key), lambda: backend.delete(key),
               lambda: backend.exists(key)):
        with pytest.raises(StorageError, match="refusing the store key"):
            op()
    assert files_outside(tmp_path, root) == before


def test_backend_never_follows_a_link_out_of_the_store(tmp_path: Path) -> None:
    ATTACKS.append("symlink objects/ab -> outside, write/read/delete through it")
    root, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"precious")
    (root / "objects").mkdir(parents=True)
    (root / "objects" / "ab").symlink_to(outside, target_is_directory=True)
    backend = LocalBackend(root)
    with pytest.raises(StorageError, match="leads out of the store"):
        backend.write("objects/ab/new", b"evil")
    with pytest.raises(StorageError, match="leads out of the store"):
        backend.delete("objects/ab/victim")
    with pytest.raises(StorageError, match="leads out of the store"):
        backend.read("objects/ab/victim")
    with pytest.raises(StorageError, match="leads out of the store"):
        backend.write("objects/ab/sub/new", b"evil")  # mkdir would have followed the link
    with pytest.raises(StorageError, match="leads out of the store"):
        backend.write_batch([("objects/ab/new", b"evil")])
    # a folder swapped for a link after flor wrote into it: checked on every write, not once
    backend.write_batch([("objects/12/first", b"ok")])
    backend.write("objects/12/second", b"ok")
    shutil.rmtree(root / "objects" / "12")
    (root / "objects" / "12").symlink_to(outside, target_is_directory=True)
    for write in (lambda: backend.write("objects/12/third", b"evil"),
                  lambda: backend.write_batch([("objects/12/third", b"evil")])):
        with pytest.raises(StorageError, match="leads out of the store"):
            write()
    # a link that stays inside the store is followed
    (root / "elsewhere").mkdir()
    (root / "objects" / "34").symlink_to(root / "elsewhere", target_is_directory=True)
    backend.write("objects/34/fine", b"ok")
    backend.write_batch([("objects/34/also", b"ok")])
    assert sorted(p.name for p in (root / "elsewhere").iterdir()) == ["also", "fine"]
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_bytes() == b"precious"
    assert backend.list("objects") == []  # what lies behind the link is not listed as the store's
    # a link as the blob file itself: replaced or unlinked, its target never touched
    (root / "objects" / "cd").mkdir()
    (root / "objects" / "cd" / "ef").symlink_to(outside / "victim")
    backend.delete("objects/cd/ef")
    assert (outside / "victim").read_bytes() == b"precious" and not (root / "objects" / "cd" / "ef").exists()
