"""flor.store.blobs: content-addressed blobs: round trip, deduplication, corruption detected,
and a hash that is not one never names a path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flor.errors import CorruptBlobError, StorageError
from flor.store import BlobStore, LocalBackend, blob_key, hash_bytes


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


#: the attacks this file tries, each listed as its test reaches it (nothing reports them: a
#: name for each, to read here or in a debugger)
ATTACKS: list[str] = []


class SpyRemote:
    """The remote of a BlobStore that records what it was asked for (fetches nothing)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def ensure(self, digests) -> None:
        self.asked.extend(digests)


def test_a_path_like_blob_hash_deletes_nothing(tmp_path: Path) -> None:
    ATTACKS.append("BlobStore.get with a path-like hash, with a remote (the corrupt-blob delete path)")
    root = tmp_path / "home" / "toy"
    canary = tmp_path / "canary.txt"
    canary.write_text("still here")
    remote = SpyRemote()
    blobs = BlobStore(LocalBackend(root), remote=remote)
    evil = "../../../canary.txt"  # objects/../../../canary.txt from home/toy
    with pytest.raises(StorageError, match="invalid blob hash"):
        blobs.get(evil)
    with pytest.raises(StorageError, match="invalid blob hash"):
        blobs.get_many([evil])
    assert canary.read_text() == "still here" and remote.asked == []


def test_a_corrupt_blob_is_replaced_only_inside_objects(tmp_path: Path) -> None:
    root = tmp_path / "home" / "toy"
    backend = LocalBackend(root)
    digest, _ = BlobStore(backend).put(b"weights")
    path = root / "objects" / digest[:2] / digest[2:]
    path.write_bytes(b"damaged")

    class Refetch(SpyRemote):
        def ensure(self, digests) -> None:
            super().ensure(digests)
            for d in digests:
                if not backend.exists(f"objects/{d[:2]}/{d[2:]}"):
                    backend.write(f"objects/{d[:2]}/{d[2:]}", b"weights")

    remote = Refetch()
    assert BlobStore(backend, remote=remote).get(digest) == b"weights" and remote.asked == [digest]
