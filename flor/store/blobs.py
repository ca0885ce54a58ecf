"""Content-addressed blobs: ``objects/ab/cdef...``, named by the hash of their bytes."""

from __future__ import annotations

from ..errors import CorruptBlobError
from .hashing import hash_bytes
from .local import LocalBackend

__all__ = ["BlobStore", "blob_key"]


def blob_key(digest: str) -> str:
    return f"objects/{digest[:2]}/{digest[2:]}"


class BlobStore:
    """Write each distinct byte string once; verify the hash on every read."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend

    def put(self, data: bytes | memoryview, digest: str | None = None) -> tuple[str, bool]:
        """Store ``data``; return its hash and whether it was new (False: deduplicated)."""
        digest = digest or hash_bytes(data)
        key = blob_key(digest)
        if self.backend.exists(key):
            return digest, False
        self.backend.write(key, data)
        return digest, True

    def get(self, digest: str) -> bytes:
        data = self.backend.read(blob_key(digest))
        actual = hash_bytes(data)
        if actual != digest:
            raise CorruptBlobError(
                f"blob {digest} is corrupt (its bytes hash to {actual}) at "
                f"{self.backend.path(blob_key(digest))}; that checkpoint cannot be used, "
                "replay will re-execute from an earlier one"
            )
        return data

    def exists(self, digest: str) -> bool:
        return self.backend.exists(blob_key(digest))
