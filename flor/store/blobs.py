"""Content-addressed blobs: ``objects/ab/cdef...``, named by the hash of their bytes."""

from __future__ import annotations

from typing import Iterable, Protocol

from ..errors import CorruptBlobError
from .hashing import hash_bytes
from .ids import check_blob_hash, is_blob_hash
from .local import LocalBackend

__all__ = ["BlobStore", "blob_key"]


class RemoteFetcher(Protocol):
    """Makes blobs local on demand (``flor.store.sync.RemoteBlobs`` fetches them from S3)."""

    def ensure(self, digests: Iterable[str]) -> None: ...


def blob_key(digest: str) -> str:
    """``objects/ab/cdef...``; a StorageError when ``digest`` is not a blob hash (a manifest
    read from a shared store may name anything: ``../../../home/me/.bashrc``)."""
    check_blob_hash(digest)
    return f"objects/{digest[:2]}/{digest[2:]}"


class BlobStore:
    """Write each distinct byte string once; verify the hash on every read.

    ``remote``, given at construction and never changed, makes missing (or locally damaged)
    blobs local again: the S3 spool behind a replay.

    >>> import tempfile
    >>> from pathlib import Path
    >>> blobs = BlobStore(LocalBackend(Path(tempfile.mkdtemp())))
    >>> digest, new = blobs.put(b"weights"); blobs.get(digest), new
    (b'weights', True)
    """

    def __init__(self, backend: LocalBackend, remote: RemoteFetcher | None = None) -> None:
        self.backend = backend
        self._remote = remote

    @property
    def remote(self) -> RemoteFetcher | None:
        """Where blobs missing locally come from (the S3 spool in a replay), or None."""
        return self._remote

    def put(self, data: bytes | memoryview, digest: str | None = None) -> tuple[str, bool]:
        """Store ``data``; return its hash and whether it was new (False: deduplicated)."""
        digest = digest or hash_bytes(data)
        key = blob_key(digest)
        if self.backend.exists(key):
            return digest, False
        self.backend.write(key, data)
        return digest, True

    def put_many(self, items: list[tuple[bytes | memoryview, str]]) -> int:
        """Store already-hashed ``(data, digest)`` pairs behind one durability barrier
        (``LocalBackend.write_batch``); return the bytes that were new (the rest deduplicated).
        When it returns, every blob is durable, so a manifest naming them may be written."""
        batch: dict[str, bytes | memoryview] = {}
        for data, digest in items:
            key = blob_key(digest)
            if key not in batch and not self.backend.exists(key):
                batch[key] = data
        self.backend.write_batch(list(batch.items()))
        return sum(memoryview(d).nbytes for d in batch.values())

    def get(self, digest: str) -> bytes:
        key = blob_key(digest)  # checked first: only a valid hash, hence only a file in objects/, may be deleted
        if self._remote is not None and not self.backend.exists(key):
            self._remote.ensure([digest])
        data = self.backend.read(key)
        actual = hash_bytes(data)
        if actual != digest and self._remote is not None:  # damaged here: the spool has a good copy
            self.backend.delete(key)  # refused by the backend if objects/ leads out of the store
            self._remote.ensure([digest])
            data = self.backend.read(blob_key(digest))
            actual = hash_bytes(data)
        if actual != digest:
            raise CorruptBlobError(
                f"blob {digest} is corrupt (its bytes hash to {actual}) at "
                f"{self.backend.path(blob_key(digest))}; that checkpoint cannot be used, "
                "replay will re-execute from an earlier one"
            )
        return data

    def get_many(self, digests: Iterable[str]) -> dict[str, bytes]:
        """``{digest: bytes}``; with a remote, the missing ones are fetched first, in parallel."""
        digests = list(digests)
        if self._remote is not None:
            self._remote.ensure([d for d in digests if not self.exists(d)])
        return {d: self.get(d) for d in digests}

    def exists(self, digest: str) -> bool:
        return self.backend.exists(blob_key(digest))

    def local_digests(self) -> list[str]:
        """Hashes of the blobs under ``objects/``; files of any other name there are left out."""
        out = []
        for key in self.backend.list("objects"):
            parts = key.split("/")
            if len(parts) == 3 and len(parts[1]) == 2 and is_blob_hash(parts[1] + parts[2]):
                out.append(parts[1] + parts[2])
        return out
