"""Content-addressed blobs: ``objects/ab/cdef...``, named by the hash of their bytes."""

from __future__ import annotations

from typing import Iterable, Protocol

from ..errors import CorruptBlobError
from .hashing import hash_bytes
from .local import LocalBackend

__all__ = ["BlobStore", "blob_key"]


class RemoteFetcher(Protocol):
    """Makes blobs local on demand (``flor.store.remote.RemoteBlobs`` fetches them from S3)."""

    def ensure(self, digests: Iterable[str]) -> None: ...


def blob_key(digest: str) -> str:
    return f"objects/{digest[:2]}/{digest[2:]}"


class BlobStore:
    """Write each distinct byte string once; verify the hash on every read."""

    def __init__(self, backend: LocalBackend, remote: RemoteFetcher | None = None) -> None:
        self.backend = backend
        #: where blobs missing locally come from (the S3 spool in a replay), or None
        self.remote = remote

    def put(self, data: bytes | memoryview, digest: str | None = None) -> tuple[str, bool]:
        """Store ``data``; return its hash and whether it was new (False: deduplicated)."""
        digest = digest or hash_bytes(data)
        key = blob_key(digest)
        if self.backend.exists(key):
            return digest, False
        self.backend.write(key, data)
        return digest, True

    def get(self, digest: str) -> bytes:
        if self.remote is not None and not self.backend.exists(blob_key(digest)):
            self.remote.ensure([digest])
        data = self.backend.read(blob_key(digest))
        actual = hash_bytes(data)
        if actual != digest and self.remote is not None:  # damaged here: the spool has a good copy
            self.backend.delete(blob_key(digest))
            self.remote.ensure([digest])
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
        if self.remote is not None:
            self.remote.ensure([d for d in digests if not self.exists(d)])
        return {d: self.get(d) for d in digests}

    def exists(self, digest: str) -> bool:
        return self.backend.exists(blob_key(digest))
